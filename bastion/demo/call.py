"""A tiny MCP client that calls one tool through Bastion and prints what comes back: the walkthrough's agent.

Run it as `python -m bastion.demo.call URL TOOL [NAME=VALUE ...]`, e.g.
`python -m bastion.demo.call http://127.0.0.1:8765/mcp notes__write_note name=hello text="Hi"`. A `NAME=VALUE`
argument is a string; `NAME:=JSON` gives any JSON value. `$BASTION_AGENT_TOKEN`, when set, is sent as the bearer
token. While a call waits for an approver, Bastion's heartbeats are printed on stderr as they come; the result's
text is printed on stdout. The exit status is 0 for a result, 1 for an error result (its class first), 2 for a
command line that cannot be used or a Bastion that does not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

TOKEN_ENV = "BASTION_AGENT_TOKEN"
WAIT_SECONDS = 600.0
"""How long the client waits for its answer: longer than an approval may take (`[approvals] expiry_seconds`)."""


def arguments(pairs: list[str]) -> dict[str, Any]:
    """`NAME=VALUE` (a string) and `NAME:=JSON` pairs as the call's arguments; ValueError names a bad one."""
    found: dict[str, Any] = {}
    for pair in pairs:
        name, json_sep, value = pair.partition(":=")
        if json_sep and "=" not in name:
            try:
                found[name] = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{pair!r}: not JSON after ':=' ({exc.msg})") from exc
            continue
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"{pair!r} is not NAME=VALUE or NAME:=JSON")
        found[name] = value
    return found


async def call(url: str, tool: str, args: dict[str, Any], token: str | None) -> int:
    async def heard(progress: float, total: float | None, message: str | None) -> None:
        if message:
            print(f"bastion: {message}", file=sys.stderr, flush=True)

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=WAIT_SECONDS) as http,
        Client(streamable_http_client(url, http_client=http), read_timeout_seconds=WAIT_SECONDS) as client,
    ):
        result = await client.call_tool(tool, args, progress_callback=heard)
    text = "\n".join(block.text for block in result.content if block.type == "text")
    print(text, flush=True)
    return 1 if result.is_error else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bastion.demo.call", description=__doc__.splitlines()[0])
    parser.add_argument("url", help="Bastion's MCP endpoint, e.g. http://127.0.0.1:8765/mcp")
    parser.add_argument("tool", help="the tool's name as Bastion lists it, e.g. notes__write_note")
    parser.add_argument("pairs", nargs="*", metavar="NAME=VALUE", help="an argument (NAME:=JSON for a JSON value)")
    options = parser.parse_args(argv)
    try:
        args = arguments(options.pairs)
    except ValueError as exc:
        parser.error(str(exc))
    unreachable: list[BaseException] = []
    try:
        return anyio.run(call, options.url, options.tool, args, os.environ.get(TOKEN_ENV) or None)
    except* httpx2.HTTPError as group:
        unreachable += group.exceptions
    print(
        f"error: {options.url} did not answer ({unreachable[0]}); is `bastion serve --transport http` running there?",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
