"""Scrubbing a leaked secret: every stored form of it goes, from rows, event details and the outbox, and `verify`
still holds by the scrub's signature; an edit that is no signed scrub still breaks it. Both on every backend."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bastion.ledger import OpenLedger, scrubbing
from bastion.ledger.anchors import load_or_create_signing_key, public_text, signing_key_path_for, trusted_keys
from bastion.ledger.offline import _parsed, export_line, verify_export
from bastion.ledger.verify import verify_signed
from bastion.models import AuditReport
from tests.ledger_contract.samples import BEFORE_EXPIRY, EXPIRY, make_invocation
from tests.ledger_contract.tampering import store_of

pytestmark = pytest.mark.anyio

LEAKED = 'correct-horse "battery" staple-42'
"""A secret the redactor does not know (it has no token's shape), with a character JSON escapes."""


async def _leaked(ledger: OpenLedger) -> None:
    """Two calls that stored the secret: in the arguments, an event's detail and the error; a third that did not."""
    first = make_invocation(1, status="executing", mode="allow", expires_at=None, args={"note": LEAKED})
    await ledger.invocations.record(first, ["planned", "executing"], {"note": f"sent {LEAKED}"})
    await ledger.invocations.finish(first.id, "failed", error_class="upstream_error", error_message=f"bad: {LEAKED}")
    second = make_invocation(2, status="executing", mode="allow", expires_at=None)
    await ledger.invocations.record(second, ["planned", "executing"], {"echo": LEAKED})
    await ledger.invocations.finish(second.id, "completed", result={"ok": 1})
    clean = make_invocation(3, status="executing", mode="allow", expires_at=None)
    await ledger.invocations.record(clean, ["planned", "executing"])


async def _scrubbed(ledger: OpenLedger) -> scrubbing.Scrub:
    key = load_or_create_signing_key(signing_key_path_for(ledger.key_path))
    scrub = scrubbing.Scrub(scrubbing.forms(LEAKED), "alice", key)
    report = await ledger.audit.scrub(scrub)
    assert (report.invocations, report.events) == (2, 2)
    return scrub


async def _verified(ledger: OpenLedger) -> AuditReport:
    return await verify_signed(ledger.audit, [], trusted_keys(ledger.key_path, []))


async def _exported(ledger: OpenLedger) -> str:
    return "\n".join(
        json.dumps(export_line(exported), ensure_ascii=False) for exported in await ledger.audit.export(0, 1000)
    )


async def test_a_scrub_removes_every_stored_form_and_verify_holds_by_its_signature(ledger: OpenLedger) -> None:
    await _leaked(ledger)
    assert "battery" in await _exported(ledger)
    await _scrubbed(ledger)
    exported = await _exported(ledger)
    assert "battery" not in exported
    assert scrubbing.SCRUBBED in exported
    report = await _verified(ledger)
    assert report.broken is None, report.broken
    assert report.scrubbed == 2
    first = await ledger.invocations.get("inv-0001")
    assert first is not None
    assert (first.args, first.status, first.error_message) == (
        {"note": scrubbing.SCRUBBED},
        "failed",
        f"bad: {scrubbing.SCRUBBED}",
    )
    kinds = [event.kind for event in await ledger.invocations.events("inv-0001")]
    assert kinds == ["planned", "executing", "failed", "scrubbed"]


async def test_the_offline_verifier_accepts_a_signed_scrub(ledger: OpenLedger) -> None:
    await _leaked(ledger)
    scrub = await _scrubbed(ledger)
    lines = [_parsed(number, text) for number, text in enumerate((await _exported(ledger)).splitlines(), start=1)]
    public = public_text(scrub.key)
    assert (await verify_export(lines, [], [public])).broken is None
    unkeyed = await verify_export(lines, [], [])
    assert unkeyed.broken is not None and unkeyed.broken.reason == "hash"


async def test_without_its_key_a_scrub_does_not_hold(ledger: OpenLedger) -> None:
    await _leaked(ledger)
    await _scrubbed(ledger)
    report = await verify_signed(ledger.audit, [], [])
    assert report.broken is not None and report.broken.reason == "hash"
    assert "not a trusted key" in report.broken.message or "not signed" in report.broken.message


async def test_a_scrub_signed_by_another_key_breaks_verify(ledger: OpenLedger) -> None:
    """Someone who appends a well-chained `scrubbed` event to pass off their edits, signed with a key of their own."""
    await _leaked(ledger)
    load_or_create_signing_key(signing_key_path_for(ledger.key_path))
    theirs = Ed25519PrivateKey.generate()
    await ledger.audit.scrub(scrubbing.Scrub(scrubbing.forms(LEAKED), "mallory", theirs))
    report = await _verified(ledger)
    assert report.broken is not None and report.broken.reason == "hash"
    assert "not a trusted key" in report.broken.message


async def test_a_detail_edited_without_a_scrub_still_breaks_verify(ledger: OpenLedger) -> None:
    await _leaked(ledger)
    await _scrubbed(ledger)
    async with store_of(ledger) as store:
        await store.run("UPDATE events SET detail = '{\"echo\":\"rewritten\"}' WHERE invocation_id = 'inv-0003'")
    report = await _verified(ledger)
    assert report.broken is not None and report.broken.reason == "hash"


async def test_a_scrubbed_preview_keeps_the_approval_made_on_it(ledger: OpenLedger) -> None:
    """A secret in the diff an approver was shown: the scrub changes the held call's preview, and the approval, which
    signed the preview's digest, still holds by the scrub's signature."""
    load_or_create_signing_key(signing_key_path_for(ledger.key_path))
    held = make_invocation(4, status="pending", expires_at=EXPIRY)
    preview = {"kind": "diff", "summary": "write /tmp/x", "text": f"+motto: {LEAKED}"}
    await ledger.invocations.record(held, ["planned", "pending"], {"preview": preview})
    await ledger.invocations.decide(held.id, approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    assert (await _verified(ledger)).decisions == 1
    await _scrubbed_once(ledger)
    report = await _verified(ledger)
    assert report.broken is None, report.broken
    assert (report.decisions, report.scrubbed) == (1, 1)
    assert "battery" not in await _exported(ledger)
    lines = [_parsed(number, text) for number, text in enumerate((await _exported(ledger)).splitlines(), start=1)]
    offline = await verify_export(lines, [], trusted_keys(ledger.key_path, []))
    assert offline.broken is None, offline.broken


async def _scrubbed_once(ledger: OpenLedger) -> None:
    key = load_or_create_signing_key(signing_key_path_for(ledger.key_path))
    report = await ledger.audit.scrub(scrubbing.Scrub(scrubbing.forms(LEAKED), "alice", key))
    assert (report.invocations, report.events) == (1, 1)
