"""SQLite only: migration 7 gives invocations a parent (the manifest invocation a step belongs to)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiosqlite
import pytest

from bastion.ledger import Redactor, open_ledger
from bastion.ledger.sqlite.schema import SCHEMA_VERSION, migrate
from tests.ledger_contract.samples import make_invocation

pytestmark = pytest.mark.anyio


async def test_a_version_6_file_upgrades_keeping_its_rows_without_a_parent(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with aiosqlite.connect(path, isolation_level=None) as version_6:
        await migrate(version_6, to_version=6)
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute(
            "INSERT INTO invocations (id, status, policy_key, tool, source_id, action_id, risk, mode, mode_source,"
            " session_id, args_hash, created_at, updated_at) VALUES ('old-1', 'completed', 'fs:read', 'fs__read',"
            " 'fs', 'read', 'read', 'allow', 'org', 'session-a', '', '2026-11-21T10:00:00.000000+00:00',"
            " '2026-11-21T10:00:01.000000+00:00')"
        )
    db.close()

    async with await open_ledger(path, redactor=Redactor()) as ledger:
        old = await ledger.invocations.get("old-1")
        assert old is not None and (old.status, old.parent_id) == ("completed", None)
        await ledger.invocations.record(make_invocation(1, status="completed", parent_id="old-1"), ["planned"])
        assert [i.id for i in await ledger.invocations.list(parent_id="old-1")] == ["inv-0001"]
    with sqlite3.connect(path) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        indexes = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    db.close()
    assert version == SCHEMA_VERSION >= 7
    assert "invocations_parent" in indexes
