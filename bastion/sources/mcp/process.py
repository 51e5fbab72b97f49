"""A stdio connector's server as a child process: its stdin and stdout carry MCP, its stderr is watched.

Bastion runs these itself rather than through the SDK's `stdio_client`, for three things that one keeps
to itself:

- how the process ended (exit status or signal) and the last lines of its stderr, which say why a
  connector is down (`Child.ending`);
- its stderr, held back until the connection is ready (`Child.release`): a connector that fails the same
  way on every reconnect attempt is then shown once, not once per attempt;
- its whole process group, stopped at the end even when the leader has exited (`npx` and shell wrappers
  leave grandchildren behind).

Shutdown follows the SDK's and the MCP lifecycle: close stdin, give the process `STDIN_CLOSE_GRACE`
seconds to exit, SIGTERM its group, `TERM_GRACE` seconds later SIGKILL it. It is shielded from
cancellation and every wait in it is bounded, so a cancelled caller never leaves a process running.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import signal
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Final

import anyio
import anyio.to_thread
import mcp_types as types
from anyio.abc import ByteSendStream, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from bastion.errors import ConnectorUnavailable
from bastion.sources.mcp.wire import SendFn, WireCalls

__all__ = ["Child", "Streams", "child_process"]

logger = logging.getLogger(__name__)

STDIN_CLOSE_GRACE: Final = 2.0
"""Seconds a server has to exit by itself once its stdin is closed (the SDK's figure)."""

TERM_GRACE: Final = 2.0
"""Seconds between SIGTERM and SIGKILL to the process group."""

_REAP_TIMEOUT: Final = 2.0
_FLUSH_TIMEOUT: Final = 0.5
_EXIT_POLL: Final = 0.01
_TAIL_LINES: Final = 5
_TAIL_LINE_CHARS: Final = 300
_HELD_BYTES: Final = 1 << 16
_PASS_ON_TIMEOUT: Final = 5.0

Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
"""What the MCP client reads messages (or parse errors) from, and writes messages to."""


class Child:
    """One run of a connector's command: its stderr (held back or passed on) and how it ended."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.ended_by_itself = False
        """Its stdout closed before Bastion began to stop it: it exited (or crashed) on its own."""
        self.stopping = False
        """Bastion has begun to stop it."""
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._partial = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""
        self._passing_on = False
        self.wire = WireCalls()
        """Calls Bastion writes to the process itself (the express lane), beside the SDK client's."""

    @property
    def ending(self) -> str | None:
        """Why the connection ended when the process ended it: its exit status and last stderr lines."""
        if not self.ended_by_itself or self.returncode is None:
            return None
        code = self.returncode
        how = f"exited with status {code}" if code >= 0 else f"was killed by {_signal_name(-code)}"
        lines = [*self._tail, *([self._partial.strip()] if self._partial.strip() else [])][-_TAIL_LINES:]
        if not lines:
            return f"the process {how} (nothing on stderr)"
        return f"the process {how}; its stderr ended with: " + " | ".join(lines)

    async def release(self) -> None:
        """Pass on what it wrote to stderr so far, and from now on as it comes (once connected, or to report it)."""
        while self._held:  # what arrives during a write is held until the next one
            held, self._held = self._held, ""
            await _pass_on(held)
        self._passing_on = True

    async def heard(self, chunk: bytes, *, final: bool = False) -> None:
        """Take in what the process wrote on stderr: pass it on or hold it back, and keep its last lines."""
        text = self._decoder.decode(chunk, final=final)
        self._keep_last_lines(text)
        if self._passing_on:
            await _pass_on(text)
        else:
            self._held = (self._held + text)[-_HELD_BYTES:]

    def _keep_last_lines(self, text: str) -> None:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if line.strip():
                self._tail.append(line.strip()[:_TAIL_LINE_CHARS])
        self._partial = self._partial[-_TAIL_LINE_CHARS:]


async def _pass_on(text: str) -> None:
    """The child's stderr goes to Bastion's, as when it wrote there itself. In a worker thread, bounded: a host
    that does not drain Bastion's stderr must not stall the event loop (what cannot be written is dropped)."""
    if text:
        with anyio.move_on_after(_PASS_ON_TIMEOUT):
            await anyio.to_thread.run_sync(_write_stderr, text, abandon_on_cancel=True)


def _write_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@asynccontextmanager
async def child_process(params: StdioServerParameters, child: Child) -> AsyncIterator[Streams]:
    """Start `params.command` in a process group of its own and speak MCP over its stdin and stdout."""
    try:
        process = await anyio.open_process(
            [params.command, *params.args],
            env=get_default_environment() | (params.env or {}),
            cwd=params.cwd,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise ConnectorUnavailable(
            f"cannot start {params.command!r}: {exc.strerror or exc}; check the connector's `command` and `args`"
        ) from exc
    # No await until the task group is entered: a cancellation in between would leak the process.
    to_session, from_process = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_process, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    written = anyio.Event()
    heard = anyio.Event()
    with to_session, from_process, to_process, from_session:  # closed however the tasks below end
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_stdout, process, to_session, child)
            tg.start_soon(_write_stdin, process, from_session, to_session, written, child.wire)
            tg.start_soon(_read_stderr, process, child, heard)
            assert process.stdin is not None
            child.wire.attach(line_sender(process.stdin))
            try:
                yield from_process, to_process
            finally:
                child.stopping = True
                child.wire.close()
                with anyio.CancelScope(shield=True):
                    from_process.close()
                    to_process.close()
                    with anyio.move_on_after(_FLUSH_TIMEOUT):
                        await written.wait()
                    await _stop(process)
                    child.returncode = process.returncode
                    with anyio.move_on_after(_FLUSH_TIMEOUT):
                        await heard.wait()
                tg.cancel_scope.cancel()
    if process.returncode is not None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(_FLUSH_TIMEOUT):
            await process.aclose()


async def _read_stdout(
    process: Process, to_session: MemoryObjectSendStream[SessionMessage | Exception], child: Child
) -> None:
    """One JSON-RPC message per line to the session; once the session is gone, drain so the process never blocks."""
    assert process.stdout is not None
    buffer = bytearray()
    searched = 0  # bytes of `buffer` known to hold no newline: a long line is scanned once, not per chunk
    delivering = True
    try:
        async for chunk in process.stdout:
            if not delivering:
                continue
            buffer += chunk
            start = 0
            while delivering and (end := buffer.find(b"\n", max(start, searched))) >= 0:
                line = bytes(buffer[start:end])
                start = end + 1
                if not line.strip() or child.wire.claims(line):
                    continue
                try:
                    await to_session.send(_parse(line))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    delivering = False
            del buffer[:start]
            searched = len(buffer)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        pass  # our own shutdown closed the pipe under the read
    child.wire.close()
    if not child.stopping:
        child.ended_by_itself = True
    await to_session.aclose()


def line_sender(stdin: ByteSendStream) -> SendFn:
    """How the express wire writes a line to the process's stdin: into the pipe's asyncio transport, waiting only
    while its buffer is full, as anyio's `send` does; but that also yields to the loop after every write (a shielded
    checkpoint: a cancel scope and a loop turn per call, 2.4 % of Bastion's instructions per call), which
    a line that is written whole does not need. Lines never interleave: each is one `write`, in call order.

    The asyncio stream is anyio's private `_stream` of its wrapper; where it is not one (another anyio, another
    backend), anyio's `send` does the job. tests/test_process.py notices when the fast way is no longer taken."""
    writer = getattr(stdin, "_stream", None)
    if not isinstance(writer, asyncio.StreamWriter):
        return stdin.send

    async def send(line: bytes) -> None:
        if writer.is_closing():
            raise anyio.ClosedResourceError
        try:
            writer.write(line)
            await writer.drain()
        except RuntimeError as exc:  # uvloop's write on a transport that closed under it
            raise anyio.BrokenResourceError from exc

    return send


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValidationError as exc:
        logger.warning("a stdio connector wrote a line that is not JSON-RPC: %.200r", line)
        return exc


async def _write_stdin(
    process: Process,
    from_session: MemoryObjectReceiveStream[SessionMessage],
    to_session: MemoryObjectSendStream[SessionMessage | Exception],
    written: anyio.Event,
    wire: WireCalls,
) -> None:
    assert process.stdin is not None
    try:
        async with from_session:
            async for message in from_session:
                wire.noticed(message.message)
                line = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                await process.stdin.send(line.encode())
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        # The process closed its stdin (or died): end the session's read side rather than leave a request hanging.
        wire.close()
        await to_session.aclose()
    finally:
        written.set()


async def _read_stderr(process: Process, child: Child, heard: anyio.Event) -> None:
    assert process.stderr is not None
    try:
        async for chunk in process.stderr:
            await child.heard(chunk)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        pass
    finally:
        with anyio.CancelScope(shield=True):
            await child.heard(b"", final=True)
        heard.set()


async def _stop(process: Process) -> None:
    """Close stdin, wait, then terminate and kill the whole group (grandchildren too, even once the leader is gone)."""
    assert process.stdin is not None
    with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await process.stdin.aclose()
    await _exited(process, STDIN_CLOSE_GRACE)
    await terminate_posix_process_tree(process, TERM_GRACE)
    if not await _exited(process, _REAP_TIMEOUT):
        logger.warning("connector process %d survived SIGKILL; abandoning it", process.pid)


async def _exited(process: Process, timeout: float) -> bool:
    """Whether the process exited within `timeout`, polling its returncode: asyncio's `wait()` also waits for
    every pipe to close (CPython 3.11 `_try_finish`), which a grandchild holding one delays indefinitely."""
    with anyio.move_on_after(timeout):
        while process.returncode is None:  # noqa: ASYNC110 (no event exists for the exit alone)
            await anyio.sleep(_EXIT_POLL)
    return process.returncode is not None
