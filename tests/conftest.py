"""Shared fixtures. The anyio backend is pinned to asyncio (aiosqlite is asyncio-only). PostgreSQL tests share one
server of the session's own (tests/postgres.py), stopped when the session ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import settings

from tests.postgres import PostgresServer
from tests.postgres_session import shared_server, stop_shared_server
from tests.processes import bastion_env, write_config

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


@pytest.fixture
def configured(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A configuration directory for `bastion serve` (the notes demo, a SQLite ledger in it, quick heartbeats),
    its notes file and the environment to run it in."""
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"groceries": "milk"}))
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False)
    (config / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///state/ledger.db"\nstartup_wait_seconds = 20\n'
        "[approvals]\nheartbeat_seconds = 0.2\nexpiry_seconds = 60\n"
    )
    return config, notes, bastion_env(tmp_path / "home")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stop_shared_server()
