"""How much of an HTTP request Bastion takes: a URL and headers of bounded length, each path's body limit enforced as
the body arrives, and a bounded number of event streams held open per caller.

A URL over `MAX_URL_BYTES` is answered 414 and headers over `MAX_HEADER_BYTES` in all 431, before any route or
authentication looks at them (the HTTP parser has read them by then; nothing else of Bastion's does).

Without a limit a body is read whole into memory before anything looks at it (a 150 MB POST to the inbox's login
form, which needs no token, grew memory by more than that). `BodyLimits` refuses a body that announces a length
over its path's limit before reading any of it, and one that turns out longer while it is read as soon as it
passes the limit, so no more than the limit is ever held: 413 `request_too_large`, and the application behind it
sees the client gone. The MCP endpoints keep the SDK's 4 MiB (its streamable-HTTP transport refuses beyond it too),
the approver API and the approver MCP take as much, and the inbox's forms (a login, a decision with its note) far
less.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bastion.errors import BastionError, HeadersTooLarge, RateLimited, RequestTooLarge, UrlTooLong
from bastion.server.errors import http_response

MIB: Final = 1 << 20
API_BODY_LIMIT: Final = 4 * MIB
"""The approver API, the approver MCP and the MCP endpoints: the MCP SDK's own request-body limit."""
FORM_BODY_LIMIT: Final = 64 * 1024
"""The inbox's forms: a login (a token) or a decision (a note or a reason of a few lines)."""
LIMITS: Final[tuple[tuple[str, int], ...]] = (
    ("/inbox", FORM_BODY_LIMIT),
    ("/api", API_BODY_LIMIT),
    ("/approver", API_BODY_LIMIT),
    ("/mcp", API_BODY_LIMIT),
    ("/messages", API_BODY_LIMIT),
)
"""Path prefixes and their limits, first match; a path none matches reads no body (every other route is a GET)."""
OTHER_LIMIT: Final = FORM_BODY_LIMIT
MAX_URL_BYTES: Final = 8 * 1024
"""The longest path and query taken (every URL of Bastion's is short; a long one is a mistake or an attack)."""
MAX_HEADER_BYTES: Final = 32 * 1024
"""The most header bytes (names and values) of one request."""
MAX_STREAMS: Final = 8
"""Event streams (`/api/events`, `/inbox/events`) one token or inbox session may hold open at once."""


def limit_of(path: str, limits: Sequence[tuple[str, int]] = LIMITS) -> int:
    """The body limit of a request to `path`."""
    for prefix, limit in limits:
        if path == prefix or path.startswith(prefix + "/"):
            return limit
    return OTHER_LIMIT


class BodyLimits:
    """ASGI middleware: refuse a request body over its path's limit (see the module docstring)."""

    def __init__(self, app: ASGIApp, limits: Sequence[tuple[str, int]] = LIMITS) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = _oversized(scope)
        if refusal is not None:
            await http_response(refusal)(scope, receive, send)
            return
        limit = limit_of(scope["path"], self.limits)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await http_response(_too_large(declared + " bytes", limit))(scope, receive, send)
            return
        received = 0
        refused = started = False

        async def limited() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] != "http.request" or refused:
                return message
            received += len(message.get("body", b""))
            if received <= limit:
                return message
            refused = True
            if not started:
                await http_response(_too_large(f"over {limit} bytes", limit))(scope, receive, send)
            return {"type": "http.disconnect"}  # what the application reads next: the client is gone

        async def sending(message: Message) -> None:
            nonlocal started
            if refused:  # the refusal is the answer
                return
            started = True
            await send(message)

        await self.app(scope, limited, sending)


def _oversized(scope: Scope) -> BastionError | None:
    """Why a request's URL or headers are refused, before anything reads them; None when they are within bounds."""
    url = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b""))
    if url > MAX_URL_BYTES:
        return UrlTooLong(f"the URL is {url} bytes, over the {MAX_URL_BYTES}-byte limit; no route needs one that long")
    headers = sum(len(name) + len(value) for name, value in scope.get("headers", ()))
    if headers > MAX_HEADER_BYTES:
        return HeadersTooLarge(f"the headers are {headers} bytes in all, over the {MAX_HEADER_BYTES}-byte limit")
    return None


class StreamSlots:
    """How many event streams each caller (a token, an inbox session) holds open: at most MAX_STREAMS each, so one
    caller cannot hold the server's connections."""

    def __init__(self, limit: int = MAX_STREAMS) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def refusal(self, caller: str) -> RateLimited | None:
        """Why `caller` may open no more streams now; None when it may."""
        if self._open.get(caller, 0) < self.limit:
            return None
        return RateLimited(f"{self.limit} event streams are open for this caller already; close one first")

    def opened(self, caller: str) -> None:
        self._open[caller] = self._open.get(caller, 0) + 1

    def closed(self, caller: str) -> None:
        left = self._open.get(caller, 1) - 1
        if left > 0:
            self._open[caller] = left
        else:
            self._open.pop(caller, None)


def _too_large(size: str, limit: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"the request body ({size}) is over the {limit}-byte limit of this path; send less at once (a form field, a "
        "note, or arguments that large are not taken)"
    )
