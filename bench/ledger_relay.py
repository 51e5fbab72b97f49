"""The floor of a relay that records each call in Bastion's ledger: the zero-work relay plus Bastion's ledger writes.

Run as `python bench/ledger_relay.py LEDGER` (the demo server's notes file comes from $BASTION_NOTES_FILE). Like
bench/pipe_relay.py it starts the demo server and passes every line on unchanged, but each `tools/call` is first
recorded in the SQLite ledger file LEDGER through Bastion's own ledger code (`SqliteBackend`, as `bastion serve`
opens it: the same schema, statements, transactions and change feed): admitted against the rate limit and
inserted `executing` with its first three events, durably, before the line goes on; once the downstream answers,
the answer goes to the host and the outcome is recorded `completed`. Nothing else: no catalog, policy, redaction,
argument or result check, no MCP model. bench/latency.py measures it beside Bastion, so what recording a call costs
by itself is told apart from what the rest of Bastion's path costs, and checks that its ledger holds one completed
invocation per call, as it does Bastion's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import anyio
import orjson

from bastion.cli.compose import UVLOOP
from bastion.jsontext import compact
from bastion.ledger.backend import EMPTY_DETAIL, Scrubbed
from bastion.ledger.sqlite import SqliteBackend
from bastion.models import Admission, Invocation
from bastion.pipeline.catalog import new_invocation_id
from bastion.pipeline.outcomes import STARTED_EVENTS

_CHUNK: Final = 1 << 16
_SESSION: Final = "ledger-relay"
_PER_MINUTE: Final = 100_000_000  # as bench/configs.py sets Bastion's limit: counted, never reached


def _compact(value: Any) -> Scrubbed:
    """JSON text as the ledger stores it (bastion.jsontext.compact, what Bastion's redactor writes)."""
    return Scrubbed(compact(value))


def _lines(fd: int) -> tuple[asyncio.Queue[bytes | None], Callable[[], None]]:
    """A queue of the lines read from `fd` (None at its end), and the reader callback that fills it."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    pending = bytearray()

    def readable() -> None:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            asyncio.get_running_loop().remove_reader(fd)
            queue.put_nowait(None)
            return
        pending.extend(chunk)
        *lines, rest = pending.split(b"\n")
        pending[:] = rest
        for line in lines:
            queue.put_nowait(bytes(line))

    return queue, readable


def _write(fd: int, line: bytes) -> None:
    out = memoryview(line + b"\n")
    while out:
        out = out[os.write(fd, out) :]


async def relay(ledger: Path, to_server: int, from_server: int, close_server_input: Callable[[], None]) -> None:
    backend = await SqliteBackend.open(ledger)
    calls: dict[Any, str] = {}  # the host's request id -> the invocation recorded for it
    loop = asyncio.get_running_loop()
    from_host, read_host = _lines(0)
    from_downstream, read_downstream = _lines(from_server)
    loop.add_reader(0, read_host)
    loop.add_reader(from_server, read_downstream)

    async def host_to_server() -> None:
        while (line := await from_host.get()) is not None:
            message = orjson.loads(line)
            params = message.get("params") or {}
            if message.get("method") == "tools/call" and "id" in message:
                now = datetime.now(UTC)
                invocation = Invocation(
                    id=new_invocation_id(),
                    status="executing",
                    policy_key=f"notes:{params['name']}",
                    tool=params["name"],
                    source_id="notes",
                    action_id=params["name"],
                    risk="read",
                    mode="allow",
                    mode_source="inferred",
                    session_id=_SESSION,
                    args=_compact(params.get("arguments")),
                    created_at=now,
                    updated_at=now,
                )
                admission = Admission(_SESSION, _PER_MINUTE, now)
                await backend.invocations.insert_admitted(invocation, STARTED_EVENTS, EMPTY_DETAIL, admission=admission)
                calls[message["id"]] = invocation.id
            _write(to_server, line)
        close_server_input()  # the host is done: so is the server, once it has answered what it was sent

    async def server_to_host() -> None:
        while (line := await from_downstream.get()) is not None:
            _write(1, line)
            message = orjson.loads(line)
            invocation_id = calls.pop(message.get("id"), None) if "method" not in message else None
            if invocation_id is not None:
                result = message.get("result")
                await backend.invocations.finish(
                    invocation_id,
                    "completed" if result is not None else "failed",
                    result=None if result is None else _compact(result),
                    error_class=None,
                    error_message=None,
                )

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(backend.changes.run)  # checkpoints the WAL, as it does in `bastion serve`
            tg.start_soon(host_to_server)
            await server_to_host()  # to the server's end, each answer's outcome recorded
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await backend.close()


def main() -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "bastion.demo.notes"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        anyio.run(
            relay,
            Path(sys.argv[1]),
            server.stdin.fileno(),
            server.stdout.fileno(),
            server.stdin.close,
            backend_options={"use_uvloop": UVLOOP},
        )
    finally:
        server.stdin.close()
        server.wait()


if __name__ == "__main__":
    main()
