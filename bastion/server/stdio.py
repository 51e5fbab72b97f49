"""The stdio transport: MCP messages as lines on this process's stdin and stdout, waited for in the event loop.

The SDK's `stdio_server` reads and writes through `anyio.wrap_file`: a worker-thread hand-off for every
line read, written and flushed, three per tool call, each a GIL hand-over on the call's critical path.
Here the host's pipes are made non-blocking and the loop waits for them: for stdin with one registration kept
from one line to the next (`_Readable`), for stdout with `anyio.wait_writable` when the pipe is full. A terminal
keeps its flags (its file description is the shell's too, and a Bastion that is killed could not restore them):
the loop waits until it is readable, then reads. A regular file never blocks.
Framing and parsing are the SDK's: one JSON-RPC message per line, parsed by `jsonrpc_message_adapter`,
undecodable bytes replaced, a line that does not parse handed to the server as the exception.

A line longer than the SDK's HTTP request-body limit (4 MiB, `MAX_MESSAGE_BYTES`) is refused as HTTP
refuses such a body: it is discarded as it arrives (only its first and last few KiB are kept, to find its
id), the host gets a JSON-RPC error for that request (`-32600`, or `-32700` with id null when the id
cannot be found), and the session goes on with the next line.

Like the SDK's transport, it takes the wire away from fds 0 and 1 while it serves: fd 0 then reads the
null device and fd 1 writes to stderr, so a stray print (ours, a library's, a child's) cannot corrupt the
protocol. Both are restored on exit.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import os
import re
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from typing import Final, Protocol, cast

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR
from pydantic import ValidationError

logger = logging.getLogger(__name__)

_READ_SIZE: Final = 1 << 16

MAX_MESSAGE_BYTES: Final = DEFAULT_MAX_REQUEST_BODY_SIZE
"""The longest line accepted: the SDK's limit on a streamable-HTTP or SSE request body, so both transports agree."""

_KEPT_EDGE: Final = 1 << 14
"""How much of each end of an over-long line is kept to find its id."""

_TRAILING_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")\s*}\s*$')
"""An id that is the last member of the top-level object: the line's final brace closes the object it is in."""

Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
"""What `Server.run` reads messages (or parse errors) from, and writes messages to."""


LineFn = Callable[[bytes], Awaitable[None]]
"""Sends one line: to the host (a JSON-RPC message and its newline), or on to the SDK's server."""


class Shortcut(Protocol):
    """What may answer some of the host's lines itself, before the SDK's server sees them (the express lane)."""

    def take(self, line: bytes) -> bool:
        """Whether it takes this line (the SDK's server then never sees it)."""
        ...

    async def run(self, write: LineFn, pass_on: LineFn) -> None:
        """Answer what it took until cancelled: `write` sends to the host, `pass_on` gives a line to the server."""
        ...


@asynccontextmanager
async def stdio_streams(shortcut: Shortcut | None = None) -> AsyncIterator[Streams]:
    """Serve over this process's stdin and stdout (claimed for the duration, see the module docstring)."""
    with ExitStack() as claims:
        wire_in = claims.enter_context(_claimed(0, lambda: os.open(os.devnull, os.O_RDONLY)))
        wire_out = claims.enter_context(_claimed(1, _stdout_diversion))
        async with pipe_streams(wire_in, wire_out, shortcut) as streams:
            yield streams


@asynccontextmanager
async def pipe_streams(read_fd: int, write_fd: int, shortcut: Shortcut | None = None) -> AsyncIterator[Streams]:
    """Messages read from `read_fd` and written to `write_fd`: pipes and sockets non-blocking, a terminal or
    a regular file as it is. A `shortcut` is offered every line first, and runs until reading ends.

    Reading ends at end of input (the read stream then ends). On exit reading stops, both streams close,
    and what the server sent is written out.
    """
    incoming, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, outgoing = anyio.create_memory_object_stream[SessionMessage | bytes](0)
    async with anyio.create_task_group() as writing:
        writing.start_soon(_write_lines, write_fd, outgoing)
        async with read_stream, write_stream, anyio.create_task_group() as reading:
            shortcut_scope = anyio.CancelScope()
            if shortcut is not None:
                reading.start_soon(
                    _run_shortcut, shortcut, shortcut_scope, write_fd, write_stream.clone(), incoming.clone()
                )
            reading.start_soon(_read_lines, read_fd, incoming, write_stream.clone(), shortcut, shortcut_scope)
            try:
                yield read_stream, cast(MemoryObjectSendStream[SessionMessage], write_stream)
            finally:
                reading.cancel_scope.cancel()


async def _run_shortcut(
    shortcut: Shortcut,
    scope: anyio.CancelScope,
    fd: int,
    lines: MemoryObjectSendStream[SessionMessage | bytes],
    incoming: MemoryObjectSendStream[SessionMessage | Exception],
) -> None:
    async def pass_on(line: bytes) -> None:
        await _deliver(line, incoming, None)

    async def write(line: bytes) -> None:
        if lines.statistics().tasks_waiting_receive:
            # The writer waits with nothing to write: the line goes out now, from here (it is on its way to the host
            # when this returns), and only what the pipe does not take at once is left to the writer.
            line = _write_now(fd, line)
            if not line:
                return
        await lines.send(line)

    with scope:
        async with lines, incoming:
            await shortcut.run(write, pass_on)


async def _read_lines(
    fd: int,
    incoming: MemoryObjectSendStream[SessionMessage | Exception],
    replies: MemoryObjectSendStream[SessionMessage | bytes],
    shortcut: Shortcut | None,
    shortcut_scope: anyio.CancelScope,
) -> None:
    """Deliver each line of `fd` to `incoming` (unless the shortcut takes it); answer an over-long one on `replies`
    instead. At the end of input the shortcut stops too (its calls are cancelled, as the server cancels its own)."""
    try:
        await _read_lines_until_end(fd, incoming, replies, shortcut)
    finally:
        shortcut_scope.cancel()


async def _read_lines_until_end(
    fd: int,
    incoming: MemoryObjectSendStream[SessionMessage | Exception],
    replies: MemoryObjectSendStream[SessionMessage | bytes],
    shortcut: Shortcut | None,
) -> None:
    blocking = os.get_blocking(fd)  # a pipe or a socket is not (made so by `pipe_streams`); a regular file cannot wait
    blocking_tty = blocking and os.isatty(fd)  # a blocking terminal: a read would stall the loop
    with _Readable(fd) as readable, incoming, replies:
        buffer = bytearray()
        searched = 0  # bytes of `buffer` known to hold no newline: a long line is scanned once, not per chunk
        skipped: _OverlongLine | None = None  # the line being discarded, while its end has not come
        wait_first = blocking_tty
        while True:
            if wait_first:
                await readable.wait()
            try:
                chunk = os.read(fd, _READ_SIZE)
                # A pipe read short was emptied: the next read would only fail, so the next turn waits first.
                wait_first = blocking_tty or (not blocking and 0 < len(chunk) < _READ_SIZE)
            except BlockingIOError:
                await readable.wait()
                continue
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                break  # a terminal that hung up: the end of input
            if not chunk:
                break
            if skipped is not None:
                end = chunk.find(b"\n")
                skipped.add(chunk if end < 0 else chunk[:end])
                if end < 0:
                    continue
                await _refuse(skipped, replies)
                skipped = None
                chunk = chunk[end + 1 :]
            buffer += chunk
            start = 0
            while (end := buffer.find(b"\n", max(start, searched))) >= 0:
                line = bytes(buffer[start:end])
                if len(line) > MAX_MESSAGE_BYTES:
                    await _refuse(_OverlongLine(line), replies)
                else:
                    await _deliver(line, incoming, shortcut)
                start = end + 1
            del buffer[:start]
            searched = len(buffer)
            if len(buffer) > MAX_MESSAGE_BYTES:  # no end in sight: stop keeping it
                skipped = _OverlongLine(buffer)
                buffer.clear()
                searched = 0
        if skipped is not None:
            await _refuse(skipped, replies)
        elif len(buffer) > MAX_MESSAGE_BYTES:
            await _refuse(_OverlongLine(buffer), replies)
        else:
            await _deliver(bytes(buffer), incoming, shortcut)


class _Readable:
    """Waits until `fd` is readable, with the loop watching it from one wait to the next: `anyio.wait_readable` asks
    the loop to watch and stop watching on every wait, which on uvloop is a handle made and closed and seven system
    calls more per line read. The watch stops when `fd` is readable while nobody waits (the loop would
    otherwise call back on every turn until it is read), and at the end."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._watching = False

    def __enter__(self) -> _Readable:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._unwatch()

    async def wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        if not self._watching:
            self._loop.add_reader(self._fd, self._readable)
            self._watching = True
        try:
            await waiter
        finally:
            self._waiter = None

    def _readable(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        else:
            self._unwatch()

    def _unwatch(self) -> None:
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False


class _OverlongLine:
    """A line too long to deliver: its size and both ends, enough to find the request's id."""

    def __init__(self, start: bytes | bytearray) -> None:
        self.size = len(start)
        self.head = bytes(start[:_KEPT_EDGE])
        self.tail = bytes(start[-_KEPT_EDGE:])

    def add(self, more: bytes) -> None:
        self.size += len(more)
        self.tail = (self.tail + more)[-_KEPT_EDGE:]

    def request_id(self) -> types.RequestId | None:
        """The top-level `id`: found at the start when the members before it are short, or as the last member."""
        found = _leading_id(self.head.decode("utf-8", "replace"))
        if found is not None:
            return found
        match = _TRAILING_ID.search(self.tail)
        return _as_id(json.loads(match.group(1))) if match else None


def _leading_id(text: str) -> types.RequestId | None:
    """Walk the members of the object `text` starts (cut anywhere) until `id`, a value cut short, or a surprise."""
    decoder = json.JSONDecoder()
    at = _skip_space(text, 0)
    if not text.startswith("{", at):
        return None
    at += 1
    while True:
        at = _skip_space(text, at)
        if not text.startswith('"', at):
            return None
        try:
            key, at = decoder.raw_decode(text, at)
            at = _skip_space(text, at)
            if not text.startswith(":", at):
                return None
            value, at = decoder.raw_decode(text, _skip_space(text, at + 1))
        except ValueError:  # the cut falls inside this member
            return None
        if key == "id":
            return _as_id(value)
        at = _skip_space(text, at)
        if not text.startswith(",", at):
            return None
        at += 1


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _as_id(value: object) -> types.RequestId | None:
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


async def _refuse(line: _OverlongLine, replies: MemoryObjectSendStream[SessionMessage | bytes]) -> None:
    """Answer an over-long line with an error for its request (or a parse error with id null)."""
    request_id = line.request_id()
    limit = f"{MAX_MESSAGE_BYTES // (1 << 20)} MiB"
    logger.warning("refused a %d-byte message from the host (over the %s limit)", line.size, limit)
    reason = f"message of {line.size} bytes refused: over the {limit} limit of one message; send less at once"
    error = types.ErrorData(code=INVALID_REQUEST if request_id is not None else PARSE_ERROR, message=reason)
    try:
        await replies.send(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        logger.info("the server stopped before the refusal of an over-long message could be sent")


async def _deliver(
    line: bytes, incoming: MemoryObjectSendStream[SessionMessage | Exception], shortcut: Shortcut | None
) -> None:
    if not line.strip():
        return
    if shortcut is not None and shortcut.take(line):
        # The call it took runs first, the reading goes on after: the call is not kept waiting behind the next read
        # (once it waits for its downstream, this task reads on). The loop's own yield: anyio's looks its backend up.
        await asyncio.sleep(0)
        return
    try:
        message = types.jsonrpc_message_adapter.validate_json(line.decode("utf-8", "replace"), by_name=False)
    except ValidationError as exc:  # the server answers a line that does not parse; the transport goes on
        await incoming.send(exc)
        return
    await incoming.send(SessionMessage(message))


async def _write_lines(fd: int, outgoing: MemoryObjectReceiveStream[SessionMessage | bytes]) -> None:
    """Write each message as a line; a shortcut's lines come as bytes, already serialized."""
    async with outgoing:
        async for item in outgoing:
            if isinstance(item, bytes):
                pending = memoryview(item)
            else:
                pending = memoryview((item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode())
            while pending:
                try:
                    written = os.write(fd, pending)
                except BlockingIOError:
                    await anyio.wait_writable(fd)
                    continue
                except BrokenPipeError:
                    logger.info("the host closed Bastion's stdout; dropping what is left to send")
                    return
                pending = pending[written:]


def _write_now(fd: int, line: bytes) -> bytes:
    """Write what `fd` takes of `line` now (all of it, but for a non-blocking pipe that is full); what is left.
    Raises BrokenResourceError when the host closed its end."""
    try:
        written = os.write(fd, line)
    except BlockingIOError:
        return line
    except BrokenPipeError as exc:
        raise anyio.BrokenResourceError("the host closed Bastion's stdout") from exc
    return line[written:]


def _stdout_diversion() -> int:
    try:
        return os.dup(2)
    except OSError:  # no stderr: stray output is dropped
        return os.open(os.devnull, os.O_WRONLY)


@contextmanager
def _claimed(fd: int, open_diversion: Callable[[], int]) -> Iterator[int]:
    """A private duplicate of `fd` for the wire (non-blocking if it is a pipe or a socket), with `fd` itself
    pointed at the diversion."""
    wire = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    blocking = os.get_blocking(wire)
    try:
        diversion = open_diversion()
        try:
            os.dup2(diversion, fd)
        finally:
            os.close(diversion)
        mode = os.fstat(wire).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            os.set_blocking(wire, False)
    except BaseException:
        os.close(wire)
        raise
    try:
        yield wire
    finally:
        os.set_blocking(wire, blocking)
        os.dup2(wire, fd)
        os.close(wire)
