"""The `instances` table: which Bastion instances share this ledger, and until when each one's lease holds.

An instance renews its lease while it runs and releases it when it stops; one whose lease lapsed is gone,
whatever host it ran on (see bastion.pipeline.instances for how the pipeline uses this).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Final

from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.ledger.sqlite.schema import timestamp

_RENEW: Final = """
    INSERT INTO instances (id, started_at, renewed_at, lease_until) VALUES (:id, :now, :now, :until)
    ON CONFLICT (id) DO UPDATE SET renewed_at = :now, lease_until = :until
"""
_RELEASE: Final = "UPDATE instances SET lease_until = :now, renewed_at = :now WHERE id = :id"
_LEASES: Final = "SELECT id, lease_until FROM instances"


class SqliteInstances:
    """Satisfies `bastion.pipeline.seams.InstanceRegistry` for one SQLite ledger file."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def renew(self, instance_id: str, *, now: datetime, until: datetime) -> None:
        """Register the instance, or extend its lease, up to `until`."""
        params = {"id": instance_id, "now": timestamp(now), "until": timestamp(until)}

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(_RENEW, params)

        await self._db.write(work)

    async def release(self, instance_id: str, *, now: datetime) -> None:
        """End the instance's lease now: it stopped, and others may take over its work at once."""
        params = {"id": instance_id, "now": timestamp(now)}

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(_RELEASE, params)

        await self._db.write(work)

    async def leases(self) -> dict[str, datetime]:
        """Every instance that ever registered, and when its lease ends (or ended)."""
        return {row[0]: datetime.fromisoformat(row[1]) for row in await self._db.fetchall(_LEASES)}
