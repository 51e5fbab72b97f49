"""The `grants` table on SQLite: standing approvals (`SqliteGrants`) and the statements the decision that makes one
shares (see bastion.ledger.sqlite.invocations). A grant's row is never deleted: an ended one says who approved what,
until when, and who revoked it."""

from __future__ import annotations

import builtins
import json
import sqlite3
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, Final

from bastion.errors import NotFound
from bastion.ledger.backend import GRANT_COLUMNS
from bastion.ledger.kept import GRANTS
from bastion.ledger.sqlite.chain import recorded
from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.ledger.sqlite.schema import optional_timestamp, timestamp
from bastion.models import Grant
from bastion.program import bastion_command

_COLUMN_LIST: Final = ", ".join(GRANT_COLUMNS)
_STANDING: Final = "revoked_at IS NULL AND (expires_at IS NULL OR expires_at > :now)"

# Every change returns the row as the audit chain records it (bastion.ledger.kept).
_INSERT: Final = (
    f"INSERT INTO grants ({_COLUMN_LIST}) VALUES ({', '.join(':' + c for c in GRANT_COLUMNS)}) {GRANTS.returning}"
)
# Served by the partial index on the policy key of unrevoked grants: a held call asks it, an allowed one never does.
_COVERING: Final = f"""
    SELECT {_COLUMN_LIST} FROM grants
    WHERE policy_key = :key AND {_STANDING}
      AND (scope = 'always' OR (scope = 'session' AND session_id = :session) OR (scope = 'hour' AND principal IS :who))
    ORDER BY created_at, id
"""
_ALL: Final = f"SELECT {_COLUMN_LIST} FROM grants ORDER BY created_at DESC, id DESC LIMIT :limit"
_ALL_STANDING: Final = f"SELECT {_COLUMN_LIST} FROM grants WHERE {_STANDING} ORDER BY created_at DESC, id DESC"
_REVOKE: Final = f"""
    UPDATE grants SET revoked_at = :at, revoked_by = :by
    WHERE id = :id AND {_STANDING.replace(":now", ":at")}
    {GRANTS.returning}
"""
_REVOKE_KEY: Final = f"""
    UPDATE grants SET revoked_at = :at, revoked_by = :by
    WHERE policy_key = :key AND {_STANDING.replace(":now", ":at")}
    {GRANTS.returning}
"""


class SqliteGrants:
    """Standing approvals on one SQLite file; satisfies `bastion.pipeline.seams.GrantStore`."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def add(self, grant: Grant) -> None:
        """Store a grant made without a decision (imported); a decision stores its own (`decide(grant=...)`)."""
        await self._db.write(lambda conn: insert_grant(conn, grant))

    async def covering(
        self, key: str, *, session_id: str, principal: str | None, now: datetime
    ) -> builtins.list[Grant]:
        """The grants standing at `now` on `key` that cover a call in this session by this caller, oldest first."""
        rows = await self._db.fetchall(
            _COVERING, {"key": key, "now": timestamp(now), "session": session_id, "who": principal}
        )
        return [grant_from_row(row) for row in rows]

    async def grants(self, *, standing_at: datetime | None = None, limit: int = 200) -> builtins.list[Grant]:
        """Grants, newest first: those standing at `standing_at`, or (None) the last `limit` made, ended or not."""
        if standing_at is not None:
            rows = await self._db.fetchall(_ALL_STANDING, {"now": timestamp(standing_at)})
        else:
            rows = await self._db.fetchall(_ALL, {"limit": limit})
        return [grant_from_row(row) for row in rows]

    async def revoke(self, grant_id: str, *, by: str, now: datetime) -> Grant:
        """End the grant `grant_id` at `now`. NotFound when no grant of that id stands."""

        def work(conn: sqlite3.Connection) -> list[Any]:
            at = timestamp(now)
            return recorded(conn, _REVOKE, {"id": grant_id, "at": at, "by": by}, GRANTS, "grant_revoked", at)

        rows = await self._db.write(work)
        if not rows:
            raise NotFound(f"no standing grant {grant_id!r}; see `{bastion_command()} grants list`")
        return grant_from_row(rows[0])

    async def revoke_key(self, key: str, *, by: str, now: datetime) -> builtins.list[Grant]:
        """End every grant standing on `key` at `now` (its action drifted); the grants it ended."""

        def work(conn: sqlite3.Connection) -> list[Any]:
            at = timestamp(now)
            return recorded(conn, _REVOKE_KEY, {"key": key, "at": at, "by": by}, GRANTS, "grant_revoked", at)

        return [grant_from_row(row) for row in await self._db.write(work)]


def insert_grant(conn: sqlite3.Connection, grant: Grant) -> None:
    """Store `grant`, inside the caller's transaction."""
    row = grant.model_dump()
    for moment in ("created_at", "expires_at", "revoked_at"):
        row[moment] = optional_timestamp(row[moment])
    recorded(conn, _INSERT, row, GRANTS, "grant_made", row["created_at"])


_BY_IDS: Final = f"SELECT {_COLUMN_LIST} FROM grants WHERE id IN (SELECT value FROM json_each(?))"


async def grants_by_id(db: SqliteDatabase, ids: Collection[str]) -> dict[str, Grant]:
    """The grants of these ids that exist, by id."""
    if not ids:
        return {}
    rows = await db.fetchall(_BY_IDS, (json.dumps(sorted(ids)),))
    return {grant.id: grant for grant in map(grant_from_row, rows)}


def grant_from_row(row: Sequence[Any]) -> Grant:
    data = dict(zip(GRANT_COLUMNS, row, strict=True))
    for moment in ("created_at", "expires_at", "revoked_at"):
        if data[moment] is not None:
            data[moment] = datetime.fromisoformat(data[moment])
    return Grant(**data)
