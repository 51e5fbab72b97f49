"""Scrubbing a leaked secret from the ledger (`bastion audit scrub`), as a change `verify` accepts.

A secret the redactor did not know (a new kind of token, a password in free text) may be stored in an invocation's
arguments, result or error, and in its events' details. A scrub replaces every occurrence with `[scrubbed]`, in one
transaction: the rows change as any change does, with a `scrubbed` event on each invocation touched, carrying the row's
new digest; an event's detail changes in place, which its hash no longer matches. So the `scrubbed` event also lists,
for each event it changed, its position, its hash (which stays, and the next event still links to) and the digest of
its new detail, and is signed with the ledger's signing key (bastion.ledger.anchors): `verify` accepts an event whose
content no longer matches its hash only when a scrub signed by a trusted key names exactly that hash and that new
detail. Someone with write access to the store but not the key cannot pass an edit off as a scrub.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bastion.ledger.anchors import public_text, verify_signature

SCRUBBED: Final = "[scrubbed]"
"""What replaces every occurrence of the secret."""
SHORTEST: Final = 8
"""Shorter text is refused as a secret: it would match too much of the ledger to be one."""


class Scrubbed(NamedTuple):
    """One event a scrub changed: where it is in the chain, the hash it keeps, and the digest of its new detail."""

    position: int
    hash: str
    detail_digest: str


class Scrub(NamedTuple):
    """What to scrub: the secret's forms as stored (bastion.ledger.scrubbing.forms), who asks, and the signing key."""

    forms: tuple[str, ...]
    by: str
    key: Ed25519PrivateKey


def forms(secret: str) -> tuple[str, ...]:
    """The texts the secret is stored as: itself, and as escaped inside a JSON string when that differs. ValueError
    when it is too short or blank to be a secret."""
    if len(secret.strip()) < SHORTEST:
        raise ValueError(
            f"a secret to scrub has at least {SHORTEST} characters (this one has {len(secret.strip())}): a shorter "
            "text would match far more of the ledger than a leaked secret"
        )
    escaped = json.dumps(secret, ensure_ascii=False)[1:-1]
    return (secret,) if escaped == secret else (escaped, secret)


def scrub_text(text: str | None, secret_forms: Iterable[str]) -> str | None:
    """`text` with every form of the secret replaced (None stays None)."""
    if text is None:
        return None
    for form in secret_forms:
        text = text.replace(form, SCRUBBED)
    return text


def digest(detail: str) -> str:
    return hashlib.sha256(detail.encode("utf-8")).hexdigest()


def _signed_text(entries: Sequence[Scrubbed]) -> bytes:
    lines = [f"{entry.position} {entry.hash} {entry.detail_digest}" for entry in entries]
    return "\n".join(["bastion scrub", *lines]).encode("utf-8")


def scrub_detail(scrub: Scrub, entries: Sequence[Scrubbed]) -> dict[str, Any]:
    """The detail of a `scrubbed` event: who, the events it changed, and the signature over them."""
    signature = scrub.key.sign(_signed_text(entries))
    return {
        "by": scrub.by,
        "events": [list(entry) for entry in entries],
        "key": public_text(scrub.key),
        "signature": base64.b64encode(signature).decode("ascii"),
    }


def accepted(details: Iterable[str], trusted: Collection[str]) -> tuple[dict[int, Scrubbed], list[str]]:
    """From the details (JSON text) of the ledger's `scrubbed` events: the changed events their trusted signatures
    vouch for, by position, and why each other one does not hold."""
    vouched: dict[int, Scrubbed] = {}
    faults = []
    for text in details:
        detail: Mapping[str, Any] = json.loads(text)
        try:
            entries = [Scrubbed(int(p), str(h), str(d)) for p, h, d in detail.get("events", [])]
        except (TypeError, ValueError):
            faults.append("a scrub's list of events is malformed")
            continue
        fault = verify_signature(_signed_text(entries), detail.get("key"), detail.get("signature"), trusted)
        if fault is not None:
            faults.append(f"a scrub by {detail.get('by')!r} does not hold: {fault}")
            continue
        vouched.update((entry.position, entry) for entry in entries)
    return vouched, faults


SCRUBBED_COLUMNS: Final = ("args", "result", "error_message")
"""The columns of an invocation a scrub rewrites (JSON text or free text)."""


class Found(NamedTuple):
    """An event whose detail holds the secret: its id (for the update), chain position, invocation, hash, detail."""

    id: int
    position: int
    invocation_id: str
    hash: str
    detail: str


class Plan(NamedTuple):
    """What a scrub writes: each invocation's scrubbed columns (`SCRUBBED_COLUMNS`, by id), each event's new detail
    (by event id), and the detail of the `scrubbed` event each invocation touched gets."""

    rows: dict[str, tuple[str | None, ...]]
    details: dict[int, str]
    signed: dict[str, dict[str, Any]]


def plan(scrub: Scrub, rows: Iterable[Sequence[Any]], events: Iterable[Found]) -> Plan:
    """The scrub of the invocation `rows` (id, then `SCRUBBED_COLUMNS`) and `events` that hold the secret."""
    scrubbed_rows = {str(row[0]): tuple(scrub_text(value, scrub.forms) for value in row[1:]) for row in rows}
    details: dict[int, str] = {}
    entries: dict[str, list[Scrubbed]] = {invocation_id: [] for invocation_id in scrubbed_rows}
    for event in events:
        detail = scrub_text(event.detail, scrub.forms)
        assert detail is not None
        details[event.id] = detail
        entries.setdefault(event.invocation_id, []).append(Scrubbed(event.position, event.hash, digest(detail)))
    return Plan(scrubbed_rows, details, {key: scrub_detail(scrub, changed) for key, changed in entries.items()})
