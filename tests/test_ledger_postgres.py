"""What only the PostgreSQL ledger has: event ids with gaps that commit out of order (and a feed that still
announces each change once, in order), versioned migrations under an advisory lock, one key shared by every
instance, a listening connection that comes back, and the server's failures as clear errors. Everything every
backend must do is in the ledger contract (tests/ledger_contract/)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import psycopg
import pytest

from bastion.errors import ChangesLost, ConfigError, LedgerUnavailable
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.ledger.postgres.feed import LISTENER_NAME
from bastion.ledger.postgres.schema import SCHEMA_VERSION
from bastion.models import Change, EventKind
from tests.ledger_contract.samples import T0, add_pending, make_invocation
from tests.postgres import PostgresServer

pytestmark = pytest.mark.anyio

PLANNED: tuple[EventKind, ...] = ("planned",)
PLANNED_PENDING: tuple[EventKind, ...] = ("planned", "pending")


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    """The URL of a new, empty database."""
    return postgres.create_database()


@pytest.fixture
async def ledger(database: str, tmp_path: Path) -> AsyncIterator[OpenLedger]:
    async with await open_ledger(database, redactor=Redactor(), key_path=tmp_path / "ledger.key") as opened:
        yield opened


async def take_an_event_id(url: str, invocation_id: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """A transaction of another writer, left open after appending an event to `invocation_id` (it took an id).

    It took its id but has not reached the audit chain's lock (its triggers are skipped in the replica role, its
    chain columns stand-ins): a writer between drawing an id and appending to the chain, where ids still commit
    out of order. A writer holding the chain's lock would hold every other writer back until it commits."""
    conn = await psycopg.AsyncConnection.connect(url)
    await conn.execute("SET LOCAL session_replication_role = replica")
    await conn.execute("UPDATE invocations SET last_seq = last_seq + 1 WHERE id = %s", (invocation_id,))
    await conn.execute(
        "INSERT INTO events (invocation_id, seq, kind, at, position, prev_hash, hash) "
        "SELECT id, last_seq, 'reconciled', now(), -(extract(epoch FROM clock_timestamp()) * 1e6)::bigint, '', '' "
        "FROM invocations WHERE id = %s",
        (invocation_id,),
    )
    return conn


# -- gaps and out-of-order commits -----------------------------------------------------------------------------


async def test_an_audit_export_resumes_by_chain_position_where_ids_run_out_of_chain_order(
    ledger: OpenLedger, database: str
) -> None:
    """Ids are drawn before the chain's lock is taken, so a later link can hold a lower id (here forced with the
    identity's sequence): an export resumed after the last id it saw would skip it; by position it does not."""
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
        await ledger.invocations.record(make_invocation(1), ["planned"])
        await conn.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), 1000)")
        await ledger.invocations.record(make_invocation(2), ["planned"])
        await conn.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), 500)")
        await ledger.invocations.record(make_invocation(3), ["planned"])

    first = await ledger.audit.export(0, 2)
    assert [(line.event.invocation_id, line.event.id) for line in first] == [("inv-0001", 1), ("inv-0002", 1001)]
    rest = await ledger.audit.export(first[-1].event.position, 100)
    assert [(line.event.invocation_id, line.event.id) for line in rest] == [("inv-0003", 501)], "nothing is skipped"
    assert (await ledger.audit.verify()).broken is None


async def test_a_change_committed_before_an_earlier_id_waits_for_it_then_both_come_in_order(
    ledger: OpenLedger, database: str
) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned"])
    start = ledger.changes.cursor
    other = await take_an_event_id(database, "inv-0001")
    try:
        await ledger.invocations.record(make_invocation(2), ["planned"])  # a higher id, committed first
        assert ledger.changes.cursor == start, "nothing after the open transaction's id is announced yet"
        assert await ledger.changes.since(start) == [], "nor given to a stream that would resume past it"
        await other.commit()
    finally:
        await other.close()
    with anyio.fail_after(10):
        changes = await ledger.changes.next(start)
    assert [(change.invocation_id, change.kind) for change in changes] == [
        ("inv-0001", "reconciled"),
        ("inv-0002", "planned"),
    ]
    assert [change.id for change in changes] == sorted(change.id for change in changes)
    assert await ledger.changes.since(start) == list(changes)


async def test_an_id_whose_transaction_rolled_back_is_passed_without_changes_lost(
    ledger: OpenLedger, database: str
) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned"])
    start = ledger.changes.cursor
    other = await take_an_event_id(database, "inv-0001")
    await ledger.invocations.record(make_invocation(2), ["planned"])
    await other.rollback()
    await other.close()
    with anyio.fail_after(10):
        changes = await ledger.changes.next(start)
    assert [(change.invocation_id, change.kind) for change in changes] == [("inv-0002", "planned")]
    assert changes[0].id > start + 1, "the rolled-back id left a gap"
    assert [event.kind for event in await ledger.invocations.events("inv-0001")] == ["planned"]


async def test_changes_of_two_connections_racing_are_each_announced_once_in_id_order(
    ledger: OpenLedger, database: str, tmp_path: Path
) -> None:
    """Two connections record forty invocations at once (their ids interleave and commit in any order): the feed
    announces all eighty events exactly once, in id order, whether it reads them or commits them itself."""
    start = ledger.changes.cursor
    async with await open_ledger(database, redactor=Redactor(), key_path=tmp_path / "ledger.key") as another:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                await group.start(ledger.changes.run)
                for number in range(1, 41):
                    connection = ledger if number % 2 else another
                    group.start_soon(connection.invocations.record, make_invocation(number), PLANNED_PENDING)
                seen: list[Change] = []
                cursor = start
                while len(seen) < 80:
                    changes = await ledger.changes.next(cursor)
                    seen.extend(changes)
                    cursor = changes[-1].id
                group.cancel_scope.cancel()
    assert [change.id for change in seen] == sorted({change.id for change in seen})
    assert len(seen) == 80
    for number in range(1, 41):
        kinds = [change.kind for change in seen if change.invocation_id == f"inv-{number:04d}"]
        assert kinds == ["planned", "pending"]


async def test_a_cursor_ahead_of_an_open_gap_waits_instead_of_being_told_it_is_lost(
    ledger: OpenLedger, database: str, tmp_path: Path
) -> None:
    """A cursor another connection handed out (its feed had passed a gap this one has not yet) is waited on."""
    await ledger.invocations.record(make_invocation(1), ["planned"])
    other = await take_an_event_id(database, "inv-0001")
    async with await open_ledger(database, redactor=Redactor(), key_path=tmp_path / "ledger.key") as another:
        await another.invocations.record(make_invocation(2), ["planned"])
        await other.rollback()
        await other.close()
        stored = await another.changes.since(0)
        assert [change.invocation_id for change in stored] == ["inv-0001", "inv-0002"]
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                # The feed runs, as in every gateway: what `next` waits for comes by NOTIFY, whenever it commits.
                group.start_soon(ledger.changes.run)
                group.start_soon(another.invocations.record, make_invocation(3), PLANNED)
                changes = await ledger.changes.next(stored[-1].id)
                group.cancel_scope.cancel()
    assert [change.invocation_id for change in changes] == ["inv-0003"]


# -- the listening connection ----------------------------------------------------------------------------------


async def test_a_waiter_still_wakes_when_the_listening_connection_is_killed(
    ledger: OpenLedger, database: str, tmp_path: Path
) -> None:
    invocation_id = await add_pending(ledger)
    async with await open_ledger(database, redactor=Redactor(), key_path=tmp_path / "ledger.key") as another:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                await group.start(ledger.changes.run)
                async with await psycopg.AsyncConnection.connect(database, autocommit=True) as admin:
                    killed = await admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = %s AND datname = current_database()",
                        (LISTENER_NAME,),
                    )
                    assert [row[0] for row in await killed.fetchall()] == [True]
                cursor = ledger.changes.cursor
                await another.invocations.decide(invocation_id, approve=True, principal="a", note=None, now=T0)
                changes = await ledger.changes.next(cursor)
                group.cancel_scope.cancel()
    assert [(change.invocation_id, change.kind) for change in changes] == [(invocation_id, "approved")]


# -- migrations ------------------------------------------------------------------------------------------------


async def test_instances_opening_a_new_database_at_once_apply_each_migration_once(
    database: str, tmp_path: Path
) -> None:
    opened: list[OpenLedger] = []

    async def open_one() -> None:
        opened.append(await open_ledger(database, redactor=Redactor(), key_path=tmp_path / "ledger.key"))

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for _ in range(4):
                    group.start_soon(open_one)
        await opened[0].invocations.record(make_invocation(1), ["planned"])
        assert await opened[3].invocations.count() == 1
    finally:
        for ledger in opened:
            await ledger.close()
    async with await psycopg.AsyncConnection.connect(database) as conn:
        versions = await (await conn.execute("SELECT version FROM bastion_schema ORDER BY version")).fetchall()
    assert [row[0] for row in versions] == list(range(1, SCHEMA_VERSION + 1))


async def test_a_database_of_a_newer_bastion_is_refused(database: str, tmp_path: Path) -> None:
    async with await open_ledger(database, redactor=Redactor(), key_path=tmp_path / "ledger.key"):
        pass
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
        await conn.execute("INSERT INTO bastion_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(ConfigError, match="upgrade Bastion"):
        await open_ledger(database, redactor=Redactor(), key_path=tmp_path / "ledger.key")


# -- the shared key ----------------------------------------------------------------------------------------------


async def test_an_instance_with_another_key_is_refused_and_told_to_copy_the_key(database: str, tmp_path: Path) -> None:
    first, second = tmp_path / "one" / "ledger.key", tmp_path / "two" / "ledger.key"
    async with await open_ledger(database, redactor=Redactor(), key_path=first):
        pass
    with pytest.raises(ConfigError, match="missing") as missing:
        await open_ledger(database, redactor=Redactor(), key_path=second)
    assert "copy the key file" in missing.value.message
    assert not second.parent.exists(), "no key of its own is made for a ledger that has one"
    second.parent.mkdir()
    second.write_text(secrets.token_hex(32) + "\n")
    with pytest.raises(ConfigError, match="is not the key") as wrong:
        await open_ledger(database, redactor=Redactor(), key_path=second)
    assert "copy the key file" in wrong.value.message
    second.write_bytes(first.read_bytes())
    async with await open_ledger(database, redactor=Redactor(), key_path=second) as copied:
        assert await copied.invocations.count() == 0


# -- failures ----------------------------------------------------------------------------------------------------


async def test_a_server_that_cannot_be_reached_is_a_config_error_without_the_password(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.url("no_such_database")
    with pytest.raises(ConfigError) as refused:
        await open_ledger(url, redactor=Redactor(), key_path=tmp_path / "ledger.key")
    assert postgres.password not in refused.value.message
    assert "no_such_database" in refused.value.message


async def test_connections_the_server_dropped_cost_at_most_a_retriable_error(ledger: OpenLedger, database: str) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned"])
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as admin:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )

    async def read() -> object:
        try:
            return await ledger.invocations.get("inv-0001")
        except LedgerUnavailable as unavailable:
            return unavailable

    first = await read()
    assert first is not None
    assert not isinstance(first, LedgerUnavailable) or first.retriable
    assert await ledger.invocations.get("inv-0001") is not None


async def test_a_nul_character_in_an_error_message_is_stored_as_a_replacement_character(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1, status="executing"), ["planned", "executing"])
    assert await ledger.invocations.finish("inv-0001", "failed", error_class="upstream_error", error_message="a\x00b")
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.error_message == "a\ufffdb"


async def test_a_cursor_beyond_every_id_the_sequence_gave_is_lost(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned"])
    with anyio.fail_after(10), pytest.raises(ChangesLost):
        await ledger.changes.next(ledger.changes.cursor + 10)


async def test_deleting_the_newest_events_is_a_break_at_the_head_of_record(ledger: OpenLedger, database: str) -> None:
    """The events table refuses deletes; someone who turns its triggers off and deletes the newest events leaves a
    chain that still links, but no longer ends where `audit_head` says."""
    await ledger.invocations.record(make_invocation(1), ["planned"])
    await ledger.invocations.record(make_invocation(2), ["planned"])
    assert (await ledger.audit.verify()).broken is None
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
        await conn.execute("ALTER TABLE events DISABLE TRIGGER USER")
        await conn.execute("DELETE FROM events WHERE invocation_id = 'inv-0002'")
        await conn.execute("ALTER TABLE events ENABLE TRIGGER USER")

    report = await ledger.audit.verify()
    assert report.broken is not None and report.broken.reason == "head"
    assert report.verified == 1 and "newest events were removed" in report.broken.message
