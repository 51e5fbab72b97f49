"""Bearer tokens, whatever backend keeps them: their shape, their names and roles, and the hash
that is all a ledger ever stores of a secret.

A secret is `bst_` and 32 random bytes in URL-safe base64, so its SHA-256 can be looked up directly: nobody can
find a secret from its hash, and comparing hashes leaks nothing useful through timing.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Final

from bastion.models import ROLES, Role

SECRET_PREFIX: Final = "bst_"
_SECRET_BYTES: Final = 32
# token_urlsafe(32) is the unpadded URL-safe base64 of 32 bytes: exactly 43 characters.
SECRET_SHAPE: Final = re.compile(rf"{SECRET_PREFIX}[A-Za-z0-9_-]{{43}}")
_NAME_SHAPE: Final = re.compile(r"[A-Za-z0-9_.@:-]{1,64}")


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
    return isinstance(secret, str) and SECRET_SHAPE.fullmatch(secret) is not None
