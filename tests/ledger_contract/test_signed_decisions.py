"""Decisions signed: every approval of a held call carries a signature over what it approved and the grant it left;
verify finds an approval forged in the store, an approval whose call or grant was changed after it, a call let
through by a grant that does not cover it, and a call needing two approvers that lacks two signed approvals by
distinct approvers, even with every hash recomputed. Both on every backend."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bastion.ledger import OpenLedger
from bastion.ledger.anchors import load_or_create_signing_key, signing_key_path_for, trusted_keys
from bastion.ledger.decisions import preview_digest
from bastion.ledger.verify import verify_signed
from bastion.models import AuditReport, Principal
from bastion.pipeline.authority import decide
from tests.ledger_contract.samples import BEFORE_EXPIRY, EXPIRY, T0, add_pending, make_invocation
from tests.ledger_contract.tampering import Store, insert_event_row, recompute, store_of
from tests.ledger_contract.test_grants import make_grant

pytestmark = pytest.mark.anyio


async def _verified(ledger: OpenLedger) -> AuditReport:
    """`bastion audit verify` where the ledger's signing key is (made by `bastion audit key` if no decision made it)."""
    load_or_create_signing_key(signing_key_path_for(ledger.key_path))
    return await verify_signed(ledger.audit, [], trusted_keys(ledger.key_path, []))


async def _tampered(ledger: OpenLedger, *statements: tuple[str, tuple[object, ...]]) -> AuditReport:
    """The report after `statements`, with every hash recomputed: the store alone agrees with itself again."""
    async with store_of(ledger) as store:
        for sql, params in statements:
            await store.run(sql, params)
        await recompute(store)
    assert (await ledger.audit.verify()).broken is None
    return await _verified(ledger)


async def _approved_with_grant(ledger: OpenLedger) -> None:
    """inv-0001 held and approved for the session, and inv-0002 let through by that grant."""
    held = await add_pending(ledger, 1)
    grant = make_grant(scope="session", session_id="session-a", expires_at=None)
    await ledger.invocations.decide(held, approve=True, principal="alice", note=None, now=BEFORE_EXPIRY, grant=grant)
    later = make_invocation(2, status="approved", mode="allow", mode_source=f"grant:{grant.id}")
    await ledger.invocations.record(later.model_copy(update={"created_at": BEFORE_EXPIRY}), ["planned", "approved"])


PREVIEW: dict[str, Any] = {
    "kind": "diff",
    "summary": "write /srv/notes.txt: 1 line added, 1 removed",
    "text": "--- /srv/notes.txt\n+++ /srv/notes.txt\n@@ -1 +1 @@\n-old\n+new\n",
}


async def held_with_preview(ledger: OpenLedger, number: int = 1) -> str:
    """A pending invocation whose `pending` event carries a preview, as a held call's does; its id."""
    invocation = make_invocation(number, expires_at=EXPIRY)
    await ledger.invocations.record(invocation, ["planned", "pending"], {"expires_at": str(EXPIRY), "preview": PREVIEW})
    return invocation.id


async def test_an_approval_signs_the_digest_of_the_preview_it_was_made_on(ledger: OpenLedger) -> None:
    held = await held_with_preview(ledger)
    await ledger.invocations.decide(held, approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    pending, approved = [e for e in await ledger.invocations.events(held) if e.kind in ("pending", "approved")]
    assert pending.detail["preview"] == PREVIEW
    assert approved.detail["preview"] == preview_digest(pending.detail) is not None
    report = await _verified(ledger)
    assert report.broken is None
    assert report.decisions == 1


async def test_a_preview_changed_after_its_approval_breaks_the_signature(ledger: OpenLedger) -> None:
    held = await held_with_preview(ledger)
    await ledger.invocations.decide(held, approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    shown = {"expires_at": str(EXPIRY), "preview": PREVIEW | {"text": "--- a\n+++ b\n+harmless\n"}}
    sql = "UPDATE events SET detail = ? WHERE invocation_id = ? AND kind = 'pending'"
    report = await _tampered(ledger, (sql, (json.dumps(shown), held)))
    assert report.broken is not None and report.broken.reason == "decision"
    assert report.broken.invocation_id == held


async def test_a_preview_removed_after_its_approval_breaks_the_signature(ledger: OpenLedger) -> None:
    held = await held_with_preview(ledger)
    await ledger.invocations.decide(held, approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    sql = "UPDATE events SET detail = ? WHERE invocation_id = ? AND kind = 'pending'"
    report = await _tampered(ledger, (sql, (json.dumps({"expires_at": str(EXPIRY)}), held)))
    assert report.broken is not None and report.broken.reason == "decision"


async def test_an_approval_is_signed_and_the_grant_it_leaves_covers_its_uses(ledger: OpenLedger) -> None:
    await _approved_with_grant(ledger)
    await add_pending(ledger, 3)
    await ledger.invocations.decide("inv-0003", approve=False, principal="bob", note="no", now=BEFORE_EXPIRY)
    report = await _verified(ledger)
    assert report.broken is None
    assert (report.decisions, report.decisions_unsigned, report.grant_uses) == (1, 0, 1)
    denied = (await ledger.invocations.events("inv-0003"))[-1]
    assert denied.detail["signed"]["key"] == trusted_keys(ledger.key_path, [])[0]


async def test_an_approval_forged_in_the_store_is_not_signed(ledger: OpenLedger) -> None:
    held = await add_pending(ledger, 1)
    async with store_of(ledger) as store:
        await _approve_behind_the_back(store, held)
        await recompute(store)
    assert (await ledger.audit.verify()).broken is None
    report = await _verified(ledger)
    assert report.broken is not None and report.broken.reason == "decision"
    assert "is not signed" in report.broken.message


async def test_an_approved_call_whose_arguments_were_swapped_breaks_its_signature(ledger: OpenLedger) -> None:
    held = await add_pending(ledger, 1)
    await ledger.invocations.decide(held, approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    report = await _tampered(ledger, ("UPDATE invocations SET args_hash = ? WHERE id = ?", ("f" * 64, held)))
    assert report.broken is not None and report.broken.reason == "decision"
    assert "forged or changed" in report.broken.message


@pytest.mark.parametrize(
    ("column", "value"),
    [("scope", "always"), ("session_id", "session-b"), ("expires_at", "2099-01-01T00:00:00.000000+00:00")],
)
async def test_a_grant_widened_in_the_store_breaks_the_signature_of_the_approval_that_made_it(
    ledger: OpenLedger, column: str, value: str
) -> None:
    await _approved_with_grant(ledger)
    report = await _tampered(ledger, (f"UPDATE grants SET {column} = ?", (value,)))
    assert report.broken is not None and report.broken.reason == "decision"


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("policy_key", "fs:delete_file", "which is for fs:write_file"),
        ("session_id", "session-b", "covers another session or caller"),
        ("created_at", "2026-11-21T09:00:00.000000+00:00", "before it was made"),
    ],
)
async def test_a_call_outside_its_grant_breaks_it(ledger: OpenLedger, column: str, value: str, says: str) -> None:
    await _approved_with_grant(ledger)
    report = await _tampered(ledger, (f"UPDATE invocations SET {column} = ? WHERE id = 'inv-0002'", (value,)))
    assert report.broken is not None and report.broken.reason == "grant"
    assert says in report.broken.message


async def test_a_call_after_its_grant_was_revoked_breaks_it(ledger: OpenLedger) -> None:
    await _approved_with_grant(ledger)
    grant = (await ledger.grants.grants())[0]
    await ledger.grants.revoke(grant.id, by="bob", now=T0)
    report = await _verified(ledger)
    assert report.broken is not None and report.broken.reason == "grant"
    assert "after it ended" in report.broken.message


async def _approve_behind_the_back(store: Store, invocation_id: str) -> None:
    """What an approval writes, without an approver: the status, and an `approved` event after the pending one."""
    await store.run("UPDATE invocations SET status = 'approved' WHERE id = ?", (invocation_id,))
    last = await store.run(f"SELECT MAX({store.position}), MAX(seq), MAX(at) FROM events")
    position, seq, at = last[0]
    detail = '{"by":"mallory","scope":"once"}'
    await insert_event_row(store, position + 1, invocation_id, seq + 1, "approved", at, detail, "", "")


async def _approved_by_two(ledger: OpenLedger) -> str:
    """inv-0001 held for two approvers, approved by alice (recorded, still pending), then bob (approved)."""
    held = make_invocation(1, expires_at=EXPIRY)
    await ledger.invocations.record(held, ["planned", "pending"], {"approvers": 2})
    for name in ("alice", "bob"):
        approver = Principal(name=name, role="admin")
        await decide(ledger, held.id, approve=True, principal=approver, note=None, now=BEFORE_EXPIRY)
    return held.id


async def test_a_call_needing_two_approvers_carries_two_signed_approvals_by_distinct_approvers(
    ledger: OpenLedger,
) -> None:
    held = await _approved_by_two(ledger)
    assert [e.kind for e in await ledger.invocations.events(held)][-2:] == ["approval_recorded", "approved"]
    report = await _verified(ledger)
    assert report.broken is None
    assert report.decisions == 1


async def test_a_second_approval_forged_in_the_store_is_not_signed(ledger: OpenLedger) -> None:
    held = make_invocation(1, expires_at=EXPIRY)
    await ledger.invocations.record(held, ["planned", "pending"], {"approvers": 2})
    alice = Principal(name="alice", role="admin")
    await decide(ledger, held.id, approve=True, principal=alice, note=None, now=BEFORE_EXPIRY)
    async with store_of(ledger) as store:
        await _approve_behind_the_back(store, held.id)
        await recompute(store)
    assert (await ledger.audit.verify()).broken is None
    report = await _verified(ledger)
    assert report.broken is not None and report.broken.reason == "decision"
    assert "is not signed" in report.broken.message


async def test_a_first_approval_copied_as_the_second_does_not_hold(ledger: OpenLedger) -> None:
    held = make_invocation(1, expires_at=EXPIRY)
    await ledger.invocations.record(held, ["planned", "pending"], {"approvers": 2})
    alice = Principal(name="alice", role="admin")
    await decide(ledger, held.id, approve=True, principal=alice, note=None, now=BEFORE_EXPIRY)
    async with store_of(ledger) as store:
        (first,) = await store.run("SELECT detail FROM events WHERE kind = 'approval_recorded'")
        await store.run("UPDATE invocations SET status = 'approved' WHERE id = ?", (held.id,))
        last = await store.run(f"SELECT MAX({store.position}), MAX(seq), MAX(at) FROM events")
        position, seq, at = last[0]
        await insert_event_row(store, position + 1, held.id, seq + 1, "approved", at, first[0], "", "")
        await recompute(store)
    report = await _verified(ledger)
    assert report.broken is not None and report.broken.reason == "decision"


async def test_a_two_person_approval_missing_its_first_approval_breaks_it(ledger: OpenLedger) -> None:
    held = await _approved_by_two(ledger)
    report = await _tampered(
        ledger, ("DELETE FROM events WHERE invocation_id = ? AND kind = 'approval_recorded'", (held,))
    )
    assert report.broken is not None and report.broken.reason == "decision"
    assert "needs 2 distinct approvers" in report.broken.message


async def test_a_requirement_lowered_in_the_store_breaks_the_signatures_of_the_approvals(ledger: OpenLedger) -> None:
    held = await _approved_by_two(ledger)
    lowered = ("UPDATE events SET detail = '{}' WHERE invocation_id = ? AND kind = 'pending'", (held,))
    report = await _tampered(ledger, lowered)
    assert report.broken is not None and report.broken.reason == "decision"
