"""The `tokens` table (DESIGN.md §10): bearer tokens stored as the SHA-256 of their secret, never the secret.

The functions taking a `sqlite3.Connection` run on the ledger connection's thread, inside the transaction
`SqliteLedger` opened for them.

A secret is 32 random bytes, so its SHA-256 can be looked up directly: nobody can find a secret from its
hash, and comparing hashes leaks nothing useful through timing. A revoked token's row is kept (who had
access, and when) and its name may be given to a new token.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from bastion.errors import Conflict, NotFound
from bastion.ledger.sqlite.schema import timestamp
from bastion.models import ROLES, Principal, Role, TokenInfo

SECRET_PREFIX: Final = "bst_"
_SECRET_BYTES: Final = 32
# token_urlsafe(32) is the unpadded URL-safe base64 of 32 bytes: exactly 43 characters.
_SECRET_SHAPE: Final = re.compile(rf"{SECRET_PREFIX}[A-Za-z0-9_-]{{43}}")
_NAME_SHAPE: Final = re.compile(r"[A-Za-z0-9_.@:-]{1,64}")

_COLUMNS: Final = ("name", "role", "profile", "created_at", "revoked_at")
_COLUMN_LIST: Final = ", ".join(_COLUMNS)

SELECT_ALL: Final = f"SELECT {_COLUMN_LIST} FROM tokens ORDER BY created_at DESC, id DESC"
# Served by the unique index on secret_hash: one row at most, no write.
AUTHENTICATE: Final = "SELECT name, role, profile FROM tokens WHERE secret_hash = ? AND revoked_at IS NULL"
HAS_ACTIVE: Final = "SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_at IS NULL)"
_ACTIVE_NAMED: Final = "SELECT 1 FROM tokens WHERE name = ? AND revoked_at IS NULL"
_INSERT: Final = "INSERT INTO tokens (name, role, profile, secret_hash, created_at) VALUES (?, ?, ?, ?, ?)"
_REVOKE: Final = f"""
    UPDATE tokens SET revoked_at = :now
    WHERE name = :name AND revoked_at IS NULL
    RETURNING {_COLUMN_LIST}
"""


def validate_token_name(name: str) -> None:
    """Refuse a name that would read badly where principals are shown (invocations, decisions, logs)."""
    if not _NAME_SHAPE.fullmatch(name):
        raise ValueError(
            f"token name {name!r} is not valid: use 1 to 64 letters, digits or the characters . _ @ : - "
            "(e.g. ci-agent or alice@example.com)"
        )


def validate_token_role(role: Role, profile: str | None) -> None:
    """Refuse an unknown role, and a profile on anything but an agent token (approvers use no profile)."""
    if role not in ROLES:
        raise ValueError(f"token role {role!r} is not valid: use one of {', '.join(ROLES)}")
    if profile is not None and role != "agent":
        raise ValueError(f"only agent tokens are bound to a profile; a {role} token takes none")
    if profile == "":
        raise ValueError("the profile of a token must not be empty; omit it to use the server's profile")


def new_secret() -> str:
    """A fresh secret, `bst_` and 43 URL-safe characters: shown once, stored only as its hash."""
    return SECRET_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)


def secret_hash(secret: str) -> str:
    """The SHA-256 hex digest of a secret, the only form the ledger keeps."""
    return hashlib.sha256(secret.encode()).hexdigest()


def looks_like_secret(secret: object) -> bool:
    """Whether `secret` has the shape of a Bastion token; anything else is refused without a query."""
    return isinstance(secret, str) and _SECRET_SHAPE.fullmatch(secret) is not None


def insert_token(
    conn: sqlite3.Connection, *, name: str, role: Role, profile: str | None, digest: str, now: datetime
) -> None:
    """Store a token by the hash of its secret. Raises Conflict when an active token has the name."""
    if conn.execute(_ACTIVE_NAMED, (name,)).fetchone() is not None:
        raise Conflict(
            f"a token named {name!r} is already active; revoke it first (bastion tokens revoke {name}) "
            "or pick another name"
        )
    conn.execute(_INSERT, (name, role, profile, digest, timestamp(now)))


def revoke_token(conn: sqlite3.Connection, *, name: str, now: datetime) -> TokenInfo:
    """Mark the active token `name` revoked at `now`. Raises NotFound when there is none."""
    row = conn.execute(_REVOKE, {"name": name, "now": timestamp(now)}).fetchone()
    if row is None:
        raise NotFound(f"no active token named {name!r}; see `bastion tokens list`")
    return token_from_row(row)


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
