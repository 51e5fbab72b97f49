"""Grants become ledger records: SQLite's migration 11 and PostgreSQL's migration 5 add the `grants` table to a
ledger that holds calls recorded before, which keep their modes as they were."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bastion.ledger import OpenLedger
from bastion.models import Grant
from tests.old_ledgers import upgraded_postgres, upgraded_sqlite
from tests.postgres import PostgresServer

pytestmark = pytest.mark.anyio

NOW = datetime.fromisoformat("2026-11-22T10:00:00+00:00")


async def assert_grants_work_beside_the_old_row(ledger: OpenLedger) -> None:
    old = await ledger.invocations.get("old-1")
    assert old is not None and (old.status, old.mode, old.mode_source) == ("completed", "allow", "org")
    assert await ledger.grants.grants() == []
    grant = Grant(
        id="hour_000000000001",
        policy_key="fs:read",
        scope="hour",
        grantor="alice",
        invocation_id="old-1",
        created_at=NOW,
        expires_at=NOW + timedelta(hours=1),
    )
    await ledger.grants.add(grant)
    assert await ledger.grants.covering("fs:read", session_id="s", principal=None, now=NOW) == [grant]


async def test_a_version_10_sqlite_file_upgrades_to_hold_grants(tmp_path: Path) -> None:
    async with upgraded_sqlite(tmp_path / "ledger.db", 10) as ledger:
        await assert_grants_work_beside_the_old_row(ledger)


async def test_a_version_4_postgres_database_upgrades_to_hold_grants(postgres: PostgresServer, tmp_path: Path) -> None:
    async with upgraded_postgres(postgres.create_database(), tmp_path / "ledger.key", 4) as ledger:
        await assert_grants_work_beside_the_old_row(ledger)
