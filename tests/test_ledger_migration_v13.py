"""Records chained: SQLite's migration 13 and PostgreSQL's migration 7 keep a ledger's events from before as the
pre-chain segment, which verifies as it was and is reported as such, and chain every record changed after."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.ledger.chain import GENESIS, event_hash
from bastion.ledger.postgres import schema as postgres_schema
from tests.ledger_contract.samples import make_invocation
from tests.old_ledgers import OLD_ROW, OLD_SQLITE_ROW, sqlite_ledger_at
from tests.postgres import PostgresServer

pytestmark = pytest.mark.anyio

AT = "2026-11-21T10:00:01.000000+00:00"


async def assert_the_old_events_are_the_pre_chain_segment(ledger: OpenLedger) -> None:
    before = await ledger.audit.verify()
    assert before.broken is None
    assert (before.verified, before.pre_chain, before.records, before.records_not_covered) == (2, 2, 0, 1)

    invocation = make_invocation(1, status="approved", mode="allow")
    await ledger.invocations.record(invocation, ["planned", "approved"])
    await ledger.invocations.claim(invocation.id, owner="instance-a")
    await ledger.invocations.finish(invocation.id, "completed", result={"ok": 1})
    after = await ledger.audit.verify()
    assert after.broken is None
    assert (after.verified, after.pre_chain, after.records, after.records_not_covered) == (6, 2, 1, 1)
    chain = await ledger.audit.chain(0, 100)
    assert [event.state is None for event in chain] == [True, True, False, False, False, False]
    assert chain[2].prev_hash == chain[1].hash


async def test_a_version_12_sqlite_file_keeps_its_chain_as_the_pre_chain_segment(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 12) as db:
        db.execute(OLD_SQLITE_ROW)
        prev = GENESIS
        for number, kind in ((1, "executing"), (2, "completed")):
            hashed = event_hash(prev, number, "old-1", number, kind, AT, "{}")
            db.execute(
                "INSERT INTO events (id, invocation_id, seq, kind, at, detail, prev_hash, hash) "
                "VALUES (?, 'old-1', ?, ?, ?, '{}', ?, ?)",
                (number, number, kind, AT, prev, hashed),
            )
            prev = hashed
    async with await open_ledger(path, redactor=Redactor()) as ledger:
        await assert_the_old_events_are_the_pre_chain_segment(ledger)


async def test_a_version_6_postgres_database_keeps_its_chain_as_the_pre_chain_segment(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.create_database()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await postgres_schema.migrate(conn, where="the test database", to_version=6)
        await conn.execute(OLD_ROW.format(extra=", last_seq", values=", 2"))
        for number, kind in ((1, "executing"), (2, "completed")):
            # The trigger of that version chains it.
            await conn.execute(
                "INSERT INTO events (invocation_id, seq, kind, at, detail) VALUES ('old-1', %s, %s, %s, '{}')",
                (number, kind, AT),
            )
    async with await open_ledger(url, redactor=Redactor(), key_path=tmp_path / "ledger.key") as ledger:
        await assert_the_old_events_are_the_pre_chain_segment(ledger)
