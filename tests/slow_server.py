"""A downstream MCP server for end-to-end tests: `wait` blocks until the process is killed.

Run as `python -m tests.slow_server`; stdio only.
"""

from __future__ import annotations

import anyio
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("slow", version="1.0.0", log_level="WARNING")


@server.tool(
    description="Block until this server is stopped (stands in for a long-running side effect).",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
)
async def wait() -> str:
    await anyio.Event().wait()
    return "never"


if __name__ == "__main__":
    server.run("stdio")
