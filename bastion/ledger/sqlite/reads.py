"""Reading the `invocations` and `events` tables of a SQLite ledger (`SqliteInvocationReads`), and how a row maps to
an `Invocation` or an `InvocationEvent`. Reads run alone, never inside a write."""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from bastion.ledger.backend import INVOCATION_COLUMNS, prefix_end
from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.models import Invocation, InvocationEvent, Status

_COLUMN_LIST: Final = ", ".join(INVOCATION_COLUMNS)

SELECT: Final = f"SELECT {_COLUMN_LIST} FROM invocations"
SELECT_ONE: Final = f"{SELECT} WHERE id = ?"
NEWEST_FIRST: Final = " ORDER BY created_at DESC, rowid DESC LIMIT ?"
LIST_FILTERS: Final = ("status = ?", "source_id = ?", "session_id = ?", "principal = ?", "parent_id = ?")
COUNT_FILTERS: Final = ("status = ?", "session_id = ?")
# Ids from the prefix up to (not including) the least text after all that start with it: a range on the primary key.
FIND: Final = "SELECT id FROM invocations WHERE id >= :prefix"
FIND_BEFORE: Final = " AND id < :end"
SELECT_EVENTS: Final = (
    "SELECT id, invocation_id, seq, kind, at, detail FROM events WHERE invocation_id = ? ORDER BY seq"
)
NEXT_EXPIRY: Final = "SELECT MIN(expires_at) FROM invocations WHERE status = 'pending'"
COUNT: Final = "SELECT COUNT(*) FROM invocations"


def invocation_from_row(row: Sequence[Any]) -> Invocation:
    data = dict(zip(INVOCATION_COLUMNS, row, strict=True))
    for name in ("args", "result", "drift"):
        if data[name] is not None:
            data[name] = json.loads(data[name])
    for name in ("created_at", "updated_at", "expires_at"):
        if data[name] is not None:
            data[name] = datetime.fromisoformat(data[name])
    return Invocation.model_validate(data)


def event_from_row(row: Sequence[Any]) -> InvocationEvent:
    return InvocationEvent(
        id=row[0],
        invocation_id=row[1],
        seq=row[2],
        kind=row[3],
        at=datetime.fromisoformat(row[4]),
        detail=json.loads(row[5]),
    )


class SqliteInvocationReads:
    """The reads of the invocation store on one SQLite file."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def get(self, invocation_id: str) -> Invocation | None:
        row = await self._db.fetchone(SELECT_ONE, (invocation_id,))
        return invocation_from_row(row) if row is not None else None

    async def find(self, prefix: str, *, principal: str | None = None, limit: int = 2) -> builtins.list[str]:
        """The ids that start with `prefix` (of `principal`'s invocations only, when given), at most `limit`,
        in order. The prefix is taken literally."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        end = prefix_end(prefix)
        sql = (
            FIND
            + (FIND_BEFORE if end is not None else "")
            + (" AND principal = :principal" if principal is not None else "")
            + " ORDER BY id LIMIT :limit"
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
        """Newest first (by created_at, then insertion order), at most `limit`. The principal filter has
        no index of its own (one more page written by every call): it scans newest first until `limit`."""
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
        return [event_from_row(row) for row in await self._db.fetchall(SELECT_EVENTS, (invocation_id,))]

    async def count(self, status: Status | None = None, *, session_id: str | None = None) -> int:
        """How many invocations there are, optionally only those with `status` and of `session_id`."""
        filters = zip(COUNT_FILTERS, (status, session_id), strict=True)
        used = [(clause, value) for clause, value in filters if value is not None]
        where = " WHERE " + " AND ".join(clause for clause, _ in used) if used else ""
        row = await self._db.fetchone(COUNT + where, [value for _, value in used])
        return int(row[0])

    async def next_expiry(self) -> datetime | None:
        """The earliest expires_at among pending invocations (None when none of them expires)."""
        row = await self._db.fetchone(NEXT_EXPIRY)
        return None if row[0] is None else datetime.fromisoformat(row[0])
