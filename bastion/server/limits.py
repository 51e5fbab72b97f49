"""How much of an HTTP request body Bastion reads: each path's limit, enforced as the body arrives.

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

from bastion.errors import RequestTooLarge
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


def _too_large(size: str, limit: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"the request body ({size}) is over the {limit}-byte limit of this path; send less at once (a form field, a "
        "note, or arguments that large are not taken)"
    )
