"""Ledgers as earlier versions of Bastion left them, for the tests of the migrations."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiosqlite
import psycopg

from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.ledger.postgres import schema as postgres_schema
from bastion.ledger.sqlite import schema

OLD_ROW = (
    "INSERT INTO invocations (id, status, policy_key, tool, source_id, action_id, risk, mode, mode_source,"
    " session_id, args_hash, created_at, updated_at{extra}) VALUES ('old-1', 'completed', 'fs:read', 'fs__read',"
    " 'fs', 'read', 'read', 'allow', 'org', 'session-a', '', '2026-11-21T10:00:00.000000+00:00',"
    " '2026-11-21T10:00:01.000000+00:00'{values})"
)
"""A completed invocation `old-1` as any schema version holds it; `extra` columns and their `values` go last."""

OLD_SQLITE_ROW = OLD_ROW.format(extra="", values="")


@asynccontextmanager
async def sqlite_ledger_at(path: Path, version: int) -> AsyncIterator[sqlite3.Connection]:
    """A SQLite ledger file at schema `version`, made by its migrations as Bastion made it then; the connection
    (autocommit) writes what that Bastion would have recorded, and is closed after."""
    async with aiosqlite.connect(path, isolation_level=None) as old:
        await schema.register_functions_async(old)  # migration 9 chains events with it
        await schema.migrate(old, to_version=version)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        yield db
    finally:
        db.close()


@asynccontextmanager
async def upgraded_sqlite(path: Path, version: int) -> AsyncIterator[OpenLedger]:
    """A SQLite ledger file left at schema `version` holding the completed call `old-1`, opened (and so migrated) by
    this Bastion; on exit, the file is at this Bastion's schema version."""
    async with sqlite_ledger_at(path, version) as db:
        db.execute(OLD_SQLITE_ROW)
    async with await open_ledger(path, redactor=Redactor()) as ledger:
        yield ledger
    with sqlite3.connect(path) as db:
        reached = db.execute("PRAGMA user_version").fetchone()[0]
    db.close()
    assert reached == schema.SCHEMA_VERSION


@asynccontextmanager
async def upgraded_postgres(url: str, key_path: Path, version: int) -> AsyncIterator[OpenLedger]:
    """A PostgreSQL ledger left at schema `version` holding the completed call `old-1`, opened (and so migrated) by
    this Bastion; on exit, every migration of this Bastion is recorded applied."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await postgres_schema.migrate(conn, where="the test database", to_version=version)
        await conn.execute(OLD_ROW.format(extra=", last_seq", values=", 0"))
    async with await open_ledger(url, redactor=Redactor(), key_path=key_path) as ledger:
        yield ledger
    async with await psycopg.AsyncConnection.connect(url) as conn:
        versions = await (await conn.execute("SELECT version FROM bastion_schema ORDER BY version")).fetchall()
    assert [row[0] for row in versions] == list(range(1, postgres_schema.SCHEMA_VERSION + 1))
