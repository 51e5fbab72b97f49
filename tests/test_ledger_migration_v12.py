"""Names stay with their actions: SQLite's migration 12 and PostgreSQL's migration 6 add the `tool_names` table to a
ledger that holds calls recorded before, which keep what they were."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from bastion.ledger import OpenLedger
from tests.old_ledgers import upgraded_postgres, upgraded_sqlite
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
    async with upgraded_sqlite(tmp_path / "ledger.db", 11) as ledger:
        await assert_names_are_kept_beside_the_old_row(ledger)


async def test_a_version_5_postgres_database_upgrades_to_keep_tool_names(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    async with upgraded_postgres(postgres.create_database(), tmp_path / "ledger.key", 5) as ledger:
        await assert_names_are_kept_beside_the_old_row(ledger)
