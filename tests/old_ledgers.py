"""Ledgers as earlier versions of Bastion left them, for the tests of the migrations."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiosqlite

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
