"""Bastion: a policy-gated, audited MCP gateway for the side effects of AI agents."""

__version__ = "0.1.0"
