"""FastMCP's proxy in front of the demo notes server: the comparison path of bench/latency.py (stdio) and
bench/throughput.py (streamable HTTP).

Run as `python bench/fastmcp_proxy.py [--transport stdio|http] [--port N]` (the demo server's notes file comes
from $BASTION_NOTES_FILE). Built the way FastMCP documents it: `create_proxy` over a stdio transport, whose
backend process is kept alive across requests (FastMCP's default), logging at WARNING like the demo server.
Over HTTP it serves streamable HTTP at `/mcp` on 127.0.0.1 with FastMCP's own `run("http")` (uvicorn).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

HOST = "127.0.0.1"


def main(transport: str, port: int) -> None:
    # fastmcp is installed only in the bench environment (.venv-bench); `make lint` type-checks this
    # file where it is absent, so it is imported by name.
    transports: Any = importlib.import_module("fastmcp.client.transports")
    server: Any = importlib.import_module("fastmcp.server")
    backend = transports.StdioTransport(
        command=sys.executable,
        args=["-m", "bastion.demo.notes"],
        env={"BASTION_NOTES_FILE": os.environ["BASTION_NOTES_FILE"]},
    )
    proxy = server.create_proxy(backend, name="fastmcp-proxy")
    if transport == "http":
        proxy.run("http", show_banner=False, log_level="WARNING", host=HOST, port=port, path="/mcp")
    else:
        proxy.run("stdio", show_banner=False, log_level="WARNING")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=8768, help="port to bind on 127.0.0.1 in http mode")
    args = parser.parse_args()
    main(args.transport, args.port)
