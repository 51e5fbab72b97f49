"""Invocations keep where their risk came from: SQLite's migration 10 and PostgreSQL's migration 4 add the column,
keeping the rows recorded before without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ledger_contract.samples import make_invocation
from tests.old_ledgers import upgraded_postgres, upgraded_sqlite
from tests.postgres import PostgresServer

pytestmark = pytest.mark.anyio


async def test_a_version_9_sqlite_file_upgrades_keeping_its_rows_without_a_risk_source(tmp_path: Path) -> None:
    async with upgraded_sqlite(tmp_path / "ledger.db", 9) as ledger:
        old = await ledger.invocations.get("old-1")
        assert old is not None and (old.status, old.risk, old.risk_source) == ("completed", "read", None)
        await ledger.invocations.record(make_invocation(1, risk="danger", risk_source="destructiveHint"), ["planned"])
        new = await ledger.invocations.get("inv-0001")
        assert new is not None and (new.risk, new.risk_source) == ("danger", "destructiveHint")


async def test_a_version_3_postgres_database_upgrades_keeping_its_rows_without_a_risk_source(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    async with upgraded_postgres(postgres.create_database(), tmp_path / "ledger.key", 3) as ledger:
        old = await ledger.invocations.get("old-1")
        assert old is not None and (old.status, old.risk, old.risk_source) == ("completed", "read", None)
        await ledger.invocations.record(make_invocation(1, risk="write", risk_source="default_risk"), ["planned"])
        new = await ledger.invocations.get("inv-0001")
        assert new is not None and (new.risk, new.risk_source) == ("write", "default_risk")
