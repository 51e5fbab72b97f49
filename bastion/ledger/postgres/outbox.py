"""The `outbox` table on PostgreSQL: webhook messages kept until delivered (see `bastion.pipeline.seams.Outbox`)."""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Final

from bastion.ledger.postgres.database import PostgresDatabase
from bastion.models import OutboxItem

_ENQUEUE: Final = """
    INSERT INTO outbox (target, event_id, body, next_at) VALUES (%s, %s, %s, %s)
    ON CONFLICT (target, event_id) DO NOTHING
    RETURNING id
"""
_LAST: Final = "SELECT MAX(event_id) FROM outbox WHERE target = %s"
# SKIP LOCKED: instances claiming at once take different items, never the same one.
_CLAIM: Final = """
    UPDATE outbox SET next_at = %(until)s
    WHERE id IN (
        SELECT id FROM outbox
        WHERE target = %(target)s AND delivered_at IS NULL AND next_at <= %(now)s ORDER BY id LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id, target, event_id, body, attempts
"""
_DELIVERED: Final = "UPDATE outbox SET delivered_at = %s, next_at = NULL WHERE id = %s"
_RETRY: Final = "UPDATE outbox SET attempts = attempts + 1, next_at = %s, last_error = %s WHERE id = %s"
_NEXT_DUE: Final = "SELECT MIN(next_at) FROM outbox WHERE target = %s AND delivered_at IS NULL AND next_at IS NOT NULL"


class PostgresOutbox:
    """Satisfies `bastion.pipeline.seams.Outbox` for one PostgreSQL ledger."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def enqueue(self, target: str, event_id: int, body: str, *, now: datetime) -> bool:
        return bool(await self._db.write(_ENQUEUE, (target, event_id, body, now)))

    async def last_event(self, target: str) -> int | None:
        row = await self._db.fetchone(_LAST, (target,))
        return None if row is None or row[0] is None else int(row[0])

    async def claim(self, target: str, *, now: datetime, until: datetime, limit: int) -> builtins.list[OutboxItem]:
        rows = await self._db.write(_CLAIM, {"target": target, "now": now, "until": until, "limit": limit})
        items = [OutboxItem(id=r[0], target=r[1], event_id=r[2], body=r[3], attempts=r[4]) for r in rows]
        return sorted(items, key=lambda item: item.id)

    async def delivered(self, item_id: int, *, now: datetime) -> None:
        await self._db.write(_DELIVERED, (now, item_id))

    async def retry(self, item_id: int, *, at: datetime | None, error: str) -> None:
        await self._db.write(_RETRY, (at, error, item_id))

    async def next_due(self, target: str) -> datetime | None:
        row = await self._db.fetchone(_NEXT_DUE, (target,))
        due: datetime | None = None if row is None else row[0]
        return due
