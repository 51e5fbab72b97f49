"""The `rate_counts` table: the rate limit counted in the ledger file (see bastion.ledger.limits), so every
process sharing the file counts against one budget per key."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Final

from bastion.ledger.limits import oldest_counted, retry_after, second_of
from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.models import Admission

_COUNTED: Final = "SELECT second, count FROM rate_counts WHERE key = ? AND second >= ? ORDER BY second"
# Counted and admitted in one statement (under the write lock): a row comes back only when it was admitted.
_ADMIT: Final = """
    INSERT INTO rate_counts (key, second, count)
    SELECT :key, :second, 1
    WHERE (SELECT COALESCE(SUM(count), 0) FROM rate_counts WHERE key = :key AND second >= :oldest) < :limit
    ON CONFLICT (key, second) DO UPDATE SET count = count + 1
    RETURNING count
"""
_FORGET_KEY: Final = "DELETE FROM rate_counts WHERE key = ? AND second < ?"
_FORGET: Final = "DELETE FROM rate_counts WHERE second < ?"
_ANY_FORGOTTEN: Final = "SELECT 1 FROM rate_counts WHERE second < ? LIMIT 1"


class SqliteLimits:
    """Satisfies `bastion.pipeline.seams.RateLimits` for one SQLite ledger file."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def admit(self, key: str, *, per_minute: int, now: datetime) -> float | None:
        """Count one admission of `key` at `now` unless it already had `per_minute` in the window, in one
        transaction under the write lock (so two processes cannot both take the last one). None when admitted;
        else the seconds until one more fits (nothing counted)."""
        admission = Admission(key, per_minute, now)
        return await self._db.write(lambda conn: admit_in(conn, admission), events=False)


def admit_in(conn: sqlite3.Connection, admission: Admission) -> float | None:
    """`SqliteLimits.admit`'s work, in the caller's transaction (recording a call admits it in the same one). The
    key's buckets that left the window are deleted when a new bucket starts: once a second at most."""
    if admission.per_minute < 1:
        raise ValueError(f"per_minute must be at least 1, got {admission.per_minute}")
    key, now = admission.key, admission.now
    oldest = oldest_counted(now)
    params = {"key": key, "second": second_of(now), "oldest": oldest, "limit": admission.per_minute}
    admitted = conn.execute(_ADMIT, params).fetchall()
    if admitted:
        if admitted[0][0] == 1:
            conn.execute(_FORGET_KEY, (key, oldest))
        return None
    counted = conn.execute(_COUNTED, (key, oldest)).fetchall()
    return retry_after(counted, per_minute=admission.per_minute, now=now) or 0.0


async def forget_counts(db: SqliteDatabase, now: datetime) -> None:
    """Delete the counts no longer in any key's window: those of keys that stopped coming back (the change feed's
    upkeep, once a minute). Only writes when there is something to delete, so a process that only watches the
    ledger does not take its write lock for nothing."""
    oldest = oldest_counted(now)
    if await db.fetchone(_ANY_FORGOTTEN, (oldest,)) is None:
        return

    def work(conn: sqlite3.Connection) -> None:
        conn.execute(_FORGET, (oldest,))

    await db.write(work)
