"""Reading the `invocations` and `events` tables, the same on both backends (`InvocationReads`, the base of
`SqliteInvocationReads` and `PostgresInvocationReads`): the statements differ only in their placeholder and in what
orders rows inserted at one moment, and the backends in how a row and a timestamp come back. Reads run alone, never
inside a write."""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final

from bastion.ledger.backend import INVOCATION_COLUMNS, prefix_end
from bastion.models import Invocation, InvocationEvent, Status

COUNT: Final = "SELECT COUNT(*) FROM invocations"
NEXT_EXPIRY: Final = "SELECT MIN(expires_at) FROM invocations WHERE status = 'pending'"
_SELECT: Final = f"SELECT {', '.join(INVOCATION_COLUMNS)} FROM invocations"
_LIST_FILTERS: Final = ("status", "source_id", "session_id", "principal", "parent_id")
_COUNT_FILTERS: Final = ("status", "session_id")


class InvocationReads:
    """The reads of the invocation store over one backend's database: `placeholder` is its parameter mark,
    `insertion` the column that orders rows in the order they were inserted, `from_row` makes an invocation of a row,
    `moment` a datetime of a timestamp as it comes back."""

    def __init__(
        self,
        db: Any,
        *,
        placeholder: str,
        insertion: str,
        from_row: Callable[[Sequence[Any]], Invocation],
        moment: Callable[[Any], datetime],
    ) -> None:
        self._db = db
        self._p = placeholder
        self._from_row = from_row
        self._moment = moment
        self._select_one = f"{_SELECT} WHERE id = {placeholder}"
        self._newest_first = f" ORDER BY created_at DESC, {insertion} DESC LIMIT {placeholder}"
        self._events = (
            "SELECT id, invocation_id, seq, kind, at, detail FROM events "
            f"WHERE invocation_id = {placeholder} ORDER BY seq"
        )

    async def get(self, invocation_id: str) -> Invocation | None:
        rows = await self._db.fetchall(self._select_one, (invocation_id,))
        return self._from_row(rows[0]) if rows else None

    async def find(self, prefix: str, *, principal: str | None = None, limit: int = 2) -> builtins.list[str]:
        """The ids that start with `prefix` (of `principal`'s invocations only, when given), at most `limit`, in
        order. The prefix is taken literally: the ids from it up to (not including) the least text after all that
        start with it, a range on the primary key."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        end = prefix_end(prefix)
        clauses, params = [f"id >= {self._p}"], [prefix]
        if end is not None:
            clauses.append(f"id < {self._p}")
            params.append(end)
        if principal is not None:
            clauses.append(f"principal = {self._p}")
            params.append(principal)
        sql = f"SELECT id FROM invocations WHERE {' AND '.join(clauses)} ORDER BY id LIMIT {self._p}"
        return [row[0] for row in await self._db.fetchall(sql, [*params, limit])]

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
        """Newest first (by created_at, then insertion order), at most `limit`. The principal filter has no index of
        its own (one more page written by every call): it scans newest first until `limit`."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        where, params = self._where(_LIST_FILTERS, (status, source_id, session_id, principal, parent_id))
        rows = await self._db.fetchall(_SELECT + where + self._newest_first, [*params, limit])
        return [self._from_row(row) for row in rows]

    async def events(self, invocation_id: str) -> builtins.list[InvocationEvent]:
        """The invocation's history, oldest first (by seq)."""
        rows = await self._db.fetchall(self._events, (invocation_id,))
        return [
            InvocationEvent(
                id=row[0],
                invocation_id=row[1],
                seq=row[2],
                kind=row[3],
                at=self._moment(row[4]),
                detail=json.loads(row[5]),
            )
            for row in rows
        ]

    async def count(self, status: Status | None = None, *, session_id: str | None = None) -> int:
        """How many invocations there are, optionally only those with `status` and of `session_id`."""
        where, params = self._where(_COUNT_FILTERS, (status, session_id))
        rows = await self._db.fetchall(COUNT + where, params)
        return int(rows[0][0]) if rows else 0

    async def next_expiry(self) -> datetime | None:
        """The earliest expires_at among pending invocations (None when none of them expires)."""
        rows = await self._db.fetchall(NEXT_EXPIRY)
        return None if not rows or rows[0][0] is None else self._moment(rows[0][0])

    def _where(self, columns: Sequence[str], values: Sequence[object]) -> tuple[str, builtins.list[object]]:
        """A WHERE clause testing each column whose value is given, and the values, in order."""
        used = [(column, value) for column, value in zip(columns, values, strict=True) if value is not None]
        if not used:
            return "", []
        return " WHERE " + " AND ".join(f"{column} = {self._p}" for column, _ in used), [value for _, value in used]
