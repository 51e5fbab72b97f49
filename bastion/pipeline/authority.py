"""Who may do what: only approvers decide or re-pin, and nobody decides their own call.

Every way of deciding — the REST API, the local CLI, a remote CLI — goes through these functions.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal, cast

from bastion import states
from bastion.actions import Found
from bastion.errors import (
    AmbiguousId,
    ApprovalExpired,
    Conflict,
    ConnectorUnavailable,
    Forbidden,
    InvalidArguments,
    NotFound,
    UpstreamError,
)
from bastion.models import PLUGIN_SOURCE_ID, Invocation, InvocationEvent, Pin, Principal, Quorum, Scope, Status
from bastion.pipeline.grants import Grants
from bastion.pipeline.seams import InvocationStore, Ledger
from bastion.program import bastion_command
from bastion.sources.seam import ActionSource, LookupSource
from bastion.terms import MIN_ID_PREFIX

logger = logging.getLogger(__name__)

_CANDIDATES_SHOWN: Final = 5


async def resolve_invocation_id(store: InvocationStore, text: str, principal: Principal | None = None) -> str:
    """The whole invocation id `text` names: itself, or the one id it starts (at least MIN_ID_PREFIX characters).

    Only the invocations `principal` may see count (None: all of them), so an agent never learns of another's
    ids. NotFound when none matches; AmbiguousId, naming the candidates, when more than one does.
    """
    own = None if principal is None or principal.may_decide else principal.name
    found = await store.find(text, principal=own, limit=_CANDIDATES_SHOWN + 1)
    if found[:1] == [text]:
        return text
    if len(text) < MIN_ID_PREFIX or not found:
        hint = f"; give the whole id or at least {MIN_ID_PREFIX} of its first characters" if found else ""
        raise NotFound(f"no invocation {text!r}{hint}", invocation_id=text)
    if len(found) == 1:
        return found[0]
    shown = ", ".join(found[:_CANDIDATES_SHOWN]) + (", ..." if len(found) > _CANDIDATES_SHOWN else "")
    raise AmbiguousId(f"{text!r} starts more than one invocation id ({shown}); give more of the id")


def local_owner(name: str) -> Principal:
    """Whoever can write the ledger file is its owner; the CLI acts as `local:<login name>`."""
    return Principal(name=name, role="owner")


def may_see(principal: Principal, invocation: Invocation) -> bool:
    """Approvers see every invocation; an agent sees only the ones it made."""
    return principal.may_decide or invocation.principal == principal.name


async def visible_invocation(ledger: Ledger, principal: Principal, invocation_id: str) -> Invocation:
    """The invocation (by id or unique prefix) if this principal may see it; NotFound otherwise (never revealing
    which)."""
    invocation = await ledger.invocations.get(await resolve_invocation_id(ledger.invocations, invocation_id, principal))
    if invocation is None or not may_see(principal, invocation):
        raise NotFound(f"no invocation {invocation_id!r}", invocation_id=invocation_id)
    return invocation


async def decide(
    ledger: Ledger,
    invocation_id: str,
    *,
    approve: bool,
    principal: Principal,
    note: str | None,
    now: datetime,
    scope: str = "once",
    rule: str | None = None,
    grants: Grants | None = None,
) -> Invocation:
    """An approver's decision (by id or unique prefix), refused for agents and for whoever may not decide this call
    (`_refusal`). An approval scoped beyond "once" (optionally narrowed by `rule`, a condition on the arguments)
    leaves a grant, checked against what `grants` offers for this call before anything is decided and stored with
    the decision.

    A call that needs several approvers (its `pending` event says how many: two-person approval) is approved only
    by the last one needed: each approval before it is recorded (`approval_recorded`, signed) and leaves the call
    pending, with its expiry unchanged. A denial from any approver ends it."""
    if (scope != "once" or rule is not None) and (grants is None or not approve):
        raise InvalidArguments(
            f'the scope "{scope}" and a grant\'s condition apply to an approval made where grants are kept (the '
            'inbox, the API, `bastion approvals approve`, the approver endpoint); deny, or approve "once"'
        )
    if not principal.may_decide:
        raise Forbidden(
            f"{principal.name} has the {principal.role} role; only owner and admin tokens may decide",
            invocation_id=invocation_id,
        )
    invocation_id = await resolve_invocation_id(ledger.invocations, invocation_id, principal)
    invocation = await ledger.invocations.get(invocation_id)
    if invocation is None:
        raise NotFound(f"no invocation {invocation_id!r}", invocation_id=invocation_id)
    quorum = Quorum.of(await ledger.invocations.events(invocation_id))
    refusal = _refusal(invocation, principal, quorum, approve=approve)
    if refusal is not None:
        raise refusal
    grant = None
    if grants is not None and approve:
        grants.check(invocation, scope, rule, approvers=quorum.required)  # before the decision: never without it
        grant = grants.make(invocation, cast(Scope, scope), rule, by=principal.name, now=now)
    if approve and invocation.status == "pending" and len(quorum.by) + 1 < quorum.required:
        return await _record_approval(ledger, invocation, principal=principal, note=note, now=now, quorum=quorum)
    return await ledger.invocations.decide(
        invocation_id,
        approve=approve,
        principal=principal.name,
        note=note,
        now=now,
        grant=grant,
        approvers=quorum.required,
    )


def _refusal(invocation: Invocation, principal: Principal, quorum: Quorum, *, approve: bool) -> Forbidden | None:
    """Why `principal` (an approver) may not decide `invocation`: nobody decides a call they made, and an approver
    whose approval of a call that needs several is recorded may not approve it again (a deny is theirs to give)."""
    if invocation.principal is not None and invocation.principal == principal.name:
        return Forbidden(
            f"{principal.name} made this call and may not decide it; ask another approver",
            invocation_id=invocation.id,
        )
    if approve and principal.name in quorum.by and invocation.status == "pending":
        return Forbidden(
            f"{principal.name} has already approved invocation {invocation.id} ({quorum.summary}); it needs the "
            f"approval of {quorum.required - len(quorum.by)} more distinct approver(s), not the same one twice",
            invocation_id=invocation.id,
        )
    return None


async def _record_approval(
    ledger: Ledger, invocation: Invocation, *, principal: Principal, note: str | None, now: datetime, quorum: Quorum
) -> Invocation:
    """Record an approval of a call that needs more than one (not the last): it stays pending. Past its expiry it is
    marked expired (ApprovalExpired), as a decision would; no longer pending, Conflict names its status. Two
    approvers recording at once may together complete the quorum: whoever then sees it complete approves the call."""
    if invocation.expires_at is not None and now >= invocation.expires_at:
        await ledger.invocations.expire_due(now)
        raise ApprovalExpired(
            f"invocation {invocation.id} expired at {invocation.expires_at} before a decision",
            invocation_id=invocation.id,
        )
    recorded = await ledger.invocations.record_approval(
        invocation.id, principal=principal.name, note=note, now=now, approvers=quorum.required
    )
    if recorded is None:
        current = await ledger.invocations.get(invocation.id)
        status = current.status if current is not None else "gone"
        raise Conflict(f"invocation {invocation.id} is already {status}", invocation_id=invocation.id)
    after = Quorum.of(await ledger.invocations.events(invocation.id))
    if len(after.by) < after.required:
        return recorded
    try:  # another approver recorded theirs at the same moment: together they are enough
        return await ledger.invocations.decide(
            invocation.id, approve=True, principal=principal.name, note=note, now=now, approvers=after.required
        )
    except Conflict:
        return await ledger.invocations.get(invocation.id) or recorded


PENDING: Final = states.DECIDE.from_
WITHDRAWN: Final = "withdrawn"
"""The mark, in the `denied` event's detail, of a call withdrawn by the principal that made it (not an approver)."""


async def withdraw(ledger: Ledger, invocation: Invocation, *, principal: str | None, how: str) -> Invocation | None:
    """The principal that made a pending call takes it back: recorded `denied` (a refusal only takes power away, so
    the caller may make it, unlike an approval), its event marked WITHDRAWN. None when it is no longer pending
    (whoever came first won). The caller must have checked that `invocation` is `principal`'s own."""
    by = principal or "its caller"
    return await ledger.invocations.transition(
        invocation.id,
        from_statuses=PENDING,
        to="denied",
        detail={"by": by, "reason": f"withdrawn with {how}", WITHDRAWN: True},
        fields={"error_class": "approval_denied", "error_message": f"withdrawn by {by} with {how}"},
    )


def was_withdrawn(events: list[InvocationEvent]) -> bool:
    """Whether a denied invocation was withdrawn by its caller (`withdraw`) rather than denied by an approver."""
    return any(event.kind == "denied" and event.detail.get(WITHDRAWN) is True for event in events)


async def accept_pins(ledger: Ledger, *, principal: Principal, source_id: str, action_id: str | None) -> list[Pin]:
    """Re-pin drifted definitions: approvers only."""
    if not principal.may_decide:
        raise Forbidden(f"{principal.name} has the {principal.role} role; only owner and admin tokens may re-pin")
    return await ledger.pins.accept_drift(source_id=source_id, action_id=action_id, principal=principal.name)


Outcome = Literal["completed", "failed"]
RECONCILABLE: Final = states.RECONCILE.from_
"""What may be reconciled: an outcome nobody could know (`unknown`), or a call stuck `executing` (a person judges
that it is not still running: its result would then be refused, the reconciled outcome stands)."""
STALE_AFTER: Final = timedelta(minutes=5)
"""An `executing` call not updated for this long may be reconciled by check (a fresher one may still be running,
and a look-up that finds nothing would then say nothing true)."""

SourceOf = Callable[[str], ActionSource | None]
"""The running source of a source id, if any."""


@dataclass(frozen=True, slots=True)
class Checked:
    """What a reconcile by check came to: the invocation (reconciled; unchanged when nothing was `found`; its status
    unchanged, the refused evidence recorded, when what was found is not `accepted`)."""

    invocation: Invocation
    found: Found | None


def _require_approver(principal: Principal, invocation_id: str) -> None:
    if not principal.may_decide:
        raise Forbidden(
            f"{principal.name} has the {principal.role} role; only owner and admin tokens may reconcile",
            invocation_id=invocation_id,
        )


async def reconcile(
    ledger: Ledger,
    invocation_id: str,
    *,
    outcome: Outcome,
    principal: Principal,
    note: str | None,
    found: Found | None = None,
    rolled_back: Mapping[str, Any] | None = None,
    from_statuses: Collection[Status] = RECONCILABLE,
) -> Invocation:
    """Record what came of a call whose outcome was unknown, so it is settled on the record, not left open:
    unknown or executing -> `outcome`, with a `reconciled` event naming who (`by`: the approver), how (`how`: by
    `hand`, by `check` with the evidence `found`, or by the `rollback` whose report is `rolled_back`) and why (the
    `note`, the evidence: where, who made it and when, or the rollback's report). Approvers only; NotFound, or
    Conflict when the invocation is not unresolved (naming its status). Evidence that is not accepted settles
    nothing: the attempt is recorded (`note_refused_check`), then InvalidArguments says why."""
    _require_approver(principal, invocation_id)
    invocation_id = await resolve_invocation_id(ledger.invocations, invocation_id, principal)
    if found is not None and not found.accepted:
        await note_refused_check(ledger, invocation_id, found, principal=principal, note=note)
        raise InvalidArguments(
            f"what was found of invocation {invocation_id} ({found.where}) is no proof the call made it: "
            f"{found.reason}; settle it by hand with --outcome",
            invocation_id=invocation_id,
        )
    failed = outcome == "failed"
    detail: dict[str, Any] = {"outcome": outcome, "by": principal.name, "how": "hand", "note": note}
    if found is not None:
        evidence = {"where": found.where, "creator": found.creator, "created_at": found.created_at}
        detail |= {"how": "check", "found": evidence | {"result": found.result}}
    if rolled_back is not None:
        detail |= {"how": "rollback", "rollback": dict(rolled_back)}
    reconciled = await ledger.invocations.transition(
        invocation_id,
        from_statuses=from_statuses,
        to=outcome,
        event="reconciled",
        detail=detail,
        fields={
            "error_class": "upstream_error" if failed else None,
            "error_message": (note or (found.where if found else "reconciled as failed")) if failed else None,
        },
    )
    if reconciled is not None:
        return reconciled
    raise await _not_unresolved(ledger, invocation_id)


async def note_refused_check(
    ledger: Ledger, invocation_id: str, found: Found, *, principal: Principal, note: str | None
) -> Invocation:
    """Record a check whose evidence settles nothing (`found` not accepted): a `checked` event naming who (`by`),
    how (`check`), what was found (where, who made it and when) and why it is no proof (`reason`), the call left
    unknown or executing as it was. NotFound, or Conflict when the call is no longer unresolved."""
    current = await ledger.invocations.get(invocation_id)
    if current is None or current.status not in states.NOTE_CHECK.from_:
        raise await _not_unresolved(ledger, invocation_id)
    evidence = {"where": found.where, "creator": found.creator, "created_at": found.created_at}
    noted = await ledger.invocations.transition(
        invocation_id,
        from_statuses=(current.status,),
        to=current.status,
        event="checked",
        detail={"by": principal.name, "how": "check", "note": note, "found": evidence, "reason": found.reason},
    )
    if noted is None:  # settled (or recovered) since it was read
        raise await _not_unresolved(ledger, invocation_id)
    return noted


async def _not_unresolved(ledger: Ledger, invocation_id: str) -> NotFound | Conflict:
    """The error for a call that cannot be reconciled: there is none by that id, or it is settled (naming how)."""
    current = await ledger.invocations.get(invocation_id)
    if current is None:
        return NotFound(f"no invocation {invocation_id!r}", invocation_id=invocation_id)
    return Conflict(
        f"invocation {invocation_id} is {current.status}, not unknown or executing: only an unresolved call is "
        "reconciled",
        invocation_id=invocation_id,
    )


RollBack = Callable[[str, dict[str, Any], str], Awaitable[Mapping[str, Any]]]
"""Runs a plugin's rollback step: (action id, the call's arguments, its invocation id) -> the step's report."""


async def reconcile_by_rollback(
    ledger: Ledger, invocation_id: str, *, roll_back: RollBack, principal: Principal, note: str | None = None
) -> Invocation:
    """Undo a plugin call whose outcome is unknown (Bastion stopped while it ran) by running its package's rollback:
    an approver's decision, never taken by itself. The call must be a plugin's and `unknown` (Conflict otherwise),
    with arguments the ledger kept whole (InvalidArguments when they held secrets it does not keep). A rollback that
    succeeds records the call `failed` (its effect undone), the `reconciled` event holding the rollback's report; one
    that fails leaves the call unknown and raises UpstreamError with what it said."""
    _require_approver(principal, invocation_id)
    invocation_id = await resolve_invocation_id(ledger.invocations, invocation_id, principal)
    invocation = await ledger.invocations.get(invocation_id)
    if invocation is None:
        raise NotFound(f"no invocation {invocation_id!r}", invocation_id=invocation_id)
    if invocation.source_id != PLUGIN_SOURCE_ID:
        raise InvalidArguments(
            f"invocation {invocation_id} is a call of {invocation.policy_key}, not of a plugin: only a plugin "
            f"declares a rollback; record what came of it with `{bastion_command()} invocations reconcile`",
            invocation_id=invocation_id,
        )
    if invocation.status != "unknown":
        raise Conflict(
            f"invocation {invocation_id} is {invocation.status}: only a call whose outcome is unknown is rolled back",
            invocation_id=invocation_id,
        )
    arguments = invocation.args
    if not isinstance(arguments, dict) or not ledger.invocations.args_match(arguments, invocation.args_hash):
        raise InvalidArguments(
            f"the arguments of invocation {invocation_id} held secrets the ledger does not keep, so its rollback "
            "cannot be given them; undo it by hand, then `bastion invocations reconcile` it",
            invocation_id=invocation_id,
        )
    report = await roll_back(invocation.action_id, arguments, invocation_id)
    if not report.get("ok"):
        raise UpstreamError(
            f"the rollback of invocation {invocation_id} failed ({report.get('error')}); the call stays unknown: "
            f"check the workspace by hand. What the step said: {report.get('stderr') or 'nothing'}",
            invocation_id=invocation_id,
        )
    return await reconcile(ledger, invocation_id, outcome="failed", principal=principal, note=note, rolled_back=report)


async def reconcile_by_check(
    ledger: Ledger,
    invocation_id: str,
    *,
    source_of: SourceOf,
    principal: Principal,
    now: datetime,
    note: str | None = None,
    stale_after: timedelta = STALE_AFTER,
) -> Checked:
    """Ask the call's source what came of it (`bastion invocations reconcile ID --check`) and record it as
    `reconcile` does, the `reconciled` event saying it was found by check and what. The call must be unknown, or
    executing and not updated for `stale_after` (Conflict otherwise), and its action must declare
    `reconcile = "lookup"` (InvalidArguments otherwise, naming the fix: by hand). Nothing found that the source
    can be sure of leaves the call as it is (`found` None), and so does "nothing was made" for a call updated within
    `stale_after`. So does what carries the call's mark but is no proof the call made it (`found` not accepted:
    its reason says why); it is logged, recorded as a `checked` event (`note_refused_check`), and answered for the
    approver to judge. The source's errors (unavailable, rate limited...) leave it too."""
    _require_approver(principal, invocation_id)
    invocation_id = await resolve_invocation_id(ledger.invocations, invocation_id, principal)
    invocation = await ledger.invocations.get(invocation_id)
    if invocation is None:
        raise NotFound(f"no invocation {invocation_id!r}", invocation_id=invocation_id)
    fresh = invocation.status == "executing" and invocation.updated_at > now - stale_after
    if invocation.status not in RECONCILABLE or fresh:
        what = "still executing (updated recently)" if fresh else invocation.status
        raise Conflict(
            f"invocation {invocation_id} is {what}: only an unknown call, or one executing for more than "
            f"{stale_after.total_seconds():g} s, is reconciled by check",
            invocation_id=invocation_id,
        )
    source = source_of(invocation.source_id)
    by_hand = "look in the downstream yourself and settle it by hand with --outcome completed|failed"
    spec = next((s for s in source.actions() if s.action_id == invocation.action_id), None) if source else None
    if source is not None and spec is None:
        state = source.status.state + (f": {source.status.last_error}" if source.status.last_error else "")
        raise ConnectorUnavailable(
            f"source {invocation.source_id} is {state} and lists no {invocation.action_id}; retry once it is ready, "
            f"or {by_hand}",
            invocation_id=invocation_id,
        )
    asked: object = source  # a source is a LookupSource besides (mypy cannot intersect the two protocols)
    if spec is None or spec.reconcile != "lookup" or not isinstance(asked, LookupSource):
        raise InvalidArguments(
            f"{invocation.policy_key} cannot be checked: its source offers no look-up of its calls "
            f"(only provider actions that mark what they make can); {by_hand}",
            invocation_id=invocation_id,
        )
    found = await asked.look_up(invocation.action_id, invocation)
    if found is None or (found.outcome == "failed" and invocation.updated_at > now - stale_after):
        # Nothing made is certain only once the call has been left alone long enough: a request that timed out
        # a moment ago may still be applied by the downstream.
        return Checked(invocation, None)
    if not found.accepted:
        logger.warning(
            "invocation %s (%s): %s carries its mark but is not accepted as what it made: %s; left %s",
            invocation_id,
            invocation.policy_key,
            found.where,
            found.reason,
            invocation.status,
        )
        noted = await note_refused_check(ledger, invocation_id, found, principal=principal, note=note)
        return Checked(noted, found)
    settled = await reconcile(
        ledger,
        invocation_id,
        outcome=found.outcome,
        principal=principal,
        note=note,
        found=found,
        from_statuses=(invocation.status,),
    )
    return Checked(settled, found)


async def unresolved(ledger: Ledger, *, stale_after: timedelta, now: datetime, limit: int = 100) -> list[Invocation]:
    """The calls whose outcome is not known: every `unknown` one and
    every `executing` one not updated for `stale_after`, oldest first."""
    unknown = await ledger.invocations.list(status="unknown", limit=limit)
    executing = await ledger.invocations.list(status="executing", limit=limit)
    stale = [i for i in executing if i.updated_at <= now - stale_after]
    return sorted(unknown + stale, key=lambda i: (i.updated_at, i.id))[:limit]
