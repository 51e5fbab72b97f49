"""The audit chain: every event carries the hash of the event before it, and the digest of its record as the change
left it, so editing, removing or reordering stored events, or editing a record behind its events, is noticed by
`verify_chain` and `verify_records`. The chain is computed here, in Python, for every backend.

An event's hash is the SHA-256 (hex) of these fields joined by newlines, as UTF-8: the previous event's hash, the
event's chain position, its subject (the invocation id, or the key of a record chained beside invocations:
bastion.ledger.kept), seq, kind, the timestamp in the ledger's fixed-width form
(`2026-11-21T10:00:00.000000+00:00`, see `stored_time`), the detail JSON text exactly as stored, and the record's
state: `record_state` of the invocation row after the change. No field holds a raw newline (ids are generated, the
detail is compact JSON, the others are hex or fixed forms), so the joining is unambiguous. The first event follows
`GENESIS`; after a prune, the first kept event follows the checkpoint's hash.

Events recorded before records were chained have no state: their hash covers the first seven fields with the event
id in place of the position. `verify_chain` checks them so and counts them as the pre-chain segment; a record whose
newest event is from then is reported as not covered, never as a break.

Backends append events in the transaction that makes the change, after taking the chain's head of record (the one
row of `audit_head`) for that transaction, so writers append one transaction after another: SQLite has one writer at
a time; PostgreSQL locks the row until commit (positions then follow the order of commit; event ids need not). The
head of record also notices the loss of the newest events.

All this proves only that the history is self-consistent: someone able to rewrite the whole store, recomputing every
hash, can rebuild it. Signed anchors of the head (bastion.ledger.anchors), kept outside the store, hold against them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Final, NamedTuple

from bastion.models import AuditCheckpoint, AuditReport, ChainBreak, ChainedEvent

GENESIS: Final = "0" * 64
"""The previous hash of the first event of a ledger."""

_NONE: Final[Mapping[int, str]] = MappingProxyType({})
_SCRUBBED_NONE: Final[Mapping[int, tuple[int, str, str]]] = MappingProxyType({})

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


def event_hash(
    prev_hash: str,
    number: int,
    subject: str,
    seq: int,
    kind: str,
    at: str,
    detail: str,
    state: str | None = None,
) -> str:
    """The hash of one event, chained to `prev_hash` (see the module docstring for the exact input): `number` is its
    chain position, or, for a pre-chain event (`state` None), its event id."""
    fields = (prev_hash, str(number), subject, str(seq), kind, at, detail)
    text = "\n".join(fields if state is None else (*fields, state))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Unlinked(NamedTuple):
    """An event to append, before it has its place in the chain: `subject` its invocation's id or its record's key
    (bastion.ledger.kept), `at` in `stored_time` form, `state` the digest of that row after the change."""

    subject: str
    seq: int
    kind: str
    at: str
    detail: str
    state: str


class Link(NamedTuple):
    """Where an appended event goes in the chain, and its hashes."""

    position: int
    prev_hash: str
    hash: str


def links(head: tuple[int, str], events: Sequence[Unlinked]) -> list[Link]:
    """The links of `events` appended in order after the chain's `head` (position, hash): every backend appends
    with these, so the chain is computed once."""
    position, prev = head
    linked = []
    for event in events:
        position += 1
        hashed = event_hash(prev, position, event.subject, event.seq, event.kind, event.at, event.detail, event.state)
        linked.append(Link(position, prev, hashed))
        prev = hashed
    return linked


def hash_of(event: ChainedEvent, prev_hash: str) -> str:
    """What `event`'s hash must be when it follows `prev_hash`."""
    number = event.id if event.state is None else event.position
    return event_hash(
        prev_hash, number, event.subject, event.seq, event.kind, stored_time(event.at), event.detail, event.state
    )


_COMPACT: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
"""Compact JSON, made once: `json.dumps` with these options builds an encoder each time."""


def record_state(values: Sequence[object]) -> str:
    """The digest of an invocation row as stored (its `INVOCATION_COLUMNS` values, in that order): SHA-256 (hex) of
    the compact JSON array of the values, timestamps in `stored_time` form. An event's hash covers the state its
    change left, so the row must still digest to what its newest event says."""
    stored = [stored_time(value) if isinstance(value, datetime) else value for value in values]
    text = _COMPACT.encode(stored)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


CheckpointSigner = Callable[[int, str, datetime], tuple[str, str]]
"""Signs a prune's checkpoint at (position, hash, at): (public key, signature), see bastion.ledger.anchors."""

ReadPage = Callable[[int, int], Awaitable[Sequence[ChainedEvent]]]
"""Given (after position, limit), at most `limit` events of the chain after that position, in chain order."""


class StoredRecord(NamedTuple):
    """An invocation row as a verification reads it, with what its events say of it."""

    id: str
    values: Sequence[object]
    """The row as stored, in `INVOCATION_COLUMNS` order."""
    chained: str | None
    """The state its newest event carries: None when that event is pre-chain, or when it has no event."""
    events: int
    """How many of its events are kept."""
    kept_step: bool
    """A step of it is kept: a prune may have removed its own events (a parent stays with its kept steps)."""


ReadRecords = Callable[[str, int], Awaitable[Sequence[StoredRecord]]]
"""Given (after id, limit), at most `limit` records with a greater id, in id order."""

ReadOrphans = Callable[[], Awaitable[Sequence[str]]]
"""The invocation ids that have events but no record."""


async def verify_chain(
    checkpoint: AuditCheckpoint | None,
    read_page: ReadPage,
    *,
    head_of_record: tuple[int, str],
    anchored: Mapping[int, str] = _NONE,
    start: tuple[int, str] | None = None,
    scrubbed: Mapping[int, tuple[int, str, str]] = _SCRUBBED_NONE,
) -> AuditReport:
    """Walk the chain from the checkpoint (or the genesis) to its head; report the first break, if any.

    `head_of_record`: the (position, hash) the ledger keeps of the chain's head apart from the events: a chain that
    ends elsewhere lost its newest events (reason `head`). A checkpoint with events at or before its position was not
    made by a prune, which removes them with it (reason `checkpoint`). `anchored`: the (position: hash) of anchors
    whose signatures were checked (bastion.ledger.anchors): the chain must hold that hash at each position it still
    keeps, and reach the newest (reason `anchor`). `start`: a (position, hash) already trusted (the last anchor) to
    walk on from instead of the checkpoint: only the events after it are read. `scrubbed`: the (position, hash,
    digest of the new detail) of events a signed scrub changed (bastion.ledger.scrubbing): such an event verifies by
    that hash when its detail is that one."""
    prev = checkpoint.hash if checkpoint is not None else GENESIS
    after = checkpoint.position if checkpoint is not None else 0
    if start is not None:
        checkpoint = None
        after, prev = start
    verified = pre_chain = anchors = scrubs = 0
    head: ChainedEvent | None = None

    def report(broken: ChainBreak | None) -> AuditReport:
        return AuditReport(
            verified=verified,
            pre_chain=pre_chain,
            scrubbed=scrubs,
            anchors=anchors,
            checkpoint=checkpoint,
            head_id=head.id if head else None,
            head_position=head.position if head else None,
            head_hash=head.hash if head else None,
            broken=broken,
        )

    if checkpoint is not None:
        first = await read_page(0, 1)
        if first and first[0].position <= checkpoint.position:
            return report(
                ChainBreak(
                    event_id=first[0].id,
                    position=checkpoint.position,
                    reason="checkpoint",
                    message=(
                        f"the checkpoint at position {checkpoint.position} was not made by a prune: event "
                        f"{first[0].id} (position {first[0].position}) is still stored before it; a checkpoint was "
                        "inserted to skip part of the chain"
                    ),
                )
            )
    while True:
        page = await read_page(after, PAGE)
        for event in page:
            broken = _break_at(event, prev)
            if broken is not None and broken.reason == "hash" and _scrubbed(event, scrubbed.get(event.position)):
                broken = None
                scrubs += 1
            if broken is None and event.position in anchored:
                broken = _anchor_break(event, anchored[event.position])
                anchors += 1
            if broken is not None:
                return report(broken)
            verified += 1
            pre_chain += event.state is None
            prev = event.hash
            head = event
        if len(page) < PAGE:
            break
        after = page[-1].position
    ends = (head.position, head.hash) if head is not None else (after, prev)
    beyond = [position for position in anchored if position > ends[0]]
    if beyond:
        return report(
            ChainBreak(
                event_id=head.id if head is not None else 0,
                position=max(beyond),
                reason="anchor",
                message=(
                    f"the chain ends at position {ends[0]}, but an anchor signed position {max(beyond)}: the events "
                    "after it were removed, or the chain was rebuilt"
                ),
            )
        )
    if checkpoint is not None and checkpoint.position in anchored:
        anchors += 1
        if anchored[checkpoint.position] != checkpoint.hash:
            return report(
                ChainBreak(
                    event_id=checkpoint.event_id,
                    position=checkpoint.position,
                    reason="anchor",
                    message=f"the checkpoint at position {checkpoint.position} does not hold the hash anchored there",
                )
            )
    if ends != head_of_record:
        return report(
            ChainBreak(
                event_id=head.id if head is not None else 0,
                position=head_of_record[0],
                reason="head",
                message=(
                    f"the chain ends at position {ends[0]}, but the ledger's head of record is position "
                    f"{head_of_record[0]} (hash {head_of_record[1][:16]}...): its newest events were removed, or the "
                    "head was rewritten"
                ),
            )
        )
    return report(None)


async def verify_records(
    chain: AuditReport, read_records: ReadRecords, read_orphans: ReadOrphans, *, what: str = "invocation"
) -> AuditReport:
    """Check every row (of invocations, or of the records `what` names: bastion.ledger.kept) against the state its
    newest event carries, after a chain that holds: a row edited behind its events (reason `record`), a row with no
    event, or events whose row is gone, break it. Rows whose newest event is pre-chain are counted as not covered.
    Returns `chain` with what was found added."""
    if chain.broken is not None:
        return chain
    checked = not_covered = 0
    after = ""

    def report(broken: ChainBreak | None) -> AuditReport:
        counts = {"records": chain.records + checked, "records_not_covered": chain.records_not_covered + not_covered}
        return chain.model_copy(update=counts | {"broken": broken})

    while True:
        page = await read_records(after, PAGE)
        for record in page:
            if record.chained is not None:
                if record_state(record.values) != record.chained:
                    return report(
                        _record_break(
                            record.id,
                            f"{what} {record.id} was changed after it was recorded: the row no longer matches "
                            "the state its newest event carries",
                        )
                    )
                checked += 1
            elif record.events == 0 and not record.kept_step:
                return report(
                    _record_break(
                        record.id,
                        f"{what} {record.id} has no event: it was inserted behind the ledger's back, or its "
                        "events were removed",
                    )
                )
            else:
                not_covered += 1
        if len(page) < PAGE:
            break
        after = page[-1].id
    orphans = await read_orphans()
    if orphans:
        return report(
            _record_break(
                orphans[0],
                f"{what} {orphans[0]} has events but no row: the record was deleted"
                + (f" (and {len(orphans) - 1} more)" if len(orphans) > 1 else ""),
            )
        )
    return report(None)


def _scrubbed(event: ChainedEvent, scrub: tuple[int, str, str] | None) -> bool:
    """Whether a signed scrub vouches for the event's content as it is now."""
    if scrub is None:
        return False
    detail_digest = hashlib.sha256(event.detail.encode("utf-8")).hexdigest()
    return scrub[1] == event.hash and scrub[2] == detail_digest


def _anchor_break(event: ChainedEvent, anchored: str) -> ChainBreak | None:
    if event.hash == anchored:
        return None
    return ChainBreak(
        event_id=event.id,
        position=event.position,
        reason="anchor",
        message=(
            f"event {event.id} (position {event.position}) verifies, but its hash is not the one a signed anchor "
            "holds for that position: the history up to it was rewritten, and its hashes recomputed"
        ),
    )


def _record_break(invocation_id: str, message: str) -> ChainBreak:
    return ChainBreak(event_id=0, position=0, reason="record", invocation_id=invocation_id, message=message)


def _break_at(event: ChainedEvent, prev: str) -> ChainBreak | None:
    if event.prev_hash != prev:
        return ChainBreak(
            event_id=event.id,
            position=event.position,
            reason="link",
            message=(
                f"event {event.id} ({event.about}, seq {event.seq}) does not follow the event "
                "before it: an event was removed, inserted or reordered there"
            ),
        )
    if hash_of(event, prev) != event.hash:
        return ChainBreak(
            event_id=event.id,
            position=event.position,
            reason="hash",
            message=(
                f"event {event.id} ({event.about}, seq {event.seq}) was changed after it was "
                "recorded: its content no longer matches its hash"
            ),
        )
    return None
