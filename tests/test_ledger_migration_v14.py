"""Tokens, pins and grants chained: SQLite's migration 14 and PostgreSQL's migration 8 adopt the records a ledger
holds, one `record_adopted` event each, so they verify from then on and a row added behind the ledger later has none."""

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
TOKEN = (
    f"INSERT INTO tokens (name, role, profile, secret_hash, created_at) VALUES ('ops', 'admin', NULL, 'beef', '{AT}')"
)
GRANT = (
    "INSERT INTO grants (id, policy_key, scope, grantor, created_at) "
    f"VALUES ('always_1', 'fs:write_file', 'always', 'alice', '{AT}')"
)


async def assert_the_records_are_adopted(ledger: OpenLedger) -> None:
    report = await ledger.audit.verify()
    assert report.broken is None
    assert report.records == 2
    chain = await ledger.audit.chain(0, 100)
    assert [(event.kind, event.record) for event in chain] == [
        ("record_adopted", "token:1"),
        ("record_adopted", "grant:always_1"),
    ]
    async with store_of(ledger) as store:
        await store.run(TOKEN.replace("'ops'", "'planted'").replace("'beef'", "'f00d'"))
    broken = (await ledger.audit.verify()).broken
    assert broken is not None and "has no event" in broken.message


async def test_a_version_13_sqlite_file_adopts_its_tokens_and_grants(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 13) as db:
        db.execute(TOKEN)
        db.execute(GRANT)
    async with await open_ledger(path, redactor=Redactor()) as ledger:
        await assert_the_records_are_adopted(ledger)


async def test_a_version_7_postgres_database_adopts_its_tokens_and_grants(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.create_database()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await postgres_schema.migrate(conn, where="the test database", to_version=7)
        await conn.execute(TOKEN.encode())
        await conn.execute(GRANT.encode())
    async with await open_ledger(url, redactor=Redactor(), key_path=tmp_path / "ledger.key") as ledger:
        await assert_the_records_are_adopted(ledger)
