"""A stdio connector's child process (bastion.sources.mcp.process): how the express wire writes to its stdin."""

from __future__ import annotations

import sys

import anyio
import pytest

from bastion.sources.mcp.process import line_sender
from bastion.sources.mcp.wire import SendFn

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[pytest.param({}, id="asyncio"), pytest.param({"use_uvloop": True}, id="uvloop")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    """Plain asyncio, and uvloop as `bastion serve` runs (their transports fail writes differently)."""
    return "asyncio", request.param


ECHO = [sys.executable, "-c", "import sys\nfor line in sys.stdin: sys.stdout.write(line); sys.stdout.flush()"]


async def _read_lines(process: anyio.abc.Process, count: int) -> list[bytes]:
    assert process.stdout is not None
    buffer = b""
    while buffer.count(b"\n") < count:
        buffer += await process.stdout.receive()
    return buffer.split(b"\n")[:count]


async def test_lines_reach_the_process_whole_and_in_order_past_a_full_pipe() -> None:
    async with await anyio.open_process(ECHO) as process:
        assert process.stdin is not None
        send = line_sender(process.stdin)
        assert send != process.stdin.send  # the transport's own write, not anyio's send with its extra loop turn
        big = b"x" * (1 << 20)  # far beyond a pipe's buffer: written while the process reads
        lines = [b"first", big, b"third"]
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for line in lines:
                    tg.start_soon(_send_line, send, line)
                    await anyio.lowlevel.checkpoint()  # started in this order
                echoed = await _read_lines(process, len(lines))
        assert echoed == lines
        await process.stdin.aclose()


async def test_a_process_gone_refuses_the_line_with_errors_the_wire_expects() -> None:
    """The wire turns these into WireClosed (bastion.sources.mcp.wire.WireCalls.request); nothing else escapes."""
    async with await anyio.open_process([sys.executable, "-c", "pass"]) as process:
        assert process.stdin is not None
        send = line_sender(process.stdin)
        with anyio.fail_after(30):
            await process.wait()
            with pytest.raises((anyio.ClosedResourceError, anyio.BrokenResourceError, OSError)):
                await _send_until_refused(send)


async def _send_until_refused(send: SendFn) -> None:
    for _ in range(100):  # the first writes may still be buffered before the pipe's end is seen
        await send(b"x" * 65536 + b"\n")


async def _send_line(send: SendFn, line: bytes) -> None:
    await send(line + b"\n")
