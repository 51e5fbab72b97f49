"""A downstream MCP server for end-to-end tests: `wait` blocks until the process is killed; `hold` reports
progress, then blocks until a line is written to the FIFO it names.

Run as `python -m tests.slow_server`; stdio only.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("slow", version="1.0.0", log_level="WARNING")


@server.tool(
    description="Block until this server is stopped (stands in for a long-running side effect).",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
)
async def wait() -> str:
    await anyio.Event().wait()
    return "never"


@server.tool(
    description="Report progress once, then block until a line is written to the FIFO `release`; return it.",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
)
async def hold(release: str, ctx: Context) -> str:
    await ctx.report_progress(1, 2, "holding")
    # Opening a FIFO blocks until a writer opens it: in a worker thread, which a killed process leaves behind.
    line = await anyio.to_thread.run_sync(Path(release).read_text, abandon_on_cancel=True)
    return f"released: {line.strip()}"


if __name__ == "__main__":
    server.run("stdio")
