"""Bastion's stdio transport: line framing over real pipes, and the claim on fds 0 and 1 in a real process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import subprocess
import sys
import tracemalloc
import tty
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from bastion.server.stdio import MAX_MESSAGE_BYTES, LineFn, _Readable, pipe_streams


def request(number: int, **params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": number, "method": "ping", "params": params}).encode()


@pytest.fixture
def pipes() -> Iterator[tuple[int, int, int, int]]:
    """(host writes, Bastion reads, Bastion writes, host reads), Bastion's ends non-blocking."""
    bastion_in, host_out = os.pipe()
    host_in, bastion_out = os.pipe()
    os.set_blocking(bastion_in, False)
    os.set_blocking(bastion_out, False)
    yield host_out, bastion_in, bastion_out, host_in
    for fd in (bastion_in, host_out, host_in, bastion_out):
        with contextlib.suppress(OSError):
            os.close(fd)


@pytest.mark.anyio
async def test_lines_split_and_joined_across_reads_arrive_whole_and_in_order(pipes: tuple[int, int, int, int]) -> None:
    host_out, bastion_in, bastion_out, _ = pipes
    wire = request(1) + b"\n\n" + request(2, big="x" * 200_000) + b"\nnot json\n" + request(3)  # no final newline
    received: list[SessionMessage | Exception] = []
    with anyio.fail_after(10):
        async with pipe_streams(bastion_in, bastion_out) as (read_stream, _), anyio.create_task_group() as group:

            async def host() -> None:
                os.set_blocking(host_out, False)
                for start in range(0, len(wire), 7_000):  # chunks cut lines anywhere
                    view = memoryview(wire)[start : start + 7_000]
                    while view:
                        await anyio.wait_writable(host_out)
                        with contextlib.suppress(BlockingIOError):
                            view = view[os.write(host_out, view) :]
                os.close(host_out)

            group.start_soon(host)
            async for item in read_stream:
                received.append(item)
    assert len(received) == 4
    first, second, bad, third = received
    assert isinstance(first, SessionMessage) and isinstance(first.message, types.JSONRPCRequest)
    assert isinstance(second, SessionMessage) and isinstance(second.message, types.JSONRPCRequest)
    assert isinstance(third, SessionMessage) and isinstance(third.message, types.JSONRPCRequest)
    assert [first.message.id, second.message.id, third.message.id] == [1, 2, 3]
    assert second.message.params == {"big": "x" * 200_000}
    assert isinstance(bad, ValidationError)


@pytest.mark.anyio
async def test_stdin_stays_watched_between_reads_but_not_while_input_waits_unread_nor_after_the_end(
    pipes: tuple[int, int, int, int],
) -> None:
    """The loop watches the host's pipe from one wait to the next, stops when input arrives while no read waits (it
    would call back on every turn until the input is read), watches again at the next wait, and not after."""
    host_out, bastion_in, _, _ = pipes
    loop = asyncio.get_running_loop()
    with anyio.fail_after(10):
        with _Readable(bastion_in) as readable:
            os.write(host_out, b"a")
            await readable.wait()
            assert loop.remove_reader(bastion_in)  # still watched after the wait ended
            loop.add_reader(bastion_in, readable._readable)  # (as it was)
            for _ in range(3):  # turns of the loop while the input stays unread and nobody waits
                await anyio.lowlevel.checkpoint()
            assert not loop.remove_reader(bastion_in)
            await readable.wait()  # watched again: the unread input ends the wait at once
            assert os.read(bastion_in, 10) == b"a"
        assert not loop.remove_reader(bastion_in)


@pytest.mark.anyio
async def test_messages_larger_than_the_pipe_are_written_whole_one_per_line(pipes: tuple[int, int, int, int]) -> None:
    _, bastion_in, bastion_out, host_in = pipes
    big = "y" * 1_000_000
    out = bytearray()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(_host_reads, host_in, out, 2)
            async with pipe_streams(bastion_in, bastion_out) as (_, write_stream):
                for text in (big, "small"):
                    note = types.JSONRPCNotification(
                        jsonrpc="2.0", method="notifications/message", params={"data": text}
                    )
                    await write_stream.send(SessionMessage(note))
    lines = bytes(out).split(b"\n")
    assert lines[2:] == [b""]
    assert [json.loads(line)["params"]["data"] for line in lines[:2]] == [big, "small"]


async def _host_reads(fd: int, out: bytearray, lines: int) -> None:
    """The host's end of Bastion's stdout: read it into `out` until `lines` lines have come."""
    os.set_blocking(fd, False)
    while out.count(b"\n") < lines:
        await anyio.wait_readable(fd)
        out.extend(os.read(fd, 1 << 16))


class _Writer:
    """A shortcut that takes no line and hands its `write` to the test."""

    def __init__(self) -> None:
        self.ready = anyio.Event()
        self.write: LineFn | None = None

    def take(self, line: bytes) -> bool:
        return False

    async def run(self, write: LineFn, pass_on: LineFn) -> None:
        self.write = write
        self.ready.set()
        await anyio.sleep_forever()


@pytest.mark.anyio
async def test_a_shortcuts_lines_and_the_servers_reach_the_host_whole_and_in_order_past_a_full_pipe(
    pipes: tuple[int, int, int, int],
) -> None:
    """A shortcut's line goes out at once when the writer is idle; what a full pipe does not take is the writer's,
    so nothing sent after it (by the shortcut or the server) overtakes it or cuts into it."""
    _, bastion_in, bastion_out, host_in = pipes
    shortcut = _Writer()
    big = b'{"n":"' + b"z" * 1_000_000 + b'"}'
    out = bytearray()
    with anyio.fail_after(10):
        async with (
            anyio.create_task_group() as group,
            pipe_streams(bastion_in, bastion_out, shortcut) as (_, write_stream),
        ):
            await shortcut.ready.wait()
            assert shortcut.write is not None
            await shortcut.write(big + b"\n")  # far beyond the pipe: most of it left to the writer
            group.start_soon(_host_reads, host_in, out, 4)
            note = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"data": 1})
            await write_stream.send(SessionMessage(note))
            await shortcut.write(b'{"n":"small"}\n')
            await shortcut.write(b'{"n":"last"}\n')
    lines = bytes(out).split(b"\n")
    assert lines[4:] == [b""]
    assert [json.loads(line).get("n", "server") for line in lines[:4]] == ["z" * 1_000_000, "server", "small", "last"]


async def exchange(pipes: tuple[int, int, int, int], wire: bytes) -> tuple[list[SessionMessage | Exception], list[Any]]:
    """Write `wire` into Bastion's stdin in chunks, then close it; what reached the server, and what was answered."""
    host_out, bastion_in, bastion_out, host_in = pipes
    received: list[SessionMessage | Exception] = []
    answered = bytearray()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:

            async def host_reads() -> None:
                os.set_blocking(host_in, False)
                while True:
                    await anyio.wait_readable(host_in)
                    chunk = os.read(host_in, 1 << 16)
                    if not chunk:
                        return
                    answered.extend(chunk)

            group.start_soon(host_reads)
            async with pipe_streams(bastion_in, bastion_out) as (read_stream, _):

                async def host_writes() -> None:
                    os.set_blocking(host_out, False)
                    view = memoryview(wire)
                    while view:
                        await anyio.wait_writable(host_out)
                        with contextlib.suppress(BlockingIOError):
                            view = view[os.write(host_out, view[: 1 << 16]) :]
                    os.close(host_out)

                group.start_soon(host_writes)
                async for item in read_stream:
                    received.append(item)
            os.close(bastion_out)
    return received, [json.loads(line) for line in bytes(answered).splitlines()]


def request_ids(received: list[SessionMessage | Exception]) -> list[Any]:
    return [item.message.id for item in received if isinstance(item, SessionMessage) and hasattr(item.message, "id")]


def framed(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


@pytest.mark.anyio
async def test_a_line_over_the_http_body_limit_is_refused_by_id_and_the_session_goes_on(
    pipes: tuple[int, int, int, int],
) -> None:
    big = "z" * (MAX_MESSAGE_BYTES + 1)
    wire = (
        framed({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "t", "arguments": {"a": big}}})
        + framed({"jsonrpc": "2.0", "method": "tools/call", "params": {"arguments": {"id": 1, "a": big}}, "id": "q"})
        + framed({"jsonrpc": "2.0", "method": "ping", "params": {"a": big}, "id": 9, "more": True})
        + request(8)
        + b"\n"
    )
    received, answered = await exchange(pipes, wire)
    assert request_ids(received) == [8]
    assert len(received) == 1
    assert [(a["id"], a["error"]["code"]) for a in answered] == [
        (7, types.INVALID_REQUEST),
        ("q", types.INVALID_REQUEST),
        (None, types.PARSE_ERROR),
    ]


@pytest.mark.anyio
async def test_a_huge_line_is_discarded_as_it_arrives_never_held_whole(pipes: tuple[int, int, int, int]) -> None:
    wire = request(1, big="w" * (5 * MAX_MESSAGE_BYTES)) + b"\n" + request(2)
    tracemalloc.start()
    try:
        received, answered = await exchange(pipes, wire)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * MAX_MESSAGE_BYTES, peak
    assert [a["id"] for a in answered] == [1]
    assert request_ids(received) == [2]


ECHO = """
import os, sys
import anyio
from bastion.server.stdio import stdio_streams

async def main() -> None:
    async with stdio_streams() as (read_stream, write_stream):
        print("stray print", flush=True)
        os.write(1, b"stray write to fd 1\\n")
        async for item in read_stream:
            await write_stream.send(item)
    print("fds restored", flush=True)

anyio.run(main)
"""


@pytest.mark.parametrize("stdin_kind", ["pipe", "file"])
def test_serving_claims_stdout_so_stray_output_goes_to_stderr_and_restores_it(stdin_kind: str, tmp_path: Path) -> None:
    messages = request(1) + b"\n" + request(2) + b"\n"
    command = [sys.executable, "-c", ECHO]
    if stdin_kind == "pipe":
        done = subprocess.run(command, input=messages, capture_output=True, timeout=60, check=True)
    else:
        (tmp_path / "in.jsonl").write_bytes(messages)
        with (tmp_path / "in.jsonl").open("rb") as stdin:
            done = subprocess.run(command, stdin=stdin, capture_output=True, timeout=60, check=True)
    lines = done.stdout.decode().splitlines()
    assert [json.loads(line)["id"] for line in lines[:2]] == [1, 2]
    assert lines[2:] == ["fds restored"]
    assert "stray print" in done.stderr.decode()
    assert "stray write to fd 1" in done.stderr.decode()


def test_a_terminal_keeps_its_flags_even_when_bastion_is_killed() -> None:
    """A terminal's file description is the shell's too: serving on it must not make it non-blocking, or a
    killed Bastion would leave the shell's terminal broken."""
    master, terminal = os.openpty()
    tty.setraw(terminal)
    child = subprocess.Popen([sys.executable, "-c", ECHO], stdin=terminal, stdout=terminal, stderr=subprocess.PIPE)
    try:
        os.write(master, request(7) + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            readable, _, _ = select.select([master], [], [], 60)
            assert readable, "no reply within 60 s"
            reply += os.read(master, 65536)
        assert json.loads(reply)["id"] == 7
        assert os.get_blocking(terminal)
    finally:
        child.kill()
        child.wait(timeout=60)
        assert child.stderr is not None
        child.stderr.close()
    assert os.get_blocking(terminal)
    os.close(master)
    os.close(terminal)
