"""The contract's fixtures: every test that takes `ledger` runs once per backend of `BACKENDS`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bastion.ledger import OpenLedger, Redactor
from tests.ledger_contract.backends import BACKENDS, Backend


@pytest.fixture(params=BACKENDS, ids=lambda backend: backend.name)
def backend(request: pytest.FixtureRequest) -> Backend:
    chosen: Backend = request.param
    return chosen


@pytest.fixture
async def ledger(backend: Backend, tmp_path: Path) -> AsyncIterator[OpenLedger]:
    """A ledger on a fresh store."""
    async with await backend.open_fresh(tmp_path, Redactor()) as opened:
        yield opened


@pytest.fixture
async def another(backend: Backend, ledger: OpenLedger) -> AsyncIterator[OpenLedger]:
    """A second connection to the store of `ledger`, as another instance would open it."""
    async with await backend.open_another(ledger, Redactor()) as opened:
        yield opened
