"""Invocations keep where their risk came from: SQLite's migration 10 and PostgreSQL's migration 4 add the column,
keeping the rows recorded before without one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from bastion.ledger import Redactor, open_ledger
from bastion.ledger.postgres import schema as postgres_schema
from bastion.ledger.sqlite import schema as sqlite_schema
from tests.ledger_contract.samples import make_invocation
from tests.old_ledgers import OLD_ROW, OLD_SQLITE_ROW, sqlite_ledger_at
from tests.postgres import PostgresServer

pytestmark = pytest.mark.anyio


async def test_a_version_9_sqlite_file_upgrades_keeping_its_rows_without_a_risk_source(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 9) as db:
        db.execute(OLD_SQLITE_ROW)

    async with await open_ledger(path, redactor=Redactor()) as ledger:
        old = await ledger.invocations.get("old-1")
        assert old is not None and (old.status, old.risk, old.risk_source) == ("completed", "read", None)
        await ledger.invocations.record(make_invocation(1, risk="danger", risk_source="destructiveHint"), ["planned"])
        new = await ledger.invocations.get("inv-0001")
        assert new is not None and (new.risk, new.risk_source) == ("danger", "destructiveHint")
    with sqlite3.connect(path) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
    db.close()
    assert version == sqlite_schema.SCHEMA_VERSION >= 10


async def test_a_version_3_postgres_database_upgrades_keeping_its_rows_without_a_risk_source(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.create_database()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await postgres_schema.migrate(conn, where="the test database", to_version=3)
        await conn.execute(OLD_ROW.format(extra=", last_seq", values=", 0"))

    async with await open_ledger(url, redactor=Redactor(), key_path=tmp_path / "ledger.key") as ledger:
        old = await ledger.invocations.get("old-1")
        assert old is not None and (old.status, old.risk, old.risk_source) == ("completed", "read", None)
        await ledger.invocations.record(make_invocation(1, risk="write", risk_source="default_risk"), ["planned"])
        new = await ledger.invocations.get("inv-0001")
        assert new is not None and (new.risk, new.risk_source) == ("write", "default_risk")
    async with await psycopg.AsyncConnection.connect(url) as conn:
        versions = await (await conn.execute("SELECT version FROM bastion_schema ORDER BY version")).fetchall()
    assert [row[0] for row in versions] == list(range(1, postgres_schema.SCHEMA_VERSION + 1))
    assert postgres_schema.SCHEMA_VERSION >= 4
