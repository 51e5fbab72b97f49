"""Shared fixtures. The anyio backend is pinned to asyncio (aiosqlite is asyncio-only). PostgreSQL tests share one
server of the session's own (tests/postgres.py), stopped when the session ends."""

from __future__ import annotations

import pytest
from hypothesis import settings

from tests.postgres import PostgresServer
from tests.postgres_session import shared_server, stop_shared_server

# No timing assertions (a test may not fail because the machine is busy): property tests run without hypothesis's
# per-example deadline.
settings.register_profile("bastion", deadline=None)
settings.load_profile("bastion")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def postgres() -> PostgresServer:
    """The session's PostgreSQL server (skipped, or failed under BASTION_REQUIRE_POSTGRES=1, when not installed)."""
    return shared_server()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stop_shared_server()
