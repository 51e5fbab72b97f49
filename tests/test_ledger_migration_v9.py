"""SQLite only: migration 9 chains the events a ledger already has (the audit chain, bastion.ledger.chain)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiosqlite
import pytest

from bastion.ledger import Redactor, open_ledger
from bastion.ledger.chain import GENESIS
from bastion.ledger.sqlite.schema import migrate
from tests.ledger_contract.samples import make_invocation

pytestmark = pytest.mark.anyio


async def test_a_version_8_file_upgrades_with_its_events_chained_in_id_order(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with aiosqlite.connect(path, isolation_level=None) as version_8:
        await migrate(version_8, to_version=8)
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute(
            "INSERT INTO invocations (id, status, policy_key, tool, source_id, action_id, risk, mode, mode_source,"
            " session_id, args_hash, created_at, updated_at) VALUES ('old-1', 'completed', 'fs:read', 'fs__read',"
            " 'fs', 'read', 'read', 'allow', 'org', 'session-a', '', '2026-11-21T10:00:00.000000+00:00',"
            " '2026-11-21T10:00:01.000000+00:00')"
        )
        for seq, kind in enumerate(("planned", "approved", "executing", "completed"), start=1):
            db.execute(
                "INSERT INTO events (invocation_id, seq, kind, at, detail) VALUES ('old-1', ?, ?, ?, '{}')",
                (seq, kind, f"2026-11-21T10:00:0{seq}.000000+00:00"),
            )
    db.close()

    async with await open_ledger(path, redactor=Redactor()) as ledger:
        chain = await ledger.audit.chain(0, 100)
        assert [event.kind for event in chain] == ["planned", "approved", "executing", "completed"]
        assert chain[0].prev_hash == GENESIS
        await ledger.invocations.record(make_invocation(1), ["planned", "pending"])
        report = await ledger.audit.verify()
    assert report.broken is None
    assert report.verified == 6
