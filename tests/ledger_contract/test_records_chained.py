"""Tokens, pins, grants and tool names chained beside invocations: every change of one is an event, so a row edited,
inserted or deleted behind the ledger breaks `verify` as an invocation's does, and a prune that removes their events
restates them first. Both on every backend."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bastion.errors import Conflict
from bastion.ledger import OpenLedger
from bastion.models import ChainBreak
from tests.ledger_contract.samples import BEFORE_EXPIRY, T0, add_pending, make_invocation, make_pin
from tests.ledger_contract.tampering import store_of
from tests.ledger_contract.test_grants import make_grant

pytestmark = pytest.mark.anyio


async def _every_kind(ledger: OpenLedger) -> None:
    """A token created and another revoked, a pin saved then its drift accepted, a grant made by a decision and one
    revoked, two tool names given (and one given again, which changes nothing): one change of each kind."""
    await ledger.tokens.create_token("ops", role="admin", profile=None, now=T0)
    await ledger.tokens.create_token("old", role="agent", profile=None, now=T0)
    await ledger.tokens.revoke_token("old", now=T0 + timedelta(seconds=1))
    await ledger.pins.save_pin(make_pin("fs", "write_file", drifted=True))
    await ledger.pins.accept_drift(source_id="fs", action_id="write_file", principal="alice")
    held = await add_pending(ledger, 1)
    grant = make_grant(scope="always", expires_at=None)
    await ledger.invocations.decide(held, approve=True, principal="alice", note=None, now=BEFORE_EXPIRY, grant=grant)
    await ledger.grants.revoke(grant.id, by="alice", now=BEFORE_EXPIRY + timedelta(seconds=1))
    given = {"fs__write_file": ("fs", "write_file"), "fs__read_file": ("fs", "read_file")}
    await ledger.pins.keep_tool_names(given, now=T0)
    await ledger.pins.keep_tool_names({"fs__write_file": ("fs", "delete_file")}, now=T0 + timedelta(seconds=2))


async def _broken_by(ledger: OpenLedger, sql: str, params: tuple[object, ...] = ()) -> ChainBreak:
    async with store_of(ledger) as store:
        await store.run(sql, params)
    broken = (await ledger.audit.verify()).broken
    assert broken is not None
    return broken


async def test_every_change_of_a_record_is_chained_and_verifies(ledger: OpenLedger) -> None:
    await _every_kind(ledger)
    report = await ledger.audit.verify()
    assert report.broken is None
    assert report.records == 1 + 2 + 1 + 1 + 2  # the invocation, two tokens, one pin, one grant, two names
    kinds = [event.kind for event in await ledger.audit.chain(0, 100) if event.record is not None]
    assert kinds == [
        "token_created",
        "token_created",
        "token_revoked",
        "pin_saved",
        "pin_accepted",
        "grant_made",
        "grant_revoked",
        "name_given",
        "name_given",
    ]
    assert await ledger.pins.tool_names() == {
        "fs__write_file": ("fs", "write_file"),
        "fs__read_file": ("fs", "read_file"),
    }


@pytest.mark.parametrize(
    ("sql", "found"),
    [
        ("UPDATE tokens SET role = 'owner' WHERE name = 'ops'", "was changed after it was recorded"),
        ("UPDATE tokens SET revoked_at = NULL WHERE name = 'old'", "was changed after it was recorded"),
        ("UPDATE tokens SET secret_hash = 'f00d' WHERE name = 'ops'", "was changed after it was recorded"),
        ("UPDATE pins SET fingerprint = 'forged'", "was changed after it was recorded"),
        ("UPDATE grants SET revoked_at = NULL, revoked_by = NULL", "was changed after it was recorded"),
        ("UPDATE grants SET policy_key = 'github:delete_repo'", "was changed after it was recorded"),
        (
            "INSERT INTO tokens (name, role, profile, secret_hash, created_at) "
            "VALUES ('planted', 'owner', NULL, 'beef', '2026-11-21T10:00:00.000000+00:00')",
            "has no event",
        ),
        ("DELETE FROM pins", "has events but no row"),
        ("UPDATE tool_names SET action_id = 'delete_file' WHERE name = 'fs__write_file'", "was changed after it was"),
        (
            "INSERT INTO tool_names (name, source_id, action_id, given_at) "
            "VALUES ('fs__rm', 'fs', 'delete_file', '2026-11-21T10:00:00.000000+00:00')",
            "has no event",
        ),
        ("DELETE FROM tool_names WHERE name = 'fs__read_file'", "has events but no row"),
    ],
)
async def test_a_record_changed_behind_the_ledger_breaks_verify(ledger: OpenLedger, sql: str, found: str) -> None:
    await _every_kind(ledger)
    broken = await _broken_by(ledger, sql)
    assert broken.reason == "record"
    assert found in broken.message
    assert "record " in broken.message


async def test_a_prune_restates_the_records_whose_events_it_removes(ledger: OpenLedger) -> None:
    await ledger.tokens.create_token("ops", role="admin", profile=None, now=T0)
    await ledger.pins.save_pin(make_pin("fs", "write_file"))
    for number in (1, 2, 3):
        finished = make_invocation(number, status="completed", mode="allow", expires_at=None)
        await ledger.invocations.record(finished, ["planned", "executing", "completed"])
    report = await ledger.audit.prune(T0 + timedelta(days=3650), now=T0 + timedelta(days=3650))
    assert report.checkpoint is not None
    after = await ledger.audit.verify()
    assert after.broken is None, after.broken
    assert after.records == 1 + 2  # the kept invocation, the token and the pin
    kept = [event for event in await ledger.audit.chain(0, 100) if event.kind == "record_kept"]
    assert sorted(event.record or "" for event in kept) == ["pin:fs:write_file", "token:1"]


async def test_a_prune_never_vouches_for_a_record_changed_behind_the_ledger(ledger: OpenLedger) -> None:
    await ledger.tokens.create_token("ops", role="agent", profile=None, now=T0)
    for number in (1, 2):
        finished = make_invocation(number, status="completed", mode="allow", expires_at=None)
        await ledger.invocations.record(finished, ["planned", "executing", "completed"])
    async with store_of(ledger) as store:
        await store.run("UPDATE tokens SET role = 'owner'")
    with pytest.raises(Conflict, match="record token:1 was changed behind the ledger"):
        await ledger.audit.prune(T0 + timedelta(days=3650), now=T0 + timedelta(days=3650))
    assert (await ledger.audit.checkpoint()) is None
