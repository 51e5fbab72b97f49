"""The `tokens` table on PostgreSQL: the token store (`PostgresTokens`). Tokens are stored as the
SHA-256 of their secret, never the secret (see bastion.ledger.tokens); a revoked token keeps its row."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import psycopg

from bastion.errors import Conflict, NotFound
from bastion.ledger.kept import TOKENS
from bastion.ledger.postgres.chain import recorded
from bastion.ledger.postgres.database import PostgresDatabase
from bastion.ledger.tokens import looks_like_secret, new_secret, secret_hash, validate_token_name, validate_token_role
from bastion.models import Principal, Role, TokenInfo
from bastion.program import bastion_command

_COLUMNS: Final = ("name", "role", "profile", "created_at", "revoked_at")
_COLUMN_LIST: Final = ", ".join(_COLUMNS)

_SELECT_ALL: Final = f"SELECT {_COLUMN_LIST} FROM tokens ORDER BY created_at DESC, id DESC"
_AUTHENTICATE: Final = "SELECT name, role, profile FROM tokens WHERE secret_hash = %s AND revoked_at IS NULL"
_HAS_ACTIVE: Final = "SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_at IS NULL)"
_HAS_APPROVER: Final = "SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_at IS NULL AND role IN ('owner', 'admin'))"
# A name is unique among active tokens (a partial unique index): of two instances creating it at once, one fails.
# Every change returns the row as the audit chain records it (bastion.ledger.kept).
_INSERT: Final = (
    f"INSERT INTO tokens (name, role, profile, secret_hash, created_at) VALUES (%s, %s, %s, %s, %s) {TOKENS.returning}"
)
_REVOKE: Final = (
    f"UPDATE tokens SET revoked_at = %(now)s WHERE name = %(name)s AND revoked_at IS NULL {TOKENS.returning}"
)


class PostgresTokens:
    """Bearer tokens in one PostgreSQL database; satisfies `bastion.pipeline.seams.TokenStore`."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def create_token(self, name: str, *, role: Role, profile: str | None, now: datetime) -> str:
        """Store a new token created at `now` and return its secret (the only time it exists outside the caller).

        Raises ValueError for a malformed name, an unknown role or a profile on a non-agent token, and Conflict
        when an active token already has the name.
        """
        validate_token_name(name)
        validate_token_role(role, profile)
        secret = new_secret()
        params = (name, role, profile, secret_hash(secret), now)
        try:
            await self._db.transaction(lambda conn: recorded(conn, _INSERT, params, TOKENS, "token_created", now))
        except psycopg.errors.UniqueViolation as exc:
            raise Conflict(
                f"a token named {name!r} is already active; revoke it first ({bastion_command()} tokens revoke {name}) "
                "or pick another name"
            ) from exc
        return secret

    async def revoke_token(self, name: str, *, now: datetime) -> TokenInfo:
        """Revoke the active token `name` at `now`. Raises NotFound when there is none."""
        params = {"name": name, "now": now}
        rows = await self._db.transaction(lambda conn: recorded(conn, _REVOKE, params, TOKENS, "token_revoked", now))
        if not rows:
            raise NotFound(f"no active token named {name!r}; see `{bastion_command()} tokens list`")
        return _token_from_row([rows[0][TOKENS.columns.index(column)] for column in _COLUMNS])

    async def tokens(self) -> list[TokenInfo]:
        """Every token, active and revoked, newest first; never a secret (the ledger has none)."""
        return [_token_from_row(row) for row in await self._db.fetchall(_SELECT_ALL)]

    async def authenticate(self, secret: str) -> Principal | None:
        """The principal of the active token with this secret, else None: input without a token's shape is refused
        without a query, the rest is one lookup by the SHA-256 of the secret on a unique index."""
        if not looks_like_secret(secret):
            return None
        row = await self._db.fetchone(_AUTHENTICATE, (secret_hash(secret),))
        if row is None:
            return None
        name, role, profile = row
        return Principal(name=name, role=role, profile=profile)

    async def has_tokens(self) -> bool:
        row = await self._db.fetchone(_HAS_ACTIVE)
        return bool(row is not None and row[0])

    async def has_approver_tokens(self) -> bool:
        row = await self._db.fetchone(_HAS_APPROVER)
        return bool(row is not None and row[0])


def _token_from_row(row: Sequence[Any]) -> TokenInfo:
    data = dict(zip(_COLUMNS, row, strict=True))
    return TokenInfo(**data)
