"""The `outbox` table: webhook messages kept until delivered (see `bastion.pipeline.seams.Outbox`)."""

from __future__ import annotations

import builtins
import sqlite3
from datetime import datetime
from typing import Final

from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.ledger.sqlite.schema import optional_timestamp, timestamp
from bastion.models import OutboxItem

_ENQUEUE: Final = """
    INSERT INTO outbox (target, event_id, body, next_at) VALUES (?, ?, ?, ?)
    ON CONFLICT (target, event_id) DO NOTHING
"""
_LAST: Final = "SELECT MAX(event_id) FROM outbox WHERE target = ?"
# Claimed in one statement under the write lock: two processes never get the same item at once.
_CLAIM: Final = """
    UPDATE outbox SET next_at = :until
    WHERE id IN (
        SELECT id FROM outbox
        WHERE target = :target AND delivered_at IS NULL AND next_at <= :now ORDER BY id LIMIT :limit
    )
    RETURNING id, target, event_id, body, attempts
"""
_DELIVERED: Final = "UPDATE outbox SET delivered_at = ?, next_at = NULL WHERE id = ?"
_RETRY: Final = "UPDATE outbox SET attempts = attempts + 1, next_at = ?, last_error = ? WHERE id = ?"
_NEXT_DUE: Final = "SELECT MIN(next_at) FROM outbox WHERE target = ? AND delivered_at IS NULL AND next_at IS NOT NULL"


class SqliteOutbox:
    """Satisfies `bastion.pipeline.seams.Outbox` for one SQLite ledger file."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def enqueue(self, target: str, event_id: int, body: str, *, now: datetime) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            return conn.execute(_ENQUEUE, (target, event_id, body, timestamp(now))).rowcount == 1

        return await self._db.write(work, events=False)

    async def last_event(self, target: str) -> int | None:
        row = await self._db.fetchone(_LAST, (target,))
        return None if row is None or row[0] is None else int(row[0])

    async def claim(self, target: str, *, now: datetime, until: datetime, limit: int) -> builtins.list[OutboxItem]:
        params = {"target": target, "now": timestamp(now), "until": timestamp(until), "limit": limit}

        def work(conn: sqlite3.Connection) -> builtins.list[OutboxItem]:
            rows = conn.execute(_CLAIM, params).fetchall()
            items = [OutboxItem(id=r[0], target=r[1], event_id=r[2], body=r[3], attempts=r[4]) for r in rows]
            return sorted(items, key=lambda item: item.id)

        return await self._db.write(work, events=False)

    async def delivered(self, item_id: int, *, now: datetime) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(_DELIVERED, (timestamp(now), item_id))

        await self._db.write(work, events=False)

    async def retry(self, item_id: int, *, at: datetime | None, error: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(_RETRY, (optional_timestamp(at), error, item_id))

        await self._db.write(work, events=False)

    async def next_due(self, target: str) -> datetime | None:
        row = await self._db.fetchone(_NEXT_DUE, (target,))
        return None if row is None or row[0] is None else datetime.fromisoformat(row[0])
