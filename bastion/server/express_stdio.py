"""The express lane of a stdio host (see bastion.server.express), and serving stdio with it.

Every line the host writes is offered to the lane first (`StdioExpressLane.take`): a call it takes is answered on stdout
by the lane; a host's answer to one of its questions, and the cancellation of one of its calls, it takes too.
Everything else goes to the SDK's server, which decides the connection's era from the first request; the lane
reads that request the same way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
import mcp_types as types

from bastion.jsontext import dumps
from bastion.server.express import (
    ExpressCall,
    ExpressLane,
    express_call,
    is_request,
    is_response,
    opens_modern,
    read_message,
)
from bastion.server.mcp import HostServer
from bastion.server.stdio import LineFn, stdio_streams

logger = logging.getLogger(__name__)


class _Stdout:
    """The lane's outlet on stdio: one line on Bastion's stdout per message."""

    def __init__(self, write: LineFn) -> None:
        self._write = write

    async def send(self, message: dict[str, Any]) -> None:
        await self._write(dumps(message) + b"\n")


class StdioExpressLane:
    """The express lane of one stdio host: offered every line before the SDK's server (satisfies `Shortcut`)."""

    def __init__(self, front: HostServer) -> None:
        self._lane = ExpressLane(front)
        self.counts = self._lane.counts
        self._front = front
        self._modern: bool | None = None
        """The era the host's first request opened the connection in (None until it came)."""
        self._running: dict[types.RequestId, anyio.CancelScope] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: asyncio.Future[None] | None = None
        """While the lane runs: the first unexpected failure of a call ends it (None when it is not running)."""
        self._outlet: _Stdout | None = None
        self._pass_on: LineFn | None = None

    async def run(self, write: LineFn, pass_on: LineFn) -> None:
        """Answer the calls taken, until cancelled (when the host's connection ends): `write` sends a line to the
        host, `pass_on` gives a line to the SDK's server. Then every call still running is cancelled and waited
        for. A call that fails unexpectedly ends it (with that error), as a task group would.

        Each call runs in an asyncio task of its own rather than in a task group's: anyio's `start_soon` costs a
        call about twice the task itself, a cancel scope and an event more."""
        self._outlet, self._pass_on = _Stdout(write), pass_on
        self._failure = asyncio.get_running_loop().create_future()
        try:
            await self._failure
        finally:
            self._failure = None
            for scope in self._running.values():
                scope.cancel()
            with anyio.CancelScope(shield=True):
                while self._tasks:
                    await asyncio.wait(set(self._tasks))

    def take(self, line: bytes) -> bool:
        """Whether the lane takes this line from the host (a call it answers, an answer to one of its questions,
        the cancellation of one of its calls)."""
        if self._failure is None:
            return False
        message = read_message(line)
        if message is None:
            return False
        if is_response(message):
            return self._lane.questions.answered(message)
        if message.get("method") == "notifications/cancelled":
            return self._cancelled(message.get("params"))
        if not is_request(message):
            return False
        if self._modern is None:
            self._modern = opens_modern(message)
            return False
        try:
            call = express_call(message, modern=self._modern, connection=self._front.sole_handshake_connection())
        except Exception:  # a bug here must not end the host's connection: the SDK's server serves the line
            logger.exception("the express lane could not read a request; the SDK's server serves it")
            return False
        if call is None or call.id in self._running or not self._lane.knows(call):
            return False
        scope = self._running[call.id] = anyio.CancelScope()
        task = asyncio.get_running_loop().create_task(self._answer(call, line, scope), name=f"express:{call.name}")
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return True

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        failed = None if task.cancelled() else task.exception()
        if failed is not None and self._failure is not None and not self._failure.done():
            self._failure.set_exception(failed)

    def _cancelled(self, params: Any) -> bool:
        request_id = params.get("requestId") if isinstance(params, dict) else None
        scope = self._running.get(request_id) if isinstance(request_id, int | str) else None
        if scope is None:
            return False
        scope.cancel()
        return True

    async def _answer(self, call: ExpressCall, line: bytes, scope: anyio.CancelScope) -> None:
        assert self._outlet is not None and self._pass_on is not None
        try:
            with scope:
                if not await self._lane.answer(call, self._front.stdio_context(), self._outlet, self._respond):
                    await self._pass_on(line)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            logger.debug("the host's connection ended before the answer to %r", call.id)
        finally:
            del self._running[call.id]

    async def _respond(self, response: dict[str, Any]) -> None:
        assert self._outlet is not None
        await self._outlet.send(response)  # on stdout when this returns, unless the writer was busy:
        await asyncio.sleep(0)  # then the writer puts it there before the call's outcome is recorded


async def serve_stdio(front: HostServer) -> None:
    """Serve one host over this process's stdin/stdout until it closes them; its calls through the express lane
    unless `[server] express_lane = false`."""
    lane = StdioExpressLane(front) if front.gateway.config.settings.server.express_lane else None
    async with stdio_streams(lane) as (read_stream, write_stream):
        await front.server.run(read_stream, write_stream, front.server.create_initialization_options())
