"""`GET /api/events`: the named events of bastion.pipeline.events as server-sent events.

Each event's SSE id is its ledger event id, so a client that reconnects with `Last-Event-ID` (as EventSource does
by itself) resumes right after the last event it received and loses none, even across a restart of Bastion. Without
it the stream starts from now. Agent tokens hear only of their own invocations. The inbox page reads the same
stream under its session cookie (`/inbox/events`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from bastion.errors import InvalidArguments, Unauthenticated
from bastion.models import Principal
from bastion.pipeline.events import StillAllowed, announcements
from bastion.pipeline.seams import Ledger
from bastion.server.auth import bearer_secret, principal_of
from bastion.server.errors import http_response
from bastion.server.limits import StreamSlots

PING_SECONDS: Final = 15
"""A comment line this often keeps proxies from closing a quiet stream."""


MAX_EVENT_ID: Final = 2**63 - 1
"""The largest id a ledger can give an event (SQLite's INTEGER, PostgreSQL's bigint): a larger one names none."""


def event_id(text: str) -> int:
    """An event id a request gives (`Last-Event-ID`, `?since=`): a whole number from 0 to MAX_EVENT_ID; ValueError
    saying so for anything else (a larger number would overflow the ledger's query)."""
    if not text.isascii() or not text.isdigit() or len(text) > len(str(MAX_EVENT_ID)) or int(text) > MAX_EVENT_ID:
        raise ValueError(f"must be an event id: a whole number from 0 to {MAX_EVENT_ID}")
    return int(text)


def resume_point(request: Request) -> int | None:
    """The ledger event id to resume after: `Last-Event-ID` (what a reconnecting EventSource sends), else `?after=`
    (what a page rendered as of an event opens its first stream with); None: start from now. InvalidArguments if it
    is not an id."""
    text = request.headers.get("last-event-id") or request.query_params.get("after")
    if text is None or not text.strip():
        return None
    text = text.strip()
    try:
        return event_id(text)
    except ValueError as exc:
        raise InvalidArguments(
            f"the resume point {text[:32]!r} (Last-Event-ID, or ?after=) {exc}; send the id of the last event seen, "
            "or none to start from now"
        ) from exc


def event_stream(
    ledger: Ledger,
    principal: Principal,
    after: int | None,
    *,
    still_allowed: StillAllowed,
    slots: StreamSlots,
) -> Response:
    """The SSE response of the announcements after ledger event `after` that `principal` may hear, ended within a
    second once `still_allowed` says no (its token revoked, its session logged out); 429 when `principal` holds as
    many streams open as `slots` allows."""
    refusal = slots.refusal(principal.name)
    if refusal is not None:
        return http_response(refusal)

    async def events() -> AsyncIterator[ServerSentEvent]:
        slots.opened(principal.name)
        try:
            async for announcement in announcements(
                ledger, after=after, principal=principal, still_allowed=still_allowed
            ):
                yield ServerSentEvent(
                    data=json.dumps(announcement.json(), separators=(",", ":")),
                    event=announcement.name,
                    id=str(announcement.id),
                )
        finally:
            slots.closed(principal.name)

    return EventSourceResponse(events(), ping=PING_SECONDS, headers={"Cache-Control": "no-store"})


def events_endpoint(ledger: Ledger, slots: StreamSlots) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint of `GET /api/events` (BearerAuth has authenticated the caller)."""

    async def endpoint(request: Request) -> Response:
        principal = principal_of(request.scope)
        try:
            if principal is None:  # BearerAuth lets no anonymous request through to /api
                raise Unauthenticated("the event stream needs a bearer token")
            after = resume_point(request)
        except (InvalidArguments, Unauthenticated) as exc:
            return http_response(exc)
        secret = bearer_secret(request.headers.get("authorization"))

        async def still_allowed() -> bool:  # the token is not revoked (nor its role changed)
            return secret is not None and await ledger.tokens.authenticate(secret) == principal

        return event_stream(ledger, principal, after, still_allowed=still_allowed, slots=slots)

    return endpoint
