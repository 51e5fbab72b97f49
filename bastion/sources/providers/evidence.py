"""What proves that an object a look-up found was made by the call it looks for.

An agent knows its own invocation id, so a mark derived from the id alone (a marker in a body, an id hashed with a
public salt, the id in a message's metadata) is one it can write itself, on an object of its own. A call's marks
are keyed instead: `tag_of` is an HMAC of the invocation id under the marker key, which the composition root
derives from the ledger's own secret (`bastion/ledger/keys.py`) and which no agent ever sees.

Even a keyed mark can be copied once the object that carries it is seen, so a found object is `Candidate` evidence,
accepted (`verdict`) only when nothing refutes it: its mark verifies, its creator is the provider's own credential,
it is where the call's arguments say, and it was made within the call's `Window`. Anything else is reported with
the reasons, and the call stays unknown.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from bastion.actions import Found

TAG_HEX: Final = 32
"""The length of a tag in hex digits (128 bits of the HMAC)."""


def tag_of(marker_key: bytes, invocation_id: str) -> str:
    """The tag of what an invocation makes: HMAC-SHA256(marker key, invocation id), its first 128 bits in hex."""
    return hmac.new(marker_key, invocation_id.encode(), hashlib.sha256).hexdigest()[:TAG_HEX]


def keyed_digest(marker_key: bytes, purpose: bytes, invocation_id: str) -> bytes:
    """An HMAC-SHA256 of an invocation id for one `purpose` (e.g. the id of the Linear issue it creates)."""
    return hmac.digest(marker_key, purpose + b"\x00" + invocation_id.encode(), "sha256")


def verifies(marker_key: bytes, invocation_id: str, tag: str | None) -> bool:
    """Whether `tag` is the invocation's own (in constant time)."""
    return tag is not None and hmac.compare_digest(tag_of(marker_key, invocation_id), tag)


@dataclass(frozen=True, slots=True)
class Window:
    """When what a call made can have been made: from its invocation's creation to its last update (plus the
    call's timeout, for a call stopped while it ran), each widened by the skew of the API's clock."""

    start: datetime
    end: datetime

    @classmethod
    def of(cls, created_at: datetime, updated_at: datetime, *, call_timeout: float, skew: timedelta) -> Window:
        return cls(created_at - skew, updated_at + timedelta(seconds=call_timeout) + skew)

    def refutes(self, made: datetime | None, shown: str | None) -> str | None:
        """Why an object made at `made` (`shown` as the API wrote it) is not the call's; None when it fits."""
        if made is None:
            return f"its creation time ({shown or 'none given'}) cannot be read"
        if self.start <= made <= self.end:
            return None
        return f"it was made at {shown}, outside the call's window ({_iso(self.start)} to {_iso(self.end)})"


def moment(text: Any) -> datetime | None:
    """An API's ISO 8601 time (`2025-01-01T00:00:00Z`, with or without fractions) as an aware datetime."""
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Candidate:
    """An object found carrying the call's mark, and what refutes that the call made it (nothing: it did)."""

    where: str
    result: Any
    creator: str | None
    created_at: str | None
    refuted: list[str] = field(default_factory=list)

    def found(self) -> Found:
        reason = "; ".join(self.refuted) if self.refuted else None
        return Found("completed", self.where, self.result, self.creator, self.created_at, reason)


def verdict(candidates: Sequence[Candidate]) -> Found | None:
    """The first candidate nothing refutes, accepted; else the one closest to proof (the fewest refutations, the
    first of those), not accepted, saying why and how many others were refuted too; None when nothing carried the
    call's mark."""
    if not candidates:
        return None
    closest = min(candidates, key=lambda candidate: len(candidate.refuted))
    found = closest.found()
    if found.accepted or len(candidates) == 1:
        return found
    others = f" (and {len(candidates) - 1} other object(s) carrying the call's mark, none accepted either)"
    return replace(found, reason=f"{found.reason}{others}")
