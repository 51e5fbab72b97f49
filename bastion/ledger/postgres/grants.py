"""The `grants` table on PostgreSQL: standing approvals (`PostgresGrants`), and the statement the decision that makes
one shares (see bastion.ledger.postgres.invocations). A grant's row is never deleted."""

from __future__ import annotations

import builtins
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, Final

from bastion.errors import NotFound
from bastion.ledger.backend import GRANT_COLUMNS
from bastion.ledger.kept import GRANTS
from bastion.ledger.postgres.chain import recorded
from bastion.ledger.postgres.database import Connection, PostgresDatabase
from bastion.models import Grant
from bastion.program import bastion_command

_COLUMN_LIST: Final = ", ".join(GRANT_COLUMNS)
_STANDING: Final = "revoked_at IS NULL AND (expires_at IS NULL OR expires_at > %(now)s)"

# Every change returns the row as the audit chain records it (bastion.ledger.kept).
_INSERT: Final = (
    f"INSERT INTO grants ({_COLUMN_LIST}) VALUES ({', '.join(f'%({c})s' for c in GRANT_COLUMNS)}) {GRANTS.returning}"
)
# Served by the partial index on the policy key of unrevoked grants: a held call asks it, an allowed one never does.
_COVERING: Final = f"""
    SELECT {_COLUMN_LIST} FROM grants
    WHERE policy_key = %(key)s AND {_STANDING}
      AND (scope = 'always' OR (scope = 'session' AND session_id = %(session)s)
           OR (scope = 'hour' AND principal IS NOT DISTINCT FROM %(who)s))
    ORDER BY created_at, id
"""
_ALL: Final = f"SELECT {_COLUMN_LIST} FROM grants ORDER BY created_at DESC, id DESC LIMIT %(limit)s"
_ALL_STANDING: Final = f"SELECT {_COLUMN_LIST} FROM grants WHERE {_STANDING} ORDER BY created_at DESC, id DESC"
_REVOKE: Final = f"""
    UPDATE grants SET revoked_at = %(now)s, revoked_by = %(by)s
    WHERE id = %(id)s AND {_STANDING}
    {GRANTS.returning}
"""
_REVOKE_KEY: Final = f"""
    UPDATE grants SET revoked_at = %(now)s, revoked_by = %(by)s
    WHERE policy_key = %(key)s AND {_STANDING}
    {GRANTS.returning}
"""


class PostgresGrants:
    """Standing approvals in one PostgreSQL database; satisfies `bastion.pipeline.seams.GrantStore`."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def add(self, grant: Grant) -> None:
        """Store a grant made without a decision (imported); a decision stores its own (`decide(grant=...)`)."""
        await self._db.transaction(lambda conn: insert_grant(conn, grant))

    async def covering(
        self, key: str, *, session_id: str, principal: str | None, now: datetime
    ) -> builtins.list[Grant]:
        """The grants standing at `now` on `key` that cover a call in this session by this caller, oldest first."""
        rows = await self._db.fetchall(_COVERING, {"key": key, "now": now, "session": session_id, "who": principal})
        return [_grant_from_row(row) for row in rows]

    async def grants(self, *, standing_at: datetime | None = None, limit: int = 200) -> builtins.list[Grant]:
        """Grants, newest first: those standing at `standing_at`, or (None) the last `limit` made, ended or not."""
        if standing_at is not None:
            rows = await self._db.fetchall(_ALL_STANDING, {"now": standing_at})
        else:
            rows = await self._db.fetchall(_ALL, {"limit": limit})
        return [_grant_from_row(row) for row in rows]

    async def revoke(self, grant_id: str, *, by: str, now: datetime) -> Grant:
        """End the grant `grant_id` at `now`. NotFound when no grant of that id stands."""
        params = {"id": grant_id, "now": now, "by": by}
        rows = await self._db.transaction(lambda conn: recorded(conn, _REVOKE, params, GRANTS, "grant_revoked", now))
        if not rows:
            raise NotFound(f"no standing grant {grant_id!r}; see `{bastion_command()} grants list`")
        return _grant_from_row(rows[0])

    async def revoke_key(self, key: str, *, by: str, now: datetime) -> builtins.list[Grant]:
        """End every grant standing on `key` at `now` (its action drifted); the grants it ended."""
        params = {"key": key, "now": now, "by": by}
        rows = await self._db.transaction(
            lambda conn: recorded(conn, _REVOKE_KEY, params, GRANTS, "grant_revoked", now)
        )
        return [_grant_from_row(row) for row in rows]


async def insert_grant(conn: Connection, grant: Grant) -> None:
    """Store `grant`, inside the caller's transaction."""
    await recorded(conn, _INSERT, grant.model_dump(), GRANTS, "grant_made", grant.created_at)


_BY_IDS: Final = f"SELECT {_COLUMN_LIST} FROM grants WHERE id = ANY(%s)"


async def grants_by_id(db: PostgresDatabase, ids: Collection[str]) -> dict[str, Grant]:
    """The grants of these ids that exist, by id."""
    if not ids:
        return {}
    rows = await db.fetchall(_BY_IDS, (sorted(ids),))
    return {grant.id: grant for grant in map(_grant_from_row, rows)}


def _grant_from_row(row: Sequence[Any]) -> Grant:
    return Grant(**dict(zip(GRANT_COLUMNS, row, strict=True)))
