"""What approvers see: the JSON shapes of invocations, pending approvals and pins.

The CLI prints these shapes with `--json` and the REST API answers with them, so a remote CLI can print
an API answer unchanged. Each shape is a pydantic model too, which is where the API's OpenAPI schemas
come from: the document and the answers cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, Field, ValidationError

from bastion.actions import Found, LookedUpOutcome
from bastion.ledger.decisions import PREVIEW
from bastion.models import Grant, Invocation, InvocationEvent, Pin, PinObservation, Preview, Quorum, Scope
from bastion.pipeline.seams import InvocationStore
from bastion.policies import diff_definitions
from bastion.terms import DEFAULT_LIMIT


class Approvals(BaseModel):
    """The approvals of a call that needs several distinct approvers (two-person approval)."""

    required: int
    """How many distinct approvers must approve it."""
    by: list[str]
    """Who has approved it so far, oldest first (the last approval needed approves it: it is then not pending)."""
    summary: str
    """As companions show it: `1 of 2 approvals, by alice`."""


class PendingInvocation(Invocation):
    """An invocation waiting for an approver, with the seconds left to decide, whether it drifted, the scopes
    an approval of it may take here, and (a call that needs several approvers) its approvals so far."""

    expires_in_seconds: int | None
    drifted: bool
    scopes: list[Scope]
    approvals: Approvals | None = None
    preview: Preview | None = None
    """What the call would do, as its source worked it out when it was held (redacted); None: its action offers
    no preview."""


class GrantView(Grant):
    """A grant as scripts see it: the stored grant, and whether it is `active` (not revoked, not expired)."""

    active: bool


class InvocationDetail(Invocation):
    """One invocation with its event history, oldest event first, (pending) the scopes an approval of it may
    take here, and (a call that needs several approvers) its approvals."""

    events: list[InvocationEvent]
    scopes: list[Scope] = Field(default_factory=list)
    approvals: Approvals | None = None
    preview: Preview | None = None
    """The preview an approver was shown when the call was held (None: none was made)."""


class PinView(BaseModel):
    """A pin as scripts see it: the stored pin plus its `key`, whether it `drifted`, and the drift `diff`."""

    source_id: str
    action_id: str
    pinned: PinObservation
    pinned_by: str | None = None
    drift: PinObservation | None = None
    key: str
    drifted: bool
    diff: list[str] | None
    """The unified diff from the pinned definition to the drifted one; None when not drifted."""


class FoundView(BaseModel):
    """What a source found of a call when asked (`bastion invocations reconcile --check`)."""

    outcome: LookedUpOutcome
    where: str
    """Where it was found (a URL, an id), or why the source is certain the call never acted."""
    result: Any = None
    """What the call would have returned, read back from what was found."""
    creator: str | None = None
    """Who made it, as the downstream names them."""
    created_at: str | None = None
    """When it was made, as the downstream says."""
    accepted: bool = True
    """Whether it proves the call made it (then the call was reconciled by it); false leaves the call's status as it
    was, and records the refused check as a `checked` event."""
    reason: str | None = None
    """Why it is not accepted (e.g. made by someone else than the provider's credential, or outside the call's
    time); null when it is."""


class CheckReport(BaseModel):
    """A reconcile by check: the invocation (reconciled as `found` says; unchanged when nothing was found; its status
    unchanged, with a `checked` event, when what was found is not accepted)."""

    invocation: Invocation
    found: FoundView | None
    """None: the source found nothing it can be sure of; the call is left unresolved, to settle by hand."""


def check_json(invocation: Invocation, found: Found | None) -> dict[str, Any]:
    """The JSON shape of a reconcile by check, as the API answers and `reconcile --check --json` prints it."""
    view = None
    if found is not None:
        view = FoundView(
            outcome=found.outcome,
            where=found.where,
            result=found.result,
            creator=found.creator,
            created_at=found.created_at,
            accepted=found.accepted,
            reason=found.reason,
        )
    return CheckReport(invocation=invocation, found=view).model_dump(mode="json")


def invocation_json(invocation: Invocation) -> dict[str, Any]:
    """The JSON shape of an invocation for scripts (what `--json` prints)."""
    return invocation.model_dump(mode="json")


async def decided_json(store: InvocationStore, decided: Invocation) -> dict[str, Any]:
    """A decision's answer: the invocation, and for a call that needs several approvers its `approvals` (an approval
    that was not the last leaves it pending: `1 of 2 approvals, by alice`)."""
    quorum = Quorum.of(await store.events(decided.id))
    found = invocation_json(decided)
    if quorum.required > 1:
        found["approvals"] = quorum_json(quorum)
    return found


def expires_in(invocation: Invocation, now: datetime) -> int | None:
    """Whole seconds until the invocation expires (None when it never does)."""
    if invocation.expires_at is None:
        return None
    return int((invocation.expires_at - now).total_seconds())


def quorum_json(quorum: Quorum) -> dict[str, Any]:
    """The `approvals` of a call that needs several approvers, as scripts see them."""
    return Approvals(required=quorum.required, by=list(quorum.by), summary=quorum.summary or "").model_dump()


def pending_json(
    invocation: Invocation,
    now: datetime,
    scopes: Sequence[Scope],
    quorum: Quorum | None = None,
    preview: Preview | None = None,
) -> dict[str, Any]:
    """An invocation as scripts see it, plus `expires_in_seconds`, `drifted`, the `scopes` it may be approved
    with (see bastion.pipeline.grants), for a call that needs several approvers its `approvals` so far, and its
    `preview`."""
    several = quorum is not None and quorum.required > 1
    view = PendingInvocation(
        **dict(invocation),
        expires_in_seconds=expires_in(invocation, now),
        drifted=invocation.drift is not None,
        scopes=list(scopes),
        approvals=Approvals.model_validate(quorum_json(quorum)) if quorum is not None and several else None,
        preview=preview,
    )
    return view.model_dump(mode="json")


class Offers(Protocol):
    """What scopes an approval of a call may take here (bastion.pipeline.grants.Grants)."""

    def offered(self, invocation: Invocation, *, approvers: int = 1) -> tuple[Scope, ...]: ...


async def approvals_json(
    store: InvocationStore, pending: Sequence[Invocation], now: datetime, offers: Offers
) -> list[dict[str, Any]]:
    """Pending invocations as approvers see them (`pending_json`): each with the scopes an approval may take, when it
    needs several approvers who has approved it so far, and its preview (read from its events)."""
    found = []
    for invocation in pending:
        events = await store.events(invocation.id)
        quorum = Quorum.of(events)
        offered = offers.offered(invocation, approvers=quorum.required)
        found.append(pending_json(invocation, now, offered, quorum, stored_preview(events)))
    return found


def grant_json(grant: Grant, now: datetime) -> dict[str, Any]:
    """A grant as `bastion grants list --json` prints it and the API answers it."""
    return GrantView(**dict(grant), active=grant.standing(now)).model_dump(mode="json")


def invocation_detail_json(
    invocation: Invocation, events: list[InvocationEvent], offers: Offers | None = None
) -> dict[str, Any]:
    """An invocation with its `events`, as `bastion invocations show --json` prints it, the `scopes` it may be
    approved with as `offers` offers them (none unless pending), its `approvals` when it needs several, and the
    `preview` it was held with."""
    quorum = Quorum.of(events)
    scopes = offers.offered(invocation, approvers=quorum.required) if offers and invocation.status == "pending" else ()
    approvals = Approvals.model_validate(quorum_json(quorum)) if quorum.required > 1 else None
    detail = InvocationDetail(
        **dict(invocation), events=events, scopes=list(scopes), approvals=approvals, preview=stored_preview(events)
    )
    return detail.model_dump(mode="json")


def stored_preview(events: Sequence[InvocationEvent]) -> Preview | None:
    """The preview a call was held with: the `preview` of its `pending` event's detail (None when it has none, or one
    that is not a preview, e.g. cut short by the ledger's size limit)."""
    for event in events:
        if event.kind == "pending" and event.detail.get(PREVIEW) is not None:
            try:
                return Preview.model_validate(event.detail[PREVIEW])
            except ValidationError:
                return None
    return None


def drift_diff(pin: Pin) -> list[str] | None:
    """The unified diff from the pinned definition to the drifted one, or None when not drifted."""
    if pin.drift is None:
        return None
    return diff_definitions(pin.pinned.definition, pin.drift.definition)


def pin_json(pin: Pin) -> dict[str, Any]:
    """A pin as scripts see it: the stored pin plus `key`, `drifted` and the drift `diff`."""
    view = PinView(**dict(pin), key=pin.key, drifted=pin.drift is not None, diff=drift_diff(pin))
    return view.model_dump(mode="json")


async def pending_invocations(
    store: InvocationStore, now: datetime, *, limit: int = DEFAULT_LIMIT, principal: str | None = None
) -> list[Invocation]:
    """Pending invocations (of `principal` only, when given), newest first, after marking the ones past their
    expiry as expired (as the gateway's sweeper would), so nobody is shown a call that can no longer be
    approved."""
    due = await store.next_expiry()
    if due is not None and due <= now:
        await store.expire_due(now)
    return await store.list(status="pending", principal=principal, limit=limit)
