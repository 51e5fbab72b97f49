"""Downstream MCP servers as sources (`McpConnector`): one per connector file, over stdio or streamable HTTP,
relaying their tools, resources, prompts and what they ask or log while a call runs."""

from bastion.sources.mcp.connector import McpConnector

__all__ = ["McpConnector"]
