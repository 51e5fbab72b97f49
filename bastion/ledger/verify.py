"""`bastion audit verify` over one ledger: the chain and its records (bastion.ledger.chain), the signed anchors and
checkpoint (bastion.ledger.anchors), the signed decisions and the grants' uses (bastion.ledger.decisions)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Literal, Protocol

from bastion.ledger.anchors import Anchor, signature_fault
from bastion.ledger.decisions import GrantUse, HeldDecision, verify_decisions
from bastion.ledger.scrubbing import accepted
from bastion.models import AuditCheckpoint, AuditReport, ChainBreak


class Audit(Protocol):
    """What a verification reads of a ledger's audit (`SqliteAudit`, `PostgresAudit`)."""

    async def checkpoint(self) -> AuditCheckpoint | None: ...

    async def verify(
        self, anchored: Mapping[int, str] = ..., scrubbed: Mapping[int, tuple[int, str, str]] = ...
    ) -> AuditReport: ...

    async def scrubs(self) -> list[str]: ...

    async def decisions(self, after: str, limit: int) -> list[HeldDecision]: ...

    async def grant_uses(self, after: str, limit: int) -> list[GrantUse]: ...


async def verify_signed(audit: Audit, anchors: Sequence[Anchor], trusted: Collection[str]) -> AuditReport:
    """Verify the ledger's chain and records against signed `anchors`, its checkpoint's signature, the signatures of
    the approvals of held calls and the scope of every grant's use, trusting the public keys `trusted` (none: only the
    store's own consistency is checked, grants' scopes included). The first anchor or checkpoint whose signature does
    not hold breaks it before the chain is read."""
    anchored: dict[int, str] = {}
    for number, anchor in enumerate(anchors, start=1):
        fault = signature_fault(
            "anchor", anchor.position, anchor.hash, anchor.at, anchor.key, anchor.signature, trusted
        )
        if fault is None and anchored.get(anchor.position, anchor.hash) != anchor.hash:
            fault = "another anchor signed a different hash at that position: two histories were signed"
        if fault is not None:
            return _broken(
                "anchor", anchor.position, f"anchor {number} (position {anchor.position}) does not hold: {fault}"
            )
        anchored[anchor.position] = anchor.hash
    checkpoint = await audit.checkpoint()
    if checkpoint is not None and trusted:
        fault = signature_fault(
            "checkpoint",
            checkpoint.position,
            checkpoint.hash,
            checkpoint.at,
            checkpoint.key,
            checkpoint.signature,
            trusted,
        )
        if fault is not None:
            return _broken(
                "checkpoint",
                checkpoint.position,
                f"the checkpoint at position {checkpoint.position} does not hold: {fault}; a checkpoint no prune "
                "signed may hide the events before it",
            )
    scrubbed, faults = accepted(await audit.scrubs(), trusted)
    report = await audit.verify(anchored, scrubbed)
    if report.broken is not None and report.broken.reason == "hash" and faults:
        broken = report.broken.model_copy(update={"message": f"{report.broken.message} ({'; '.join(faults)})"})
        report = report.model_copy(update={"broken": broken})
    report = await verify_decisions(report, audit.decisions, audit.grant_uses, trusted, scrubbed.keys())
    return report.model_copy(update={"trusted_keys": len(trusted)})


def _broken(reason: Literal["anchor", "checkpoint"], position: int, message: str) -> AuditReport:
    return AuditReport(verified=0, broken=ChainBreak(event_id=0, position=position, reason=reason, message=message))
