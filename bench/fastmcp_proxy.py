"""FastMCP's proxy in front of the demo notes server, served over stdio: the comparison path of bench/latency.py.

Run as `python bench/fastmcp_proxy.py` (the demo server's notes file comes from $BASTION_NOTES_FILE).
Built the way FastMCP documents it: `create_proxy` over a stdio transport, whose backend process is
kept alive across requests (FastMCP's default), logging at WARNING like the demo server.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def main() -> None:
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
    proxy.run("stdio", show_banner=False, log_level="WARNING")


if __name__ == "__main__":
    main()
