"""The `tokens` table: the SQLite token store (`SqliteTokens`) and its statements. Tokens are
stored as the SHA-256 of their secret, never the secret (see bastion.ledger.tokens).

The functions taking a `sqlite3.Connection` run inside the transaction `SqliteDatabase.write` opened for them.
A revoked token's row is kept (who had access, and when) and its name may be given to a new token.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from bastion.errors import Conflict, NotFound
from bastion.ledger.kept import TOKENS
from bastion.ledger.sqlite.chain import recorded
from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.ledger.sqlite.schema import timestamp
from bastion.ledger.tokens import (
    looks_like_secret,
    new_secret,
    secret_hash,
    validate_token_name,
    validate_token_role,
)
from bastion.models import Principal, Role, TokenInfo
from bastion.program import bastion_command

_COLUMNS: Final = ("name", "role", "profile", "created_at", "revoked_at")
_COLUMN_LIST: Final = ", ".join(_COLUMNS)

SELECT_ALL: Final = f"SELECT {_COLUMN_LIST} FROM tokens ORDER BY created_at DESC, id DESC"
# Served by the unique index on secret_hash: one row at most, no write.
AUTHENTICATE: Final = "SELECT name, role, profile FROM tokens WHERE secret_hash = ? AND revoked_at IS NULL"
HAS_ACTIVE: Final = "SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_at IS NULL)"
HAS_APPROVER: Final = "SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_at IS NULL AND role IN ('owner', 'admin'))"
_ACTIVE_NAMED: Final = "SELECT 1 FROM tokens WHERE name = ? AND revoked_at IS NULL"
# Every change returns the row as the audit chain records it (bastion.ledger.kept).
_INSERT: Final = (
    f"INSERT INTO tokens (name, role, profile, secret_hash, created_at) VALUES (?, ?, ?, ?, ?) {TOKENS.returning}"
)
_REVOKE: Final = f"UPDATE tokens SET revoked_at = :now WHERE name = :name AND revoked_at IS NULL {TOKENS.returning}"


class SqliteTokens:
    """Bearer tokens on one SQLite file; satisfies `bastion.pipeline.seams.TokenStore`."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def create_token(self, name: str, *, role: Role, profile: str | None, now: datetime) -> str:
        """Store a new token created at `now` and return its secret: the only time it exists outside the
        caller, since the ledger keeps just its SHA-256.

        Raises ValueError for a malformed name, an unknown role or a profile on a non-agent token, and
        Conflict when an active token already has the name.
        """
        validate_token_name(name)
        validate_token_role(role, profile)
        secret = new_secret()
        digest = secret_hash(secret)

        def work(conn: sqlite3.Connection) -> None:
            insert_token(conn, name=name, role=role, profile=profile, digest=digest, now=now)

        await self._db.write(work)
        return secret

    async def revoke_token(self, name: str, *, now: datetime) -> TokenInfo:
        """Revoke the active token `name` at `now`; its secret authenticates no more. Raises NotFound when
        there is no active token of that name."""

        def work(conn: sqlite3.Connection) -> TokenInfo:
            return revoke_token(conn, name=name, now=now)

        return await self._db.write(work)

    async def tokens(self) -> list[TokenInfo]:
        """Every token, active and revoked, newest first; never a secret (the ledger has none)."""
        return [token_from_row(row) for row in await self._db.fetchall(SELECT_ALL)]

    async def authenticate(self, secret: str) -> Principal | None:
        """The principal of the active token with this secret, else None.

        Runs on every HTTP request: input without a token's shape is refused without a query, the rest is
        one lookup by the SHA-256 of the secret on a unique index. It never writes.
        """
        if not looks_like_secret(secret):
            return None
        row = await self._db.fetchone(AUTHENTICATE, (secret_hash(secret),))
        return principal_from_row(row) if row is not None else None

    async def has_tokens(self) -> bool:
        """Whether any active token exists (then every HTTP caller must present one)."""
        row = await self._db.fetchone(HAS_ACTIVE)
        return bool(row[0])

    async def has_approver_tokens(self) -> bool:
        """Whether an active owner or admin token exists (then local decisions need one too)."""
        row = await self._db.fetchone(HAS_APPROVER)
        return bool(row[0])


def insert_token(
    conn: sqlite3.Connection, *, name: str, role: Role, profile: str | None, digest: str, now: datetime
) -> None:
    """Store a token by the hash of its secret. Raises Conflict when an active token has the name."""
    if conn.execute(_ACTIVE_NAMED, (name,)).fetchone() is not None:
        raise Conflict(
            f"a token named {name!r} is already active; revoke it first ({bastion_command()} tokens revoke {name}) "
            "or pick another name"
        )
    at = timestamp(now)
    recorded(conn, _INSERT, (name, role, profile, digest, at), TOKENS, "token_created", at)


def revoke_token(conn: sqlite3.Connection, *, name: str, now: datetime) -> TokenInfo:
    """Mark the active token `name` revoked at `now`. Raises NotFound when there is none."""
    at = timestamp(now)
    rows = recorded(conn, _REVOKE, {"name": name, "now": at}, TOKENS, "token_revoked", at)
    if not rows:
        raise NotFound(f"no active token named {name!r}; see `{bastion_command()} tokens list`")
    return token_from_row([rows[0][TOKENS.columns.index(column)] for column in _COLUMNS])


def token_from_row(row: Sequence[Any]) -> TokenInfo:
    data = dict(zip(_COLUMNS, row, strict=True))
    revoked_at = data["revoked_at"]
    return TokenInfo(
        name=data["name"],
        role=data["role"],
        profile=data["profile"],
        created_at=datetime.fromisoformat(data["created_at"]),
        revoked_at=None if revoked_at is None else datetime.fromisoformat(revoked_at),
    )


def principal_from_row(row: Sequence[Any]) -> Principal:
    name, role, profile = row
    return Principal(name=name, role=role, profile=profile)
