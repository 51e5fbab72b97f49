"""A downstream MCP server that will not go: it ignores SIGTERM, outlives the end of its stdin, and starts
a grandchild that ignores SIGTERM too. Only SIGKILL (to its process group) ends them.

Run as `python -m tests.stubborn_server`; it writes "<its pid> <grandchild pid>" to `$STUBBORN_PIDS`
before it serves one tool, `ping`, over stdio.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

# Waits for a signal that never comes (SIGTERM is ignored; only SIGKILL ends it).
GRANDCHILD = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nsignal.pause()\n"

server = MCPServer("stubborn", version="1.0.0", log_level="WARNING")


@server.tool(description="Answer pong.")
async def ping() -> str:
    return "pong"


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = subprocess.Popen([sys.executable, "-c", GRANDCHILD])
    Path(os.environ["STUBBORN_PIDS"]).write_text(f"{os.getpid()} {grandchild.pid}")
    server.run("stdio")
    while True:  # stdin ended: stay anyway
        signal.pause()
