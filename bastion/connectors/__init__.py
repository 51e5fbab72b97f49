"""Sources of actions: downstream MCP connectors (and, later, providers and manifest actions).

Each source satisfies the pipeline's `ActionSource` protocol (and a downstream MCP connector its
`ContentSource` protocol) structurally; nothing here imports the pipeline, the policies or the ledger.
"""

from bastion.connectors.mcp import McpConnector

__all__ = ["McpConnector"]
