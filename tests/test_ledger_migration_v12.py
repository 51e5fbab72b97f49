"""Names stay with their actions: SQLite's migration 12 and PostgreSQL's migration 6 add the `tool_names` table to a
ledger that holds calls recorded before, which keep what they were."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.ledger.postgres import schema as postgres_schema
from bastion.ledger.sqlite import schema as sqlite_schema
from tests.old_ledgers import OLD_ROW, OLD_SQLITE_ROW, sqlite_ledger_at
from tests.postgres import PostgresServer

pytestmark = pytest.mark.anyio

NOW = datetime.fromisoformat("2026-11-28T10:00:00+00:00")


async def assert_names_are_kept_beside_the_old_row(ledger: OpenLedger) -> None:
    old = await ledger.invocations.get("old-1")
    assert old is not None and (old.status, old.tool) == ("completed", "fs__read")
    assert await ledger.pins.tool_names() == {}
    await ledger.pins.keep_tool_names({"fs__read": ("fs", "read")}, now=NOW)
    assert await ledger.pins.tool_names() == {"fs__read": ("fs", "read")}


async def test_a_version_11_sqlite_file_upgrades_to_keep_tool_names(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 11) as db:
        db.execute(OLD_SQLITE_ROW)

    async with await open_ledger(path, redactor=Redactor()) as ledger:
        await assert_names_are_kept_beside_the_old_row(ledger)
    with sqlite3.connect(path) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
    db.close()
    assert version == sqlite_schema.SCHEMA_VERSION >= 12


async def test_a_version_5_postgres_database_upgrades_to_keep_tool_names(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.create_database()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await postgres_schema.migrate(conn, where="the test database", to_version=5)
        await conn.execute(OLD_ROW.format(extra=", last_seq", values=", 0"))

    async with await open_ledger(url, redactor=Redactor(), key_path=tmp_path / "ledger.key") as ledger:
        await assert_names_are_kept_beside_the_old_row(ledger)
    assert postgres_schema.SCHEMA_VERSION >= 6
