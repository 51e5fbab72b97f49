"""The front door: MCP over stdio, streamable HTTP and legacy SSE (the only layer that imports mcp.server)."""
