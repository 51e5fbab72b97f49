"""What approvers are told as it happens: the ledger's change feed read as named events.

Five events are announced: `approval_requested` (a call waits for an approver), `approval_recorded` (one approval of
a call that needs several distinct approvers: it still waits), `approval_decided` (approved, denied or expired),
`invocation_finished` (completed, failed or unknown) and `drift_detected` (a call was made to an action whose
definition drifted from its pin). The events of a call that needs several approvers carry `approvals`: how many it
needs and who has approved it so far. Each carries the id of the ledger event it comes from: ids increase
ledger-wide, so a reader resumes after the last id it saw (SSE's `Last-Event-ID`) and misses nothing, whichever
process made the change. The event stream, the inbox and the webhooks all read this one mapping.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import anyio

from bastion.errors import ChangesLost
from bastion.models import Change, Invocation, Principal, Quorum
from bastion.pipeline.documents import invocation_json, quorum_json
from bastion.pipeline.seams import Ledger

EventName = Literal[
    "approval_requested", "approval_recorded", "approval_decided", "invocation_finished", "drift_detected"
]
EVENT_NAMES: Final[tuple[EventName, ...]] = (
    "approval_requested",
    "approval_recorded",
    "approval_decided",
    "invocation_finished",
    "drift_detected",
)

CATCH_UP_PAGE: Final = 500
"""Changes read from storage at once while a reader catches up."""


@dataclass(frozen=True)
class Announcement:
    """One named event about one invocation (as it is when the event is read)."""

    id: int
    """The id of the ledger event it comes from: resume after it."""
    name: EventName
    invocation: Invocation
    quorum: Quorum | None = None
    """For a call that needs several approvers: how many, and who has approved it so far."""

    def json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"id": self.id, "event": self.name, "invocation": invocation_json(self.invocation)}
        if self.quorum is not None:
            found["approvals"] = quorum_json(self.quorum)
        return found


def event_name(change: Change, invocation: Invocation) -> EventName | None:
    """The named event a ledger change is, if it is one approvers are told of.

    `approved` is a decision only for a call that needed one (an allowed call is approved by policy); `denied` only
    for one that waited (a call denied by policy never reached an approver)."""
    kind = change.kind
    if kind == "planned":
        return "drift_detected" if invocation.drift is not None else None
    if kind == "pending":
        return "approval_requested"
    if kind == "approval_recorded":
        return "approval_recorded"
    if kind == "expired" or (kind in ("approved", "denied") and invocation.mode == "require_approval"):
        return "approval_decided"
    if kind in ("completed", "failed", "unknown"):
        return "invocation_finished"
    return None


def may_hear(principal: Principal | None, invocation: Invocation) -> bool:
    """Approvers (and the local owner, None) hear of every invocation; an agent only of its own."""
    return principal is None or principal.may_decide or invocation.principal == principal.name


StillAllowed = Callable[[], Awaitable[bool]]
"""Whether a reader held open may still hear (its token not revoked, its session not logged out)."""
RECHECK_SECONDS: Final = 1.0
"""How often a stream's authority is looked at again while it is quiet."""


async def announcements(
    ledger: Ledger,
    *,
    after: int | None,
    principal: Principal | None = None,
    still_allowed: StillAllowed | None = None,
) -> AsyncIterator[Announcement]:
    """The announcements after ledger event `after` (None: from now on) that `principal` may hear, until
    `still_allowed` says no (looked at before each batch, and at least every RECHECK_SECONDS): forever without it.

    Old events are read from storage first, then the feed is followed; a reader that fell further behind than the
    feed keeps reads storage again, so none is skipped. An `after` beyond every event (another ledger's id) starts
    from now."""
    feed = ledger.changes
    cursor = feed.cursor if after is None else after
    while True:
        if still_allowed is not None and not await still_allowed():
            return
        batch: Sequence[Change] = ()
        with anyio.move_on_after(RECHECK_SECONDS if still_allowed is not None else math.inf):
            try:
                batch = await feed.next(cursor)
            except ChangesLost:
                batch = await feed.since(cursor, limit=CATCH_UP_PAGE)
                if not batch:
                    cursor = feed.cursor
        for change in batch:
            cursor = change.id
            invocation = await ledger.invocations.get(change.invocation_id)
            if invocation is None or not may_hear(principal, invocation):
                continue
            name = event_name(change, invocation)
            if name is None:
                continue
            quorum = None
            if name in ("approval_requested", "approval_recorded", "approval_decided"):
                quorum = Quorum.of(await ledger.invocations.events(invocation.id))
            yield Announcement(change.id, name, invocation, quorum if quorum and quorum.required > 1 else None)
