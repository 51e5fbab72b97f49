"""Tool names chained: SQLite's migration 15 and PostgreSQL's migration 9 adopt the names a ledger has given, one
`record_adopted` event each, so a name redirected to another action behind the ledger breaks `verify` from then on."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.ledger.postgres import schema as postgres_schema
from tests.ledger_contract.tampering import store_of
from tests.old_ledgers import sqlite_ledger_at
from tests.postgres import PostgresServer

pytestmark = pytest.mark.anyio

AT = "2026-11-21T10:00:01.000000+00:00"
NAMES = (
    "INSERT INTO tool_names (name, source_id, action_id, given_at) VALUES "
    f"('fs__write_file', 'fs', 'write_file', '{AT}'), ('notes__add', 'notes', 'add', '{AT}')"
)


async def assert_the_names_are_adopted(ledger: OpenLedger) -> None:
    report = await ledger.audit.verify()
    assert report.broken is None
    assert report.records == 2
    chain = await ledger.audit.chain(0, 100)
    assert [(event.kind, event.record) for event in chain] == [
        ("record_adopted", "name:fs__write_file"),
        ("record_adopted", "name:notes__add"),
    ]
    async with store_of(ledger) as store:
        await store.run("UPDATE tool_names SET action_id = 'delete_file' WHERE name = 'fs__write_file'")
    broken = (await ledger.audit.verify()).broken
    assert broken is not None and "name:fs__write_file" in broken.message and "was changed" in broken.message


async def test_a_version_14_sqlite_file_adopts_its_tool_names(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 14) as db:
        db.execute(NAMES)
    async with await open_ledger(path, redactor=Redactor()) as ledger:
        await assert_the_names_are_adopted(ledger)


async def test_a_version_8_postgres_database_adopts_its_tool_names(postgres: PostgresServer, tmp_path: Path) -> None:
    url = postgres.create_database()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await postgres_schema.migrate(conn, where="the test database", to_version=8)
        await conn.execute(NAMES.encode())
    async with await open_ledger(url, redactor=Redactor(), key_path=tmp_path / "ledger.key") as ledger:
        await assert_the_names_are_adopted(ledger)
