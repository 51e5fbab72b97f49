"""The `rate_counts` table on PostgreSQL: the rate limit counted in the database (see bastion.ledger.limits), so
every instance sharing it counts against one budget per key."""

from __future__ import annotations

from datetime import datetime
from typing import Final

from bastion.ledger.limits import oldest_counted, retry_after, second_of
from bastion.ledger.postgres.database import Connection, PostgresDatabase
from bastion.models import Admission

# Admissions of one key are counted one at a time across instances: each takes the key's lock first, and the
# count below sees every admission committed before it got the lock.
_LOCK_KEY: Final = "SELECT pg_advisory_xact_lock(hashtextextended('bastion rate ' || %s, 0))"
_ADMIT: Final = """
    INSERT INTO rate_counts (key, second, count)
    SELECT %(key)s, %(second)s, 1
    WHERE (SELECT COALESCE(SUM(count), 0) FROM rate_counts WHERE key = %(key)s AND second >= %(oldest)s) < %(limit)s
    ON CONFLICT (key, second) DO UPDATE SET count = rate_counts.count + 1
    RETURNING count
"""
_FORGET_KEY: Final = "DELETE FROM rate_counts WHERE key = %s AND second < %s"
_COUNTED: Final = "SELECT second, count FROM rate_counts WHERE key = %s AND second >= %s ORDER BY second"
_FORGET: Final = "DELETE FROM rate_counts WHERE second < %s"


class PostgresLimits:
    """Satisfies `bastion.pipeline.seams.RateLimits` for one PostgreSQL ledger."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def admit(self, key: str, *, per_minute: int, now: datetime) -> float | None:
        """Count one admission of `key` at `now` unless it already had `per_minute` in the window, under the key's
        lock (so two instances cannot both take the last one). None when admitted; else the seconds until one
        more fits (nothing counted)."""
        admission = Admission(key, per_minute, now)
        return await self._db.transaction(lambda conn: admit_in(conn, admission))


async def admit_in(conn: Connection, admission: Admission) -> float | None:
    """`PostgresLimits.admit`'s work, in the caller's transaction (recording a call admits it in the same one)."""
    if admission.per_minute < 1:
        raise ValueError(f"per_minute must be at least 1, got {admission.per_minute}")
    key, now = admission.key, admission.now
    oldest = oldest_counted(now)
    params = {"key": key, "second": second_of(now), "oldest": oldest, "limit": admission.per_minute}
    async with conn.pipeline():
        await conn.execute(_LOCK_KEY, (key,))
        admitted = await conn.execute(_ADMIT, params)
        await conn.execute(_FORGET_KEY, (key, oldest))
    if await admitted.fetchone() is not None:
        return None
    counted = await (await conn.execute(_COUNTED, (key, oldest))).fetchall()
    return retry_after(((row[0], row[1]) for row in counted), per_minute=admission.per_minute, now=now) or 0.0


async def forget_counts(db: PostgresDatabase, now: datetime) -> None:
    """Delete the counts no longer in any key's window: those of keys that stopped coming back (the change feed's
    upkeep, once a minute)."""
    await db.write(_FORGET, (oldest_counted(now),))
