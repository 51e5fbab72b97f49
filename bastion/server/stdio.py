"""The stdio transport: MCP messages as lines on this process's stdin and stdout, waited for in the event loop.

The SDK's `stdio_server` reads and writes through `anyio.wrap_file`: a worker-thread hand-off for every
line read, written and flushed, three per tool call, each a GIL hand-over on the call's critical path.
Here the host's pipes are made non-blocking and the loop waits for them (`anyio.wait_readable`/
`wait_writable`). A terminal keeps its flags (its file description is the shell's too, and a Bastion
that is killed could not restore them): the loop waits until it is readable, then reads. A regular file
never blocks.
Framing and parsing are the SDK's: one JSON-RPC message per line, parsed by `jsonrpc_message_adapter`,
undecodable bytes replaced, a line that does not parse handed to the server as the exception.

Like the SDK's transport, it takes the wire away from fds 0 and 1 while it serves: fd 0 then reads the
null device and fd 1 writes to stderr, so a stray print (ours, a library's, a child's) cannot corrupt the
protocol. Both are restored on exit.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from typing import Final

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

logger = logging.getLogger(__name__)

_READ_SIZE: Final = 1 << 16

Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
"""What `Server.run` reads messages (or parse errors) from, and writes messages to."""


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[Streams]:
    """Serve over this process's stdin and stdout (claimed for the duration, see the module docstring)."""
    with ExitStack() as claims:
        wire_in = claims.enter_context(_claimed(0, lambda: os.open(os.devnull, os.O_RDONLY)))
        wire_out = claims.enter_context(_claimed(1, _stdout_diversion))
        async with pipe_streams(wire_in, wire_out) as streams:
            yield streams


@asynccontextmanager
async def pipe_streams(read_fd: int, write_fd: int) -> AsyncIterator[Streams]:
    """Messages read from `read_fd` and written to `write_fd`: pipes and sockets non-blocking, a terminal or
    a regular file as it is.

    Reading ends at end of input (the read stream then ends). On exit reading stops, both streams close,
    and what the server sent is written out.
    """
    incoming, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, outgoing = anyio.create_memory_object_stream[SessionMessage](0)
    async with anyio.create_task_group() as writing:
        writing.start_soon(_write_lines, write_fd, outgoing)
        async with read_stream, write_stream, anyio.create_task_group() as reading:
            reading.start_soon(_read_lines, read_fd, incoming)
            try:
                yield read_stream, write_stream
            finally:
                reading.cancel_scope.cancel()


async def _read_lines(fd: int, incoming: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
    wait_first = os.get_blocking(fd) and os.isatty(fd)  # a blocking terminal: a read would stall the loop
    async with incoming:
        buffer = bytearray()
        searched = 0  # bytes of `buffer` known to hold no newline: a long line is scanned once, not per chunk
        while True:
            if wait_first:
                await anyio.wait_readable(fd)
            try:
                chunk = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                await anyio.wait_readable(fd)
                continue
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                break  # a terminal that hung up: the end of input
            if not chunk:
                break
            buffer += chunk
            start = 0
            while (end := buffer.find(b"\n", max(start, searched))) >= 0:
                await _deliver(bytes(buffer[start:end]), incoming)
                start = end + 1
            del buffer[:start]
            searched = len(buffer)
        await _deliver(bytes(buffer), incoming)


async def _deliver(line: bytes, incoming: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
    if not line.strip():
        return
    try:
        message = types.jsonrpc_message_adapter.validate_json(line.decode("utf-8", "replace"), by_name=False)
    except ValidationError as exc:  # the server answers a line that does not parse; the transport goes on
        await incoming.send(exc)
        return
    await incoming.send(SessionMessage(message))


async def _write_lines(fd: int, outgoing: MemoryObjectReceiveStream[SessionMessage]) -> None:
    async with outgoing:
        async for session_message in outgoing:
            line = session_message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
            pending = memoryview(line.encode())
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
