"""SQLite only: migration 7 gives invocations a parent (the manifest invocation a step belongs to)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bastion.ledger import Redactor, open_ledger
from bastion.ledger.sqlite.schema import SCHEMA_VERSION
from tests.ledger_contract.samples import make_invocation
from tests.old_ledgers import OLD_SQLITE_ROW, sqlite_ledger_at

pytestmark = pytest.mark.anyio


async def test_a_version_6_file_upgrades_keeping_its_rows_without_a_parent(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 6) as db:
        db.execute(OLD_SQLITE_ROW)

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
