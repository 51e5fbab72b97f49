"""The `instances` table on PostgreSQL: which Bastion instances share this ledger, and until when each one's lease
holds (see bastion.pipeline.instances for how the pipeline uses it)."""

from __future__ import annotations

from datetime import datetime
from typing import Final

from bastion.ledger.postgres.database import PostgresDatabase

_RENEW: Final = """
    INSERT INTO instances (id, started_at, renewed_at, lease_until) VALUES (%(id)s, %(now)s, %(now)s, %(until)s)
    ON CONFLICT (id) DO UPDATE SET renewed_at = excluded.renewed_at, lease_until = excluded.lease_until
"""
_RELEASE: Final = "UPDATE instances SET lease_until = %(now)s, renewed_at = %(now)s WHERE id = %(id)s"
_LEASES: Final = "SELECT id, lease_until FROM instances"


class PostgresInstances:
    """Satisfies `bastion.pipeline.seams.InstanceRegistry` for one PostgreSQL ledger."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def renew(self, instance_id: str, *, now: datetime, until: datetime) -> None:
        """Register the instance, or extend its lease, up to `until`."""
        await self._db.write(_RENEW, {"id": instance_id, "now": now, "until": until})

    async def release(self, instance_id: str, *, now: datetime) -> None:
        """End the instance's lease now: it stopped, and others may take over its work at once."""
        await self._db.write(_RELEASE, {"id": instance_id, "now": now})

    async def leases(self) -> dict[str, datetime]:
        """Every instance that ever registered, and when its lease ends (or ended)."""
        return {row[0]: row[1] for row in await self._db.fetchall(_LEASES)}
