"""Every kind of tampering with the stored ledger is noticed by `verify`: by a naive tamperer from the store alone;
by one who recomputes every hash, from a signed anchor of the head taken before (and, for a checkpoint, from its
missing signature). Both on every backend."""

from __future__ import annotations

from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bastion.ledger import OpenLedger
from bastion.ledger.anchors import Anchor, public_text, sign, sign_anchor
from bastion.ledger.verify import verify_signed
from bastion.models import AuditReport
from tests.ledger_contract.samples import T0, add_pending, make_invocation
from tests.ledger_contract.tampering import KINDS, recompute, store_of

pytestmark = pytest.mark.anyio

SIGNING_KEY = Ed25519PrivateKey.generate()
TRUSTED = (public_text(SIGNING_KEY),)


async def _history(ledger: OpenLedger) -> Anchor:
    """Two completed calls and a pending one (its parent the first), then a signed anchor of the head."""
    for number in (1, 2):
        invocation = make_invocation(number, status="approved", mode="allow", principal="alice")
        await ledger.invocations.record(invocation, ["planned", "approved"])
        await ledger.invocations.claim(invocation.id, owner="instance-a")
        await ledger.invocations.finish(invocation.id, "completed", result={"ok": number})
    await add_pending(ledger, 3)
    report = await ledger.audit.verify()
    assert report.broken is None and report.records == 3
    assert report.head_position is not None and report.head_hash is not None
    return sign_anchor(SIGNING_KEY, report.head_position, report.head_hash, T0)


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_naive_tampering_breaks_the_chain(ledger: OpenLedger, kind: str) -> None:
    await _history(ledger)
    async with store_of(ledger) as store:
        await KINDS[kind](store)
    report = await ledger.audit.verify()
    assert report.broken is not None, f"{kind} went unnoticed"


@pytest.mark.parametrize("kind", sorted(set(KINDS) - {"insert_record"}))
async def test_a_tampering_with_every_hash_recomputed_breaks_at_the_signed_anchor(
    ledger: OpenLedger, kind: str
) -> None:
    anchor = await _history(ledger)
    async with store_of(ledger) as store:
        await KINDS[kind](store)
        await recompute(store)
    # The store alone agrees with itself again: the tamperer rebuilt it (a checkpoint they made hides what is before).
    alone = await ledger.audit.verify()
    assert alone.broken is None, alone.broken
    report = await verify_signed(ledger.audit, [anchor], TRUSTED)
    assert report.broken is not None, f"{kind} went unnoticed"
    assert report.broken.reason in ("anchor", "checkpoint")


async def test_a_record_forged_after_the_last_anchor_is_only_as_good_as_the_store(ledger: OpenLedger) -> None:
    """The limit of anchors, stated: a record whose events a recomputing tamperer appends after the newest anchor
    reads as a call made since; only the next anchor, once signed, fixes the history up to it."""
    anchor = await _history(ledger)
    async with store_of(ledger) as store:
        await KINDS["insert_record"](store)
        await recompute(store)
    assert (await verify_signed(ledger.audit, [anchor], TRUSTED)).broken is None


async def test_an_untouched_ledger_holds_its_anchors_and_its_signed_checkpoint(ledger: OpenLedger) -> None:
    first = await _history(ledger)
    report = await verify_signed(ledger.audit, [first], TRUSTED)
    assert (report.broken, report.anchors, report.records, report.trusted_keys) == (None, 1, 3, 1)
    pruned = await ledger.audit.prune(
        T0 + timedelta(days=3650), now=T0, sign=lambda *signed: sign(SIGNING_KEY, "checkpoint", *signed)
    )
    assert pruned.checkpoint is not None and pruned.checkpoint.signature is not None
    later = await _more(ledger)
    report = await verify_signed(ledger.audit, [first, later], TRUSTED)
    assert report.broken is None
    assert report.anchors == 2  # a prune keeps the newest event: the first anchor's position is still held


async def test_a_checkpoint_not_signed_by_a_trusted_key_breaks_it(ledger: OpenLedger) -> None:
    await _history(ledger)
    other = Ed25519PrivateKey.generate()
    await ledger.audit.prune(T0 + timedelta(days=3650), now=T0, sign=lambda *signed: sign(other, "checkpoint", *signed))
    report = await verify_signed(ledger.audit, [], TRUSTED)
    assert report.broken is not None and report.broken.reason == "checkpoint"
    assert "not a trusted key" in report.broken.message
    # Trusting that key too, it holds.
    assert (await verify_signed(ledger.audit, [], (*TRUSTED, public_text(other)))).broken is None


async def test_an_anchor_with_a_forged_signature_breaks_it_before_the_chain_is_read(ledger: OpenLedger) -> None:
    anchor = await _history(ledger)
    forged = anchor.model_copy(update={"hash": "f" * 64})
    report = await verify_signed(ledger.audit, [forged], TRUSTED)
    assert report.broken is not None and report.broken.reason == "anchor"
    assert "forged or changed" in report.broken.message


async def _more(ledger: OpenLedger) -> Anchor:
    invocation = make_invocation(4, status="approved", mode="allow")
    await ledger.invocations.record(invocation, ["planned", "approved"])
    report: AuditReport = await ledger.audit.verify()
    assert report.head_position is not None and report.head_hash is not None
    return sign_anchor(SIGNING_KEY, report.head_position, report.head_hash, T0)
