"""The audit chain: every event carries the hash of the one before it; verification reports the first
break; an export resumes from a cursor; a retention prune removes finished history and keeps the rest verifiable."""

from __future__ import annotations

import itertools
import sqlite3
from datetime import timedelta

import anyio
import psycopg
import pytest

from bastion.ledger import OpenLedger
from bastion.ledger.chain import GENESIS, hash_of
from bastion.ledger.postgres import PostgresBackend
from bastion.ledger.sqlite import SqliteBackend
from tests.ledger_contract.samples import T0, add_pending, make_invocation

pytestmark = pytest.mark.anyio


async def _completed(ledger: OpenLedger, number: int, **overrides: object) -> str:
    invocation = make_invocation(number, status="approved", mode="allow", **overrides)
    await ledger.invocations.record(invocation, ["planned", "approved"])
    await ledger.invocations.claim(invocation.id, owner="instance-a")
    await ledger.invocations.finish(invocation.id, "completed", result={"ok": number})
    return invocation.id


async def _tamper(ledger: OpenLedger, sql: str) -> None:
    """Change the store behind the ledger's back, as someone with the file or the database would."""
    backend = ledger.backend
    if isinstance(backend, SqliteBackend):
        conn = sqlite3.connect(backend.database.path, isolation_level=None)
        try:
            conn.execute("DROP TRIGGER IF EXISTS events_no_update")
            conn.execute("DROP TRIGGER IF EXISTS events_no_delete")
            conn.execute(sql)
        finally:
            conn.close()
        return
    assert isinstance(backend, PostgresBackend)
    async with await psycopg.AsyncConnection.connect(backend.database.url, autocommit=True) as pg:
        await pg.execute("ALTER TABLE events DISABLE TRIGGER USER")
        await pg.execute(sql.encode())


async def test_every_event_follows_the_hash_of_the_one_before_and_the_chain_verifies(ledger: OpenLedger) -> None:
    await _completed(ledger, 1)
    await add_pending(ledger, 2)
    await ledger.invocations.decide("inv-0002", approve=False, principal="alice", note="no", now=T0)
    chain = await ledger.audit.chain(0, 100)
    assert [event.kind for event in chain] == [
        "planned",
        "approved",
        "executing",
        "completed",
        "planned",
        "pending",
        "denied",
    ]
    assert chain[0].prev_hash == GENESIS
    for before, event in itertools.pairwise(chain):
        assert event.prev_hash == before.hash
    assert all(hash_of(event, event.prev_hash) == event.hash for event in chain)
    report = await ledger.audit.verify()
    assert report.broken is None
    assert report.verified == 7
    assert (report.head_id, report.head_hash) == (chain[-1].id, chain[-1].hash)


async def test_writers_on_two_connections_extend_one_chain(ledger: OpenLedger, another: OpenLedger) -> None:
    async with anyio.create_task_group() as group:
        for number in range(1, 9):
            group.start_soon(_completed, ledger if number % 2 else another, number)
    report = await another.audit.verify()
    assert report.broken is None
    assert report.verified == 32


async def test_an_edited_event_is_reported_as_the_first_break(ledger: OpenLedger) -> None:
    await _completed(ledger, 1)
    await _completed(ledger, 2)
    chain = await ledger.audit.chain(0, 100)
    edited = chain[5]
    await _tamper(ledger, f"UPDATE events SET detail = '{{\"forged\":true}}' WHERE id = {edited.id}")
    report = await ledger.audit.verify()
    assert report.broken is not None
    assert (report.broken.event_id, report.broken.reason) == (edited.id, "hash")
    assert report.verified == 5


async def test_a_removed_event_breaks_the_link_of_the_next_one(ledger: OpenLedger) -> None:
    await _completed(ledger, 1)
    chain = await ledger.audit.chain(0, 100)
    await _tamper(ledger, f"DELETE FROM events WHERE id = {chain[1].id}")
    report = await ledger.audit.verify()
    assert report.broken is not None
    assert (report.broken.event_id, report.broken.reason) == (chain[2].id, "link")


async def test_an_export_resumed_from_its_cursor_equals_the_whole_export(ledger: OpenLedger) -> None:
    start = max((event.position for event in await ledger.audit.chain(0, 10_000)), default=0)
    for number in range(1, 5):
        await _completed(ledger, number)
    await add_pending(ledger, 5)
    whole = await ledger.audit.export(start, 10_000)
    assert len(whole) == 18
    resumed, cursor = [], start
    while page := await ledger.audit.export(cursor, 4):
        resumed.extend(page)
        cursor = page[-1].event.position
    assert resumed == whole
    event, invocation = whole[3].event, whole[3].invocation
    assert invocation is not None
    assert (event.kind, invocation.id, invocation.status, invocation.result) == (
        "completed",
        "inv-0001",
        "completed",
        {"ok": 1},
    )


async def test_a_prune_removes_finished_history_and_the_rest_still_verifies(ledger: OpenLedger) -> None:
    for number in range(1, 4):
        await _completed(ledger, number)
    await add_pending(ledger, 4)
    await _completed(ledger, 5)
    chain = await ledger.audit.chain(0, 100)
    report = await ledger.audit.prune(T0 + timedelta(days=365 * 10), now=T0)
    # Everything before the pending invocation's first event went; it and what follows stay.
    assert (report.events, report.invocations, report.kept_by) == (12, 3, "inv-0004")
    assert report.checkpoint is not None
    assert (report.checkpoint.event_id, report.checkpoint.hash) == (chain[11].id, chain[11].hash)
    assert await ledger.invocations.get("inv-0001") is None
    assert await ledger.invocations.get("inv-0005") is not None
    verified = await ledger.audit.verify()
    assert verified.broken is None
    assert verified.verified == len(chain) - 12
    assert verified.checkpoint == await ledger.audit.checkpoint()
    # The chain goes on from there.
    await _completed(ledger, 6)
    assert (await ledger.audit.verify()).broken is None


async def test_a_prune_keeps_recent_calls_and_the_newest_event(ledger: OpenLedger) -> None:
    await _completed(ledger, 1)
    nothing = await ledger.audit.prune(T0 - timedelta(days=1), now=T0)
    assert (nothing.events, nothing.checkpoint, nothing.kept_by) == (0, None, "inv-0001")
    everything_but_one = await ledger.audit.prune(T0 + timedelta(days=3650), now=T0)
    assert (everything_but_one.events, everything_but_one.invocations) == (3, 0)
    assert await ledger.invocations.get("inv-0001") is not None
    assert (await ledger.audit.verify()).verified == 1


async def test_events_beyond_the_checkpoint_cannot_be_deleted(ledger: OpenLedger) -> None:
    await _completed(ledger, 1)
    chain = await ledger.audit.chain(0, 100)
    backend = ledger.backend
    if isinstance(backend, SqliteBackend):
        conn = sqlite3.connect(backend.database.path, isolation_level=None)
        try:
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute("DELETE FROM events WHERE id = ?", (chain[0].id,))
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute("UPDATE events SET kind = 'failed' WHERE id = ?", (chain[0].id,))
        finally:
            conn.close()
        return
    assert isinstance(backend, PostgresBackend)
    async with await psycopg.AsyncConnection.connect(backend.database.url, autocommit=True) as pg:
        with pytest.raises(psycopg.errors.RaiseException):
            await pg.execute("DELETE FROM events WHERE id = %s", (chain[0].id,))
        with pytest.raises(psycopg.errors.RaiseException):
            await pg.execute("UPDATE events SET kind = 'failed' WHERE id = %s", (chain[0].id,))
