"""The express lane of `POST /mcp` (see bastion.server.express), in front of the SDK's streamable-HTTP manager.

- A 2026-07-28 request is self-contained: a call the lane takes is answered in the request's own response, `200`
  with the JSON-RPC response as `application/json`, as the SDK answers a call that sent nothing before its result.
  Calls that want progress or log messages (which need a response stream) are left to the SDK.
- A 2025-era request belongs to a session the SDK set up (`Mcp-Session-Id`): the answer is an event stream, as the
  SDK's: the call's log messages, progress and questions (sampling, elicitation) as events, then the response.
  The host's answers to those questions come back as POSTed responses, and its cancellations as POSTed
  notifications: the lane takes those of its own calls (`202`, as the SDK does).

It takes only what the SDK's transport would serve without a refusal (a JSON body of a known length within the
limit, the media types the transport requires, a session the SDK knows, routing headers that agree with the body,
no `Mcp-Param-*` header out of step with the tool's schema). Every other request reaches the SDK's manager as it
came, its body replayed when the lane had read it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import anyio.abc
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.streamable_http import check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import (
    MCP_PROTOCOL_VERSION_HEADER,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
    x_mcp_header_map,
)
from mcp_types import CLIENT_INFO_META_KEY, LOG_LEVEL_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bastion.jsontext import dumps
from bastion.models import CallContext
from bastion.server.express import ExpressCall, ExpressCounts, ExpressLane, express_call, is_response, read_message
from bastion.server.mcp import HostServer
from bastion.server.sdk import keep_http_session

logger = logging.getLogger(__name__)

SESSION_HEADER: Final = "mcp-session-id"
_SCHEMAS_KEPT: Final = 4096
_ACCEPTS_KEPT: Final = 256
PING_SECONDS: Final = 15.0
"""How often an event stream still waiting for its call's result sends a comment, as the SDK's streams do."""


class _Events:
    """The lane's outlet on a 2025-era request: its response, an event stream started at the first message."""

    def __init__(self, send: Send, session_id: str) -> None:
        self._send = send
        self._session_id = session_id
        self.started = False
        self.ended = False
        self._lock = anyio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        await self._write(b"event: message\r\ndata: " + dumps(message) + b"\r\n\r\n")

    async def ping(self) -> None:
        await self._write(f": ping - {datetime.now(UTC).isoformat(sep=' ')}\r\n\r\n".encode())

    async def respond(self, response: dict[str, Any]) -> None:
        """The call's response, which ends the stream (a ping or a message arriving later is dropped)."""
        await self._write(b"event: message\r\ndata: " + dumps(response) + b"\r\n\r\n", more=False)

    async def _write(self, chunk: bytes, *, more: bool = True) -> None:
        async with self._lock:
            if self.ended:
                logger.debug("dropped a late event of a call already answered")
                return
            self.ended = not more
            if not self.started:
                self.started = True
                headers = [
                    (b"cache-control", b"no-cache, no-transform"),
                    (b"connection", b"keep-alive"),
                    (b"content-type", b"text/event-stream"),
                    (b"x-accel-buffering", b"no"),
                    (SESSION_HEADER.encode(), self._session_id.encode()),
                ]
                await self._send({"type": "http.response.start", "status": 200, "headers": headers})
            await self._send({"type": "http.response.body", "body": chunk, "more_body": more})


class _Nowhere:
    """The outlet of a 2026-07-28 call the lane took: it asked for no log message and no progress, and its host
    cannot be asked anything, so nothing is ever sent on it."""

    async def send(self, message: dict[str, Any]) -> None:
        logger.debug("dropped %s: the request asked for no messages", message.get("method"))


class HttpExpressLane:
    """`POST /mcp` through the express lane where it can, else the application behind it (`app`, which routes it
    to the SDK's manager)."""

    def __init__(
        self,
        app: ASGIApp,
        front: HostServer,
        manager: StreamableHTTPSessionManager,
        counts: ExpressCounts,
        *,
        path: str,
    ) -> None:
        """`app` serves everything the lane does not take; the lane looks only at POSTs to `path`."""
        self.app = app
        self._path = path
        self._lane = ExpressLane(front, counts)
        self._front = front
        self._manager = manager
        self._max_body = manager.max_request_body_size
        self._running: dict[tuple[str, types.RequestId], anyio.CancelScope] = {}
        """The 2025-era calls being answered, by session and request id (a host may cancel them)."""
        self._header_schemas: dict[int, tuple[dict[str, Any], bool]] = {}
        """Whether each tool input schema seen declares `x-mcp-header` arguments, by the schema's identity."""
        self._accepts: dict[str, bool] = {}
        """The SDK's verdict on each `Accept` header seen (both media types accepted): hosts send the same one."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self._path:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not self._may_take(scope, headers):
            await self.app(scope, receive, send)
            return
        body = await _body(receive)
        if not await self._answered(scope, headers, body, send):
            await self.app(scope, _replaying(body, receive), send)

    def _may_take(self, scope: Scope, headers: Headers) -> bool:
        """What the headers alone tell: JSON of a known length within the limit, accepting both media types, no
        `Mcp-Param-*` header, no routing header twice."""
        length = headers.get("content-length", "")
        if not length.isdigit() or int(length) > self._max_body:
            return False
        if not headers.get("content-type", "").lower().startswith("application/json"):
            return False
        if not self._accepted(scope, headers.get("accept", "")):
            return False
        names = [name for name, _ in headers.raw]
        if any(name.startswith(b"mcp-param-") for name in names):
            return False
        return find_duplicated_routing_header((name.decode("latin-1"), "") for name in names) is None

    def _accepted(self, scope: Scope, accept: str) -> bool:
        """Whether the SDK's transport takes this `Accept` header (it wants both media types); asked once per value."""
        known = self._accepts.get(accept)
        if known is None:
            if len(self._accepts) >= _ACCEPTS_KEPT:
                self._accepts.clear()
            known = self._accepts[accept] = all(check_accept_headers(Request(scope)))
        return known

    async def _answered(self, scope: Scope, headers: Headers, body: bytes, send: Send) -> bool:
        """Whether the lane answered the request (False: nothing was sent, the SDK's manager serves it)."""
        message = read_message(body)
        if message is None:
            return False
        version = headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if version in MODERN_PROTOCOL_VERSIONS:
            return await self._answer_modern(scope, headers, message, send)
        if version in HANDSHAKE_PROTOCOL_VERSIONS:
            return await self._answer_handshake(scope, headers, message, send)
        return False

    async def _answer_modern(self, scope: Scope, headers: Headers, message: dict[str, Any], send: Send) -> bool:
        call = _read(message, modern=True, connection=None, headers=headers)
        if call is None or call.progress_token is not None or LOG_LEVEL_META_KEY in call.meta:
            return False
        if not self._takes(call, headers):
            return False
        context = self._front.modern_http_context(scope, call.meta.get(CLIENT_INFO_META_KEY))

        async def respond(response: dict[str, Any]) -> None:
            body = dumps(response)
            start = {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
            await send(start)
            await send({"type": "http.response.body", "body": body})

        return await self._lane.answer(call, context, _Nowhere(), respond)

    async def _answer_handshake(self, scope: Scope, headers: Headers, message: dict[str, Any], send: Send) -> bool:
        session_id = headers.get(SESSION_HEADER)
        connection = self._front.http_session(session_id) if session_id else None
        if session_id is None or connection is None or not keep_http_session(self._manager, session_id):
            return False
        if is_response(message):
            return self._lane.questions.answered(message) and await _accepted(send, session_id)
        if message.get("method") == "notifications/cancelled":
            params = message.get("params")
            request_id = params.get("requestId") if isinstance(params, dict) else None
            running = self._running.get((session_id, request_id)) if isinstance(request_id, int | str) else None
            if running is None:
                return False
            running.cancel()
            return await _accepted(send, session_id)
        call = _read(message, modern=False, connection=connection)
        if call is None or (session_id, call.id) in self._running or not self._takes(call, headers):
            return False
        answered = await self._stream(call, self._front.http_context(scope, session_id), session_id, send)
        keep_http_session(self._manager, session_id)
        return answered

    async def _stream(self, call: ExpressCall, context: CallContext, session_id: str, send: Send) -> bool:
        """Answer a 2025-era call on an event stream: its messages as they come, pings while it runs, the response.
        False when the call was handed back before anything was sent."""
        events = _Events(send, session_id)
        key = (session_id, call.id)
        self._running[key] = scope = anyio.CancelScope()
        try:
            with scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_ping, events)
                    answered = await self._lane.answer(call, context, events, events.respond)
                    tg.cancel_scope.cancel()
                if not answered and not events.started:
                    return False
                if not answered:  # handed back after a ping: too late for the SDK, so refused here
                    error = {"code": types.INTERNAL_ERROR, "message": "the call could not be served; send it again"}
                    await events.respond({"jsonrpc": "2.0", "id": call.id, "error": error})
        finally:
            del self._running[key]
        return True

    def _takes(self, call: ExpressCall, headers: Headers) -> bool:
        """A listed tool whose schema's `x-mcp-header` arguments agree with the request's headers."""
        entry = self._front.gateway.catalog.get(call.name)
        if entry is None:
            return False
        schema = entry.tool.input_schema
        if not self._declares_headers(schema):
            return True  # nothing for the check to compare (and no `Mcp-Param-*` header came: `_may_take`)
        return validate_mcp_param_headers(schema, call.arguments, headers) is None

    def _declares_headers(self, schema: dict[str, Any]) -> bool:
        """Whether a tool's input schema has an `x-mcp-header` argument: the SDK's walk of it, once per schema."""
        known = self._header_schemas.get(id(schema))
        if known is None or known[0] is not schema:
            if len(self._header_schemas) >= _SCHEMAS_KEPT:
                self._header_schemas.clear()
            known = self._header_schemas[id(schema)] = (schema, bool(x_mcp_header_map(schema)))
        return known[1]


def _read(
    message: dict[str, Any], *, modern: bool, connection: Connection | None, headers: Mapping[str, str] | None = None
) -> ExpressCall | None:
    """`express_call`; None (logged) should it fail: the SDK's manager then serves the request."""
    try:
        return express_call(message, modern=modern, connection=connection, headers=headers)
    except Exception:  # a bug here must not cost the host its request
        logger.exception("the express lane could not read a request; the SDK's manager serves it")
        return None


async def _ping(events: _Events) -> None:
    while True:
        await anyio.sleep(PING_SECONDS)
        await events.ping()


async def _accepted(send: Send, session_id: str) -> bool:
    """`202 Accepted`, as the SDK's transport answers a POSTed notification or response."""
    headers = [(b"content-type", b"application/json"), (SESSION_HEADER.encode(), session_id.encode())]
    await send({"type": "http.response.start", "status": 202, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
    return True


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` with the request's body, already read, delivered again first."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
