"""Grants become ledger records: SQLite's migration 11 and PostgreSQL's migration 5 add the `grants` table to a
ledger that holds calls recorded before, which keep their modes as they were."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.ledger.postgres import schema as postgres_schema
from bastion.ledger.sqlite import schema as sqlite_schema
from bastion.models import Grant
from tests.old_ledgers import OLD_ROW, OLD_SQLITE_ROW, sqlite_ledger_at
from tests.postgres import PostgresServer

pytestmark = pytest.mark.anyio

NOW = datetime.fromisoformat("2026-11-22T10:00:00+00:00")


async def assert_grants_work_beside_the_old_row(ledger: OpenLedger) -> None:
    old = await ledger.invocations.get("old-1")
    assert old is not None and (old.status, old.mode, old.mode_source) == ("completed", "allow", "org")
    assert await ledger.grants.grants() == []
    grant = Grant(
        id="hour_000000000001",
        policy_key="fs:read",
        scope="hour",
        grantor="alice",
        invocation_id="old-1",
        created_at=NOW,
        expires_at=NOW + timedelta(hours=1),
    )
    await ledger.grants.add(grant)
    assert await ledger.grants.covering("fs:read", session_id="s", principal=None, now=NOW) == [grant]


async def test_a_version_10_sqlite_file_upgrades_to_hold_grants(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 10) as db:
        db.execute(OLD_SQLITE_ROW)

    async with await open_ledger(path, redactor=Redactor()) as ledger:
        await assert_grants_work_beside_the_old_row(ledger)
    with sqlite3.connect(path) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
    db.close()
    assert version == sqlite_schema.SCHEMA_VERSION >= 11


async def test_a_version_4_postgres_database_upgrades_to_hold_grants(postgres: PostgresServer, tmp_path: Path) -> None:
    url = postgres.create_database()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await postgres_schema.migrate(conn, where="the test database", to_version=4)
        await conn.execute(OLD_ROW.format(extra=", last_seq", values=", 0"))

    async with await open_ledger(url, redactor=Redactor(), key_path=tmp_path / "ledger.key") as ledger:
        await assert_grants_work_beside_the_old_row(ledger)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        versions = await (await conn.execute("SELECT version FROM bastion_schema ORDER BY version")).fetchall()
    assert [row[0] for row in versions] == list(range(1, postgres_schema.SCHEMA_VERSION + 1))
    assert postgres_schema.SCHEMA_VERSION >= 5
