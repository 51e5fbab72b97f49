"""The ledger's own secret: the key of its argument hashes, kept in a file beside the database,
never in it.

An invocation stores a hash of its raw arguments so an approval can check that what runs is what was
approved. Unkeyed, that hash lets anyone who reads the database guess redacted values (a 6-digit password
in under a second); keyed with a secret the database does not hold, it tells them nothing.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path
from typing import Any, Final

from bastion.errors import ConfigError
from bastion.policies import canonical_json

logger = logging.getLogger(__name__)

_KEY_BYTES: Final = 32


def load_or_create_key(path: Path) -> bytes:
    """The key in `path`, created (mode 0600, atomically, so two processes agree on one) if it is missing."""
    key = load_key(path)
    return _create(path) if key is None else key


def load_key(path: Path) -> bytes | None:
    """The key in `path`; None when there is no such file. ConfigError when it cannot be read or is malformed."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: the ledger's key cannot be read ({exc}); check its permissions") from exc
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != _KEY_BYTES:
        raise ConfigError(
            f"{path}: the ledger's key is not {_KEY_BYTES * 2} hex digits; restore it from a backup, or delete it to "
            "start a new one (calls waiting for approval then have to be made again)"
        )
    if path.stat().st_mode & 0o077:
        logger.warning("%s: the ledger's key is readable by others; chmod 600 it", path)
    return key


def _create(path: Path) -> bytes:
    key = secrets.token_bytes(_KEY_BYTES)
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as out:
            out.write(key.hex() + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(draft, path)  # fails if another process created the key first: then theirs is the key
        except FileExistsError:
            return load_or_create_key(path)
    finally:
        draft.unlink(missing_ok=True)
    return key


def keyed_hash(key: bytes, arguments: Any) -> str:
    """HMAC-SHA256 of the canonical JSON of the raw arguments: a copy of the key's HMAC, its key already taken in
    (`hmac.digest` looks the algorithm up in OpenSSL on every call: twice the time)."""
    mac = _keyed(key).copy()
    mac.update(canonical_json(arguments, strict=True))
    return mac.hexdigest()


@functools.lru_cache(maxsize=8)
def _keyed(key: bytes) -> hmac.HMAC:
    return hmac.new(key, digestmod=hashlib.sha256)


MARKER_PURPOSE: Final = b"bastion reconciliation marker v1"


def marker_key_from(key: bytes) -> bytes:
    """The key that provider calls mark what they make with (bastion/sources/providers/evidence.py), derived from
    the ledger's key: as secret as it (never in the database, never shown to agents), yet no use for argument
    hashes."""
    return hmac.digest(key, MARKER_PURPOSE, "sha256")


def matches(key: bytes, arguments: Any, stored: str) -> bool:
    """Whether `arguments` are the ones hashed into `stored` (also an unkeyed hash of a ledger from before keys)."""
    if hmac.compare_digest(keyed_hash(key, arguments), stored):
        return True
    return hmac.compare_digest(hashlib.sha256(canonical_json(arguments)).hexdigest(), stored)
