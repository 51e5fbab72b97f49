"""Signed decisions: an approver's decision on a held call, and the grant it leaves, signed with the ledger's signing
key (bastion.ledger.anchors) in the event that records it, so someone who can write the database cannot make a call
look approved, nor widen a grant, without the key.

A decision's signature covers, as one JSON array: the invocation, the decision, who decided, the keyed hash of the
call's arguments, the fingerprint of the action's pinned definition, the scope, the time, the grant it leaves
(its id, action, scope, session, principal, condition and expiry), for a call that needs more than one approver how
many it needs, and the digest of the preview the approver was shown (the `preview` of the call's `pending` event,
when it has one: so verify tells which preview an approval was made on, and a preview changed after it breaks it).
Each approval of a call that needs several approvers is an event of its own (`approval_recorded`, then `approved` for
the last one), signed the same way. `verify_decisions` checks that every approval of a held call carries a valid
signature by a trusted key over the row it approved and the grant row it made, that a call its `pending` event says
needs several approvers carries that many signed approvals by distinct approvers, and that every call a grant let
through is one the grant covers: its action, its session or caller, inside its lifetime.
Decisions recorded before decisions were signed (their event from before records were chained) are counted, not
checked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bastion.ledger.anchors import public_text, signature_of, verify_signature
from bastion.ledger.chain import PAGE, stored_time
from bastion.models import APPROVERS, AuditReport, ChainBreak, Grant

SIGNED: Final = "signed"
"""The key of a decision event's detail that holds its signature: {"key": public key, "signature": base64}."""

GRANT_SOURCE: Final = "grant:"
"""The mode source of a call a grant let through: `grant:<id>`."""

PREVIEW: Final = "preview"
"""The key of a `pending` event's detail that holds the call's preview (bastion.models.Preview, as stored), and of a
decision event's detail that holds that preview's digest."""


def preview_digest(pending_detail: Mapping[str, Any] | str | None) -> str | None:
    """The digest of the preview a `pending` event's detail (a mapping, or JSON text as stored) carries: SHA-256 of
    its canonical JSON (sorted keys, no whitespace), so a backend's way of storing it does not matter; None when the
    call was held without one."""
    if isinstance(pending_detail, str):
        try:
            pending_detail = json.loads(pending_detail)
        except ValueError:
            return None
    if not isinstance(pending_detail, Mapping) or pending_detail.get(PREVIEW) is None:
        return None
    canonical = json.dumps(pending_detail[PREVIEW], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def decision_text(
    invocation_id: str,
    decision: str,
    by: str | None,
    args_hash: str,
    fingerprint: str | None,
    scope: str,
    at: datetime,
    grant: Grant | None,
    approvers: int = 1,
    preview: str | None = None,
) -> bytes:
    """The exact bytes a decision's signature covers. `approvers`: how many the call needs; covered when more than
    one, so lowering the requirement its `pending` event records breaks the signatures of its approvals. `preview`:
    the digest of the preview shown, if any (a decision on a call held without one signs the same bytes as before
    previews existed)."""
    fields: list[Any] = ["bastion decision v1", invocation_id, decision, by, args_hash, fingerprint, scope]
    fields.append(stored_time(at))
    if grant is not None:
        expires = stored_time(grant.expires_at) if grant.expires_at is not None else None
        fields += [grant.id, grant.policy_key, grant.scope, grant.session_id, grant.principal, grant.rule, expires]
    if approvers > 1:
        fields += [APPROVERS, approvers]
    if preview is not None:
        fields += [PREVIEW, preview]
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


def required_approvers(pending_detail: str | None) -> int:
    """How many distinct approvers a held call needs, as its `pending` event's detail (JSON text) records it: one
    unless it says more."""
    try:
        detail = json.loads(pending_detail or "{}")
    except ValueError:
        return 1
    count = detail.get(APPROVERS) if isinstance(detail, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 1 else 1


def sign_decision(key: Ed25519PrivateKey, text: bytes) -> dict[str, str]:
    """What a decision event's detail carries under `SIGNED`."""
    return {"key": public_text(key), "signature": signature_of(key, text)}


class EarlierApproval(NamedTuple):
    """An approval recorded before the one that approved a call needing several (its `approval_recorded` event)."""

    detail: str
    at: datetime
    chained: bool


class HeldDecision(NamedTuple):
    """The approval of a held call, as a verification reads it."""

    invocation_id: str
    args_hash: str
    fingerprint: str | None
    detail: str
    """The approved event's detail as stored (JSON text)."""
    at: datetime
    chained: bool
    """Its event was recorded since records were chained (it carries a state): it must be signed."""
    grant: Grant | None
    """The grant row its detail names, as stored now."""
    required: int = 1
    """How many distinct approvers its `pending` event says the call needs."""
    earlier: tuple[EarlierApproval, ...] = ()
    """The approvals recorded before this one (a call needing several), oldest first."""
    held_detail: str | None = None
    """The detail of the call's `pending` event as stored (JSON text): the preview the approver was shown."""
    held_position: int | None = None
    """That event's chain position: a signed scrub (bastion.ledger.scrubbing) may have changed its preview."""


class GrantUse(NamedTuple):
    """A call a grant let through (mode source `grant:<id>`), with that grant as stored now."""

    invocation_id: str
    policy_key: str
    session_id: str
    principal: str | None
    created_at: datetime
    grant_id: str
    grant: Grant | None


ReadDecisions = Callable[[str, int], Awaitable[Sequence[HeldDecision]]]
"""Given (after invocation id, limit): the approvals of held calls with a greater invocation id, in id order."""

ReadGrantUses = Callable[[str, int], Awaitable[Sequence[GrantUse]]]
"""Given (after invocation id, limit): the calls grants let through with a greater invocation id, in id order."""


async def verify_decisions(
    report: AuditReport,
    read_decisions: ReadDecisions,
    read_uses: ReadGrantUses,
    trusted: Collection[str],
    scrubbed: Collection[int] = (),
) -> AuditReport:
    """After a chain and records that hold, check every approval of a held call (with keys to trust) and every use of
    a grant (see the module docstring); the first that does not hold breaks the report (reason `decision` or
    `grant`). `scrubbed`: the positions of events a signed scrub changed; the preview of a call whose `pending` event
    is one of them is taken as the digest its approvals recorded (the scrub vouches for the change)."""
    if report.broken is not None:
        return report
    signed = unsigned = uses = 0

    def done(broken: ChainBreak | None) -> AuditReport:
        counts = {"decisions": signed, "decisions_unsigned": unsigned, "grant_uses": uses}
        return report.model_copy(update=counts | {"broken": broken})

    after = ""
    while trusted:  # without a key to trust, approvals are not checked (`decisions` stays 0)
        page = await read_decisions(after, PAGE)
        for held in page:
            if not held.chained:
                unsigned += 1
                continue
            fault = _decision_fault(held, trusted, held.held_position in scrubbed)
            if fault is not None:
                return done(_break("decision", held.invocation_id, f"the approval of {held.invocation_id} {fault}"))
            signed += 1
        if len(page) < PAGE:
            break
        after = page[-1].invocation_id
    after = ""
    while True:
        used = await read_uses(after, PAGE)
        for use in used:
            fault = _use_fault(use)
            if fault is not None:
                return done(_break("grant", use.invocation_id, f"{use.invocation_id} ran under {fault}"))
            uses += 1
        if len(used) < PAGE:
            break
        after = used[-1].invocation_id
    return done(None)


def _decision_fault(held: HeldDecision, trusted: Collection[str], scrubbed: bool) -> str | None:
    fault = _approval_fault(held, "approved", held.detail, held.at, trusted, scrubbed)
    if fault is not None or held.required == 1:
        return fault
    by: list[str] = []
    for number, earlier in enumerate(held.earlier, start=1):
        if not earlier.chained:
            return f"needs {held.required} approvers, and its approval {number} was recorded outside the chain"
        fault = _approval_fault(held, "approval_recorded", earlier.detail, earlier.at, trusted, scrubbed)
        if fault is not None:
            return f"(its approval {number}) {fault}"
        by.append(str(json.loads(earlier.detail).get("by")))
    by.append(str(json.loads(held.detail).get("by")))
    distinct = sorted(set(by))
    if len(distinct) < held.required:
        return (
            f"needs {held.required} distinct approvers, and carries signed approvals by {', '.join(distinct)} only: "
            "an approval was forged or copied"
        )
    return None


def _approval_fault(
    held: HeldDecision, kind: str, stored: str, at: datetime, trusted: Collection[str], scrubbed: bool = False
) -> str | None:
    """What is wrong with one signed approval (`kind`: its event's) of the held call, if anything. `scrubbed`: the
    call's `pending` event was changed by a signed scrub: the preview's digest is the one the approval recorded."""
    try:
        detail = json.loads(stored)
    except ValueError:
        detail = None
    if not isinstance(detail, dict) or not isinstance(detail.get(SIGNED), dict):
        return "is not signed: it was not made by an approver through Bastion"
    grant_id = detail.get("grant")
    if grant_id is not None and (held.grant is None or held.grant.id != grant_id):
        return f"names the grant {grant_id}, which is not in the ledger"
    scope = str(detail.get("scope", "once"))
    text = decision_text(
        held.invocation_id,
        kind,
        detail.get("by"),
        held.args_hash,
        held.fingerprint,
        scope,
        at,
        held.grant if grant_id is not None else None,
        held.required,
        detail.get(PREVIEW) if scrubbed else preview_digest(held.held_detail),
    )
    signature = detail[SIGNED]
    fault = verify_signature(text, signature.get("key"), signature.get("signature"), trusted)
    if fault is None:
        return None
    return (
        f"does not hold: {fault} (its call's arguments, pinned definition, preview, grant or number of approvers "
        "needed were changed, or it was forged)"
    )


def _use_fault(use: GrantUse) -> str | None:
    grant = use.grant
    if grant is None:
        return f"the grant {use.grant_id}, which is not in the ledger"
    if grant.policy_key != use.policy_key:
        return f"the grant {grant.id}, which is for {grant.policy_key}, not {use.policy_key}"
    if not grant.covers(session_id=use.session_id, principal=use.principal):
        return f"the {grant.scope} grant {grant.id}, which covers another session or caller"
    if use.created_at < grant.created_at:
        return f"the grant {grant.id} before it was made"
    ended = min((t for t in (grant.expires_at, grant.revoked_at) if t is not None), default=None)
    if ended is not None and use.created_at >= ended:
        return f"the grant {grant.id} after it ended ({stored_time(ended)})"
    return None


def _break(reason: Literal["decision", "grant"], invocation_id: str, message: str) -> ChainBreak:
    return ChainBreak(event_id=0, position=0, reason=reason, invocation_id=invocation_id, message=message)


def granted(detail: str) -> str | None:
    """The grant a decision event's detail names, if any (None for a detail that is not a JSON object)."""
    try:
        parsed = json.loads(detail)
    except ValueError:
        return None
    grant_id = parsed.get("grant") if isinstance(parsed, dict) else None
    return grant_id if isinstance(grant_id, str) else None
