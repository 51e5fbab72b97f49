"""A naive relay in front of the demo notes server, on the mcp SDK's low-level server: the relay floor.

Run as `python bench/naive_relay.py [--transport stdio|http] [--port N]` (the demo server's notes file
comes from $BASTION_NOTES_FILE). It is the least an SDK-based relay can do: one `mcp.Client` over
stdio to the demo server, opened once and shared by every session, its tools listed once at start
and served unchanged, each `tools/call` passed to the client's `call_tool` and its result returned
as it is. No policy, no ledger, no validation of its own. It serves stdio (default) or streamable
HTTP at `/mcp` on 127.0.0.1 (`--transport http`, via the SDK's `Server.streamable_http_app`).
bench/latency.py (stdio) and bench/throughput.py (HTTP) measure it beside Bastion, so what Bastion
adds is told apart from what any relay on this SDK pays.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp import Client, StdioServerParameters
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

HOST = "127.0.0.1"


async def main(transport: str, port: int) -> None:
    downstream = StdioServerParameters(
        command=sys.executable,
        args=["-m", "bastion.demo.notes"],
        env={"BASTION_NOTES_FILE": os.environ["BASTION_NOTES_FILE"]},
    )
    async with Client(downstream, cache=None) as client:
        tools = (await client.list_tools()).tools

        async def list_tools(
            ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            return types.ListToolsResult(tools=tools)

        async def call_tool(
            ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
        ) -> types.CallToolResult:
            return await client.call_tool(params.name, params.arguments)

        server: Server[Any] = Server("naive-relay", on_list_tools=list_tools, on_call_tool=call_tool)
        if transport == "http":
            app = server.streamable_http_app(streamable_http_path="/mcp", host=HOST)
            await uvicorn.Server(uvicorn.Config(app, host=HOST, port=port, log_level="warning")).serve()
            return
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=8767, help="port to bind on 127.0.0.1 in http mode")
    args = parser.parse_args()
    anyio.run(main, args.transport, args.port)
