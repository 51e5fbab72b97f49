"""The audit chain: every event carries the hash of the event before it, so editing, removing
or reordering stored events is noticed by `verify_chain`.

An event's hash is the SHA-256 (hex) of these fields joined by newlines, as UTF-8: the previous event's hash, the
event id, the invocation id, seq, kind, the timestamp in the ledger's fixed-width form
(`2026-11-21T10:00:00.000000+00:00`, see bastion.ledger.sqlite.schema.timestamp) and the detail JSON text exactly
as stored. No field holds a raw newline (ids are generated, the detail is compact JSON), so the joining is
unambiguous. The first event follows `GENESIS`; after a prune, the first kept event follows the checkpoint's hash.

Backends compute the hash in the transaction that appends the event, from the chain's head at that moment:
- SQLite has one writer at a time, so the head is the event with the largest id (`bastion_event_hash`, registered
  on every connection, computes it in the INSERT itself); positions are event ids.
- PostgreSQL has concurrent writers whose event ids commit out of order. A BEFORE INSERT trigger locks the one
  row of `audit_head` (held until commit), so writers append to the chain one transaction after another, and
  numbers the event's `position` from it: positions follow the order of commit, ids need not. The lock
  serialises every transaction that appends events (one round trip each on the hot path).

A chain proves only that the history is self-consistent: someone able to rewrite the whole file can rebuild it.
Keep the head hash `bastion audit verify` prints somewhere else (a log, a ticket) to anchor it.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Final

from bastion.models import AuditCheckpoint, AuditReport, ChainBreak, ChainedEvent

GENESIS: Final = "0" * 64
"""The previous hash of the first event of a ledger."""

PAGE: Final = 1000
"""How many events a verification reads at a time."""

TERMINAL: Final = ("completed", "failed", "denied", "expired")
"""The statuses a retention prune may remove: the call's outcome is known (never `unknown`, never in flight)."""


_STORED_FORM: Final = "%04d-%02d-%02dT%02d:%02d:%02d.%06d+00:00"


@functools.lru_cache(maxsize=16)
def stored_time(moment: datetime) -> str:
    """The fixed-width UTC form the chain hashes timestamps in (the SQLite ledger stores exactly this text): what
    `isoformat(timespec="microseconds")` gives in UTC, in half its time, and kept for the next ones: a call's row
    and events are stamped with one moment. A naive moment is taken as UTC."""
    if moment.tzinfo is not UTC:
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return _STORED_FORM % (
        moment.year,
        moment.month,
        moment.day,
        moment.hour,
        moment.minute,
        moment.second,
        moment.microsecond,
    )


def event_hash(prev_hash: str, event_id: int, invocation_id: str, seq: int, kind: str, at: str, detail: str) -> str:
    """The hash of one event, chained to `prev_hash` (see the module docstring for the exact input)."""
    text = "\n".join((prev_hash, str(event_id), invocation_id, str(seq), kind, at, detail))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def hash_of(event: ChainedEvent, prev_hash: str) -> str:
    """What `event`'s hash must be when it follows `prev_hash`."""
    return event_hash(
        prev_hash, event.id, event.invocation_id, event.seq, event.kind, stored_time(event.at), event.detail
    )


ReadPage = Callable[[int, int], Awaitable[Sequence[ChainedEvent]]]
"""Given (after position, limit), at most `limit` events of the chain after that position, in chain order."""


async def verify_chain(
    checkpoint: AuditCheckpoint | None, read_page: ReadPage, *, head_of_record: tuple[int, str] | None = None
) -> AuditReport:
    """Walk the chain from the checkpoint (or the genesis) to its head; report the first break, if any.

    `head_of_record`: the (position, hash) the ledger keeps of the chain's head apart from the events, where it keeps
    one (PostgreSQL's `audit_head`): a chain that ends elsewhere lost its newest events (reason `head`)."""
    prev = checkpoint.hash if checkpoint is not None else GENESIS
    after = checkpoint.position if checkpoint is not None else 0
    verified = 0
    head: ChainedEvent | None = None
    while True:
        page = await read_page(after, PAGE)
        for event in page:
            broken = _break_at(event, prev)
            if broken is not None:
                return AuditReport(
                    verified=verified,
                    checkpoint=checkpoint,
                    head_id=head.id if head else None,
                    head_hash=head.hash if head else None,
                    broken=broken,
                )
            verified += 1
            prev = event.hash
            head = event
        if len(page) < PAGE:
            break
        after = page[-1].position
    ends = (head.position, head.hash) if head is not None else (after, prev)
    broken = None
    if head_of_record is not None and ends != head_of_record:
        broken = ChainBreak(
            event_id=head.id if head is not None else 0,
            position=head_of_record[0],
            reason="head",
            message=(
                f"the chain ends at position {ends[0]}, but the ledger's head of record is position "
                f"{head_of_record[0]} (hash {head_of_record[1][:16]}...): its newest events were removed, or the head "
                "was rewritten"
            ),
        )
    return AuditReport(
        verified=verified,
        checkpoint=checkpoint,
        head_id=head.id if head else None,
        head_hash=head.hash if head else None,
        broken=broken,
    )


def _break_at(event: ChainedEvent, prev: str) -> ChainBreak | None:
    if event.prev_hash != prev:
        return ChainBreak(
            event_id=event.id,
            position=event.position,
            reason="link",
            message=(
                f"event {event.id} (invocation {event.invocation_id}, seq {event.seq}) does not follow the event "
                "before it: an event was removed, inserted or reordered there"
            ),
        )
    if hash_of(event, prev) != event.hash:
        return ChainBreak(
            event_id=event.id,
            position=event.position,
            reason="hash",
            message=(
                f"event {event.id} (invocation {event.invocation_id}, seq {event.seq}) was changed after it was "
                "recorded: its content no longer matches its hash"
            ),
        )
    return None
