"""The ledger backends the contract runs against: each one is an entry of `BACKENDS`.

An entry opens a ledger on a fresh store, and another connection to that same store (what a second Bastion
instance or the CLI would open), for races and for changes made elsewhere. PostgreSQL's store is a new
database on the test session's own server (tests/postgres_session.py): without PostgreSQL installed its tests are
skipped, or fail under BASTION_REQUIRE_POSTGRES=1.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.ledger.postgres import feed as postgres_feed
from bastion.ledger.sqlite import feed as sqlite_feed
from tests.postgres_session import shared_server


@dataclass(frozen=True)
class Backend:
    """How the contract opens ledgers of one backend."""

    name: str
    open_fresh: Callable[[Path, Redactor], Awaitable[OpenLedger]]
    """Open a ledger on a new, empty store; the directory is the test's own, for whatever files it needs."""
    open_another: Callable[[OpenLedger, Redactor], Awaitable[OpenLedger]]
    """Open another connection to the store of an open ledger (same store, same key of argument hashes)."""
    changes_kept: int
    """How many recent changes the feed keeps for a waiter that fell behind (beyond them: ChangesLost)."""


async def _open_fresh_sqlite(directory: Path, redactor: Redactor) -> OpenLedger:
    return await open_ledger(directory / "ledger.db", redactor=redactor)


async def _open_another_sqlite(ledger: OpenLedger, redactor: Redactor) -> OpenLedger:
    return await open_ledger(ledger.url, redactor=redactor)


SQLITE: Final = Backend(
    name="sqlite", open_fresh=_open_fresh_sqlite, open_another=_open_another_sqlite, changes_kept=sqlite_feed.KEPT
)


async def _open_fresh_postgres(directory: Path, redactor: Redactor) -> OpenLedger:
    url = shared_server().create_database()
    return await open_ledger(url, redactor=redactor, key_path=directory / "ledger.key")


async def _open_another_postgres(ledger: OpenLedger, redactor: Redactor) -> OpenLedger:
    return await open_ledger(ledger.url, redactor=redactor, key_path=ledger.key_path)


POSTGRES: Final = Backend(
    name="postgresql",
    open_fresh=_open_fresh_postgres,
    open_another=_open_another_postgres,
    changes_kept=postgres_feed.KEPT,
)

BACKENDS: Final[tuple[Backend, ...]] = (SQLITE, POSTGRES)
