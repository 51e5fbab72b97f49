"""Who may do what (DESIGN.md §6, §10): only approvers decide or re-pin, and nobody decides their own call.

Every way of deciding — the REST API, the local CLI, a remote CLI — goes through these functions.
"""

from __future__ import annotations

from datetime import datetime

from bastion.errors import Forbidden, NotFound
from bastion.models import Invocation, Pin, Principal
from bastion.pipeline.seams import Ledger


def local_owner(name: str) -> Principal:
    """Whoever can write the ledger file is its owner; the CLI acts as `local:<login name>`."""
    return Principal(name=name, role="owner")


def may_see(principal: Principal, invocation: Invocation) -> bool:
    """Approvers see every invocation; an agent sees only the ones it made."""
    return principal.may_decide or invocation.principal == principal.name


async def visible_invocation(ledger: Ledger, principal: Principal, invocation_id: str) -> Invocation:
    """The invocation if this principal may see it; NotFound otherwise (never revealing which)."""
    invocation = await ledger.invocations.get(invocation_id)
    if invocation is None or not may_see(principal, invocation):
        raise NotFound(f"no invocation {invocation_id!r}", invocation_id=invocation_id)
    return invocation


async def decide(
    ledger: Ledger, invocation_id: str, *, approve: bool, principal: Principal, note: str | None, now: datetime
) -> Invocation:
    """An approver's decision, refused for agents and for the principal that made the call."""
    if not principal.may_decide:
        raise Forbidden(
            f"{principal.name} has the {principal.role} role; only owner and admin tokens may decide",
            invocation_id=invocation_id,
        )
    invocation = await ledger.invocations.get(invocation_id)
    if invocation is None:
        raise NotFound(f"no invocation {invocation_id!r}", invocation_id=invocation_id)
    if invocation.principal is not None and invocation.principal == principal.name:
        raise Forbidden(
            f"{principal.name} made this call and may not decide it; ask another approver",
            invocation_id=invocation_id,
        )
    return await ledger.invocations.decide(invocation_id, approve=approve, principal=principal.name, note=note, now=now)


async def accept_pins(ledger: Ledger, *, principal: Principal, source_id: str, action_id: str | None) -> list[Pin]:
    """Re-pin drifted definitions: approvers only."""
    if not principal.may_decide:
        raise Forbidden(f"{principal.name} has the {principal.role} role; only owner and admin tokens may re-pin")
    return await ledger.pins.accept_drift(source_id=source_id, action_id=action_id, principal=principal.name)
