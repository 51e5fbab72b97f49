"""SQLite only: migration 9 chains the events a ledger already has (the audit chain, bastion.ledger.chain)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.ledger import Redactor, open_ledger
from bastion.ledger.chain import GENESIS
from tests.ledger_contract.samples import make_invocation
from tests.old_ledgers import OLD_SQLITE_ROW, sqlite_ledger_at

pytestmark = pytest.mark.anyio


async def test_a_version_8_file_upgrades_with_its_events_chained_in_id_order(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 8) as db:
        db.execute(OLD_SQLITE_ROW)
        for seq, kind in enumerate(("planned", "approved", "executing", "completed"), start=1):
            db.execute(
                "INSERT INTO events (invocation_id, seq, kind, at, detail) VALUES ('old-1', ?, ?, ?, '{}')",
                (seq, kind, f"2026-11-21T10:00:0{seq}.000000+00:00"),
            )

    async with await open_ledger(path, redactor=Redactor()) as ledger:
        chain = await ledger.audit.chain(0, 100)
        assert [event.kind for event in chain] == ["planned", "approved", "executing", "completed"]
        assert chain[0].prev_hash == GENESIS
        await ledger.invocations.record(make_invocation(1), ["planned", "pending"])
        report = await ledger.audit.verify()
    assert report.broken is None
    assert report.verified == 6
