"""Reading the `invocations` and `events` tables of a PostgreSQL ledger (`PostgresInvocationReads`), and how a row
maps to an `Invocation`. Reads run alone, never inside a write."""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from bastion.ledger.backend import INVOCATION_COLUMNS, prefix_end
from bastion.ledger.postgres.database import PostgresDatabase
from bastion.models import Invocation, InvocationEvent, Status

_COLUMN_LIST: Final = ", ".join(INVOCATION_COLUMNS)
_INVOCATION_WIDTH: Final = len(INVOCATION_COLUMNS)

SELECT: Final = f"SELECT {_COLUMN_LIST} FROM invocations"
SELECT_ONE: Final = f"{SELECT} WHERE id = %s"
NEWEST_FIRST: Final = " ORDER BY created_at DESC, position DESC LIMIT %s"
LIST_FILTERS: Final = ("status = %s", "source_id = %s", "session_id = %s", "principal = %s", "parent_id = %s")
COUNT: Final = "SELECT COUNT(*) FROM invocations"
COUNT_FILTERS: Final = ("status = %s", "session_id = %s")
SELECT_EVENTS: Final = (
    "SELECT id, invocation_id, seq, kind, at, detail FROM events WHERE invocation_id = %s ORDER BY seq"
)
NEXT_EXPIRY: Final = "SELECT MIN(expires_at) FROM invocations WHERE status = 'pending'"


def invocation_from_row(row: Sequence[Any]) -> Invocation:
    data = dict(zip(INVOCATION_COLUMNS, row[:_INVOCATION_WIDTH], strict=True))
    for name in ("args", "result", "drift"):
        if data[name] is not None:
            data[name] = json.loads(data[name])
    return Invocation.model_validate(data)


class PostgresInvocationReads:
    """The reads of the invocation store in one PostgreSQL database."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def get(self, invocation_id: str) -> Invocation | None:
        row = await self._db.fetchone(SELECT_ONE, (invocation_id,))
        return invocation_from_row(row) if row is not None else None

    async def find(self, prefix: str, *, principal: str | None = None, limit: int = 2) -> builtins.list[str]:
        """The ids that start with `prefix` (of `principal`'s invocations only, when given), at most `limit`, in
        order. The prefix is taken literally."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        end = prefix_end(prefix)
        sql = (
            "SELECT id FROM invocations WHERE id >= %(prefix)s"
            + (" AND id < %(end)s" if end is not None else "")
            + (" AND principal = %(principal)s" if principal is not None else "")
            + " ORDER BY id LIMIT %(limit)s"
        )
        rows = await self._db.fetchall(sql, {"prefix": prefix, "end": end, "principal": principal, "limit": limit})
        return [row[0] for row in rows]

    async def list(
        self,
        *,
        status: Status | None = None,
        source_id: str | None = None,
        session_id: str | None = None,
        principal: str | None = None,
        parent_id: str | None = None,
        limit: int = 100,
    ) -> builtins.list[Invocation]:
        """Newest first (by created_at, then insertion order), at most `limit`."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        filters = zip(LIST_FILTERS, (status, source_id, session_id, principal, parent_id), strict=True)
        used = [(clause, value) for clause, value in filters if value is not None]
        where = " WHERE " + " AND ".join(clause for clause, _ in used) if used else ""
        params = [value for _, value in used] + [limit]
        rows = await self._db.fetchall(SELECT + where + NEWEST_FIRST, params)
        return [invocation_from_row(row) for row in rows]

    async def events(self, invocation_id: str) -> builtins.list[InvocationEvent]:
        """The invocation's history, oldest first (by seq)."""
        rows = await self._db.fetchall(SELECT_EVENTS, (invocation_id,))
        return [
            InvocationEvent(
                id=row[0], invocation_id=row[1], seq=row[2], kind=row[3], at=row[4], detail=json.loads(row[5])
            )
            for row in rows
        ]

    async def count(self, status: Status | None = None, *, session_id: str | None = None) -> int:
        """How many invocations there are, optionally only those with `status` and of `session_id`."""
        filters = zip(COUNT_FILTERS, (status, session_id), strict=True)
        used = [(clause, value) for clause, value in filters if value is not None]
        where = " WHERE " + " AND ".join(clause for clause, _ in used) if used else ""
        row = await self._db.fetchone(COUNT + where, [value for _, value in used])
        return int(row[0]) if row is not None else 0

    async def next_expiry(self) -> datetime | None:
        """The earliest expires_at among pending invocations (None when none of them expires)."""
        row = await self._db.fetchone(NEXT_EXPIRY)
        expiry: datetime | None = None if row is None else row[0]
        return expiry
