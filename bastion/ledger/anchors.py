"""Signed anchors of the audit chain, and the Ed25519 key that signs them, kept outside the store.

Someone who can write the database can rewrite its whole history and recompute every hash of the chain
(bastion.ledger.chain): the chain then holds, and proves nothing. What they cannot do without the signing key is
sign: `bastion audit anchor` signs the chain's head (position and hash) and appends it, one JSON line, to a file the
operator keeps elsewhere (or prints it for a log shipper), or POSTs that line to a webhook (`AnchorSender`); a
retention prune signs the checkpoint it leaves.
`bastion audit verify --anchors FILE` then checks the chain against every anchor and the checkpoint against its
signature: a history rewritten before an anchor, or cut after one, no longer verifies.

The signing key is a PEM file (PKCS #8, mode 0600) beside the key of argument hashes (bastion.ledger.keys), created
on first use. Its public half, `ed25519:<base64>`, is what a verifier trusts: `bastion audit key` prints it, to
publish wherever verifiers look (a runbook, a ticket, the repository of the deployment). Rotating: move the old
file aside and anchor again; give verifiers both public keys while anchors signed by the old one are kept.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Final, Literal, Protocol

import anyio
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ValidationError

from bastion.errors import ConfigError
from bastion.ledger.chain import stored_time, verify_chain
from bastion.models import AuditCheckpoint, AuditReport, ChainedEvent, utcnow

logger = logging.getLogger(__name__)

PUBLIC_PREFIX: Final = "ed25519:"

Signed = Literal["anchor", "checkpoint"]
"""What a signature is of: the text signed names it, so a checkpoint's signature is no anchor's."""


class Anchor(BaseModel):
    """The chain's head at one moment, signed: one line of an anchors file."""

    position: int
    hash: str
    at: datetime
    key: str
    """The public key that signed it (`ed25519:<base64>`)."""
    signature: str
    """Ed25519 over `signed_text("anchor", position, hash, at)`, base64."""


def signing_key_path_for(key_path: Path) -> Path:
    """Where the signing key of a ledger whose argument-hash key is `key_path` is kept: beside it."""
    return key_path.with_name(f"{key_path.stem}.signing.pem")


def load_signing_key(path: Path) -> Ed25519PrivateKey | None:
    """The signing key in `path`; None when there is no such file. ConfigError when it cannot be read or is no
    Ed25519 key."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: the ledger's signing key cannot be read ({exc}); check its permissions") from exc
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{path}: not a PEM private key ({exc}); restore it from a backup, or move it aside to start a new one "
            "(publish the new public key: anchors signed by the old one need the old public key to verify)"
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{path}: the signing key must be Ed25519, got {type(key).__name__}; move it aside")
    return key


def load_or_create_signing_key(path: Path) -> Ed25519PrivateKey:
    """The signing key in `path`, created (mode 0600, atomically: two processes agree on one) when missing."""
    key = load_signing_key(path)
    if key is not None:
        return key
    created = Ed25519PrivateKey.generate()
    pem = created.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(pem)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(draft, path)  # fails if another process created one first: then theirs is the key
        except FileExistsError:
            return load_or_create_signing_key(path)
    finally:
        draft.unlink(missing_ok=True)
    return created


def public_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The public key as verifiers are given it: `ed25519:` and the raw 32 bytes in base64."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PUBLIC_PREFIX + base64.b64encode(raw).decode("ascii")


def trusted_keys(key_path: Path, given: Sequence[str]) -> list[str]:
    """The public keys a verification trusts: the ledger's own signing key's (beside `key_path`, its key of argument
    hashes), when it is on this machine, and those `given` (checked: ConfigError for one that is no key)."""
    trusted = [public_text(parse_public(text)) for text in given]
    own = load_signing_key(signing_key_path_for(key_path))
    if own is not None and public_text(own) not in trusted:
        trusted.insert(0, public_text(own))
    return trusted


def parse_public(text: str) -> Ed25519PublicKey:
    """A public key given as `ed25519:<base64>`; ConfigError naming the expected form otherwise."""
    body = text.strip().removeprefix(PUBLIC_PREFIX)
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(body, validate=True))
    except ValueError as exc:
        raise ConfigError(
            f"{text!r} is not a public key: expected ed25519:<base64 of 32 bytes>, as `bastion audit key` prints it"
        ) from exc


def signed_text(what: Signed, position: int, hash_: str, at: datetime) -> bytes:
    """The exact bytes a signature covers."""
    return f"bastion audit {what} v1\n{position}\n{hash_}\n{stored_time(at)}".encode()


def signature_of(key: Ed25519PrivateKey, text: bytes) -> str:
    """The Ed25519 signature of `text`, base64."""
    return base64.b64encode(key.sign(text)).decode("ascii")


def sign(key: Ed25519PrivateKey, what: Signed, position: int, hash_: str, at: datetime) -> tuple[str, str]:
    """(public key, signature) of `what` at (position, hash, at)."""
    return public_text(key), signature_of(key, signed_text(what, position, hash_, at))


def sign_anchor(key: Ed25519PrivateKey, position: int, hash_: str, at: datetime) -> Anchor:
    public, signature = sign(key, "anchor", position, hash_, at)
    return Anchor(position=position, hash=hash_, at=at, key=public, signature=signature)


def signature_fault(
    what: Signed,
    position: int,
    hash_: str,
    at: datetime,
    key: str | None,
    signature: str | None,
    trusted: Collection[str],
) -> str | None:
    """Why the signature of `what` at (position, hash, at) does not hold (None when it does)."""
    return verify_signature(signed_text(what, position, hash_, at), key, signature, trusted)


def verify_signature(text: bytes, key: object, signature: object, trusted: Collection[str]) -> str | None:
    """Why `signature` by `key` over `text` does not hold (None when it does): missing, by a key not trusted, or not
    over this text."""
    if not isinstance(key, str) or not isinstance(signature, str):
        return "it is not signed"
    if key not in trusted:
        return f"it is signed by {key}, which is not a trusted key (give it with --public-key if it is yours)"
    try:
        parse_public(key).verify(base64.b64decode(signature), text)
    except (InvalidSignature, ValueError, ConfigError):
        return "its signature is not that of its content: it was forged or changed"
    return None


def read_anchors(path: Path) -> list[Anchor]:
    """Every anchor of an anchors file, in order. ConfigError naming the line that is not one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: the anchors cannot be read ({exc})") from exc
    anchors = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            anchors.append(Anchor.model_validate_json(line))
        except ValidationError as exc:
            raise ConfigError(
                f"{path}:{number}: not an anchor ({exc.errors()[0]['msg']}); each line is one `bastion audit anchor` "
                "wrote: restore the file from where it is shipped"
            ) from exc
    return anchors


def append_anchor(path: Path, anchor: Anchor) -> None:
    """Add the anchor as the file's last line, flushed to disk before returning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(anchor_line(anchor) + "\n")
        out.flush()
        os.fsync(out.fileno())


def anchor_line(anchor: Anchor) -> str:
    return json.dumps(anchor.model_dump(mode="json"), separators=(",", ":"))


class _Audit(Protocol):
    async def checkpoint(self) -> AuditCheckpoint | None: ...

    async def head(self) -> tuple[int, str]: ...

    async def chain(self, after: int, limit: int) -> list[ChainedEvent]: ...

    async def verify(self, anchored: Mapping[int, str] = ...) -> AuditReport: ...


async def anchor_head(
    audit: _Audit, key: Ed25519PrivateKey, *, last: Anchor | None, now: datetime
) -> Anchor | AuditReport:
    """A signed anchor of the chain's head, once what it would vouch for verifies: the chain after the `last`
    anchor (when its position is still kept), else the whole ledger, records included. The report of the break
    instead when it does not: a history that no longer holds is never signed."""
    head = await audit.head()
    checkpoint = await audit.checkpoint()
    if last is not None and (checkpoint is None or last.position > checkpoint.position):
        report = await verify_chain(None, audit.chain, head_of_record=head, start=(last.position, last.hash))
    else:
        report = await audit.verify()
    if report.broken is not None:
        return report
    return sign_anchor(key, head[0], head[1], now)


def last_anchor(path: Path) -> Anchor | None:
    """The newest anchor of an anchors file; None when the file does not exist yet or is empty."""
    if not path.exists():
        return None
    anchors = read_anchors(path)
    return anchors[-1] if anchors else None


class AnchorSender(Protocol):
    """Where anchors go beyond the file: a webhook (bastion.pipeline.notify.AnchorWebhook)."""

    async def send(self, made: Anchor | None) -> str | None:
        """Send `made` (None: no new anchor this time), after every anchor an earlier attempt could not deliver;
        None when all were delivered, else what went wrong (those not delivered are kept, to send next time)."""
        ...


class Anchoring:
    """Keeps signed anchors of the chain's head outside the ledger (`bastion serve`, while `[ledger] anchor_file` or
    `anchor_url` is set): `once` when the chain moved since the last, appended to the file and handed to the
    `sender`; a chain that does not verify is logged, once per head, and not anchored."""

    def __init__(
        self, audit: _Audit, key: Ed25519PrivateKey, path: Path | None, sender: AnchorSender | None = None
    ) -> None:
        self._audit = audit
        self._key = key
        self.path = path
        self._sender = sender
        self._last: Anchor | None = None
        self._read = False
        self._refused: tuple[int, str] | None = None

    async def once(self) -> Anchor | None:
        """Anchor the head if it moved since the last anchor (and verifies): the anchor made, else None. The sender
        is told either way, so it retries what it could not deliver before."""
        made = await self._anchor()
        if self._sender is not None:
            await self._sender.send(made)
        return made

    async def _anchor(self) -> Anchor | None:
        if not self._read:
            self._last = await anyio.to_thread.run_sync(last_anchor, self.path) if self.path is not None else None
            self._read = True
        head = await self._audit.head()
        last = self._last
        if head == self._refused or (last is not None and head == (last.position, last.hash)):
            return None
        made = await anchor_head(self._audit, self._key, last=last, now=utcnow())
        if isinstance(made, AuditReport):
            self._refused = head
            broken = made.broken.message if made.broken is not None else "it does not verify"
            logger.error("the audit chain was not anchored: %s; run `bastion audit verify`", broken)
            return None
        if self.path is not None:
            await anyio.to_thread.run_sync(append_anchor, self.path, made)
        self._last = made
        where = f" in {self.path}" if self.path is not None else ""
        logger.info("anchored the audit chain at position %d%s", made.position, where)
        return made

    async def every(self, seconds: float) -> None:
        """`once` now, then every `seconds`, until cancelled."""
        while True:
            await self.once()
            await anyio.sleep(seconds)
