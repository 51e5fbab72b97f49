"""The host server: MCP over stdio, streamable HTTP and legacy SSE (the only layer that imports mcp.server)."""
