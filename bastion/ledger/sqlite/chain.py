"""Appending to the audit chain on SQLite (bastion.ledger.chain computes it, as for every backend).

Events are appended inside the transaction that makes the change, which holds the file's write lock: the head of
record read first (`HEAD_NOW`, the one row of `audit_head`) stays the head until commit, and an event's id is its
position.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

import aiosqlite

from bastion.ledger.chain import Unlinked, links, stored_time
from bastion.ledger.kept import RECORD_KINDS, Kept, RecordKind, adopted_sql, changed_record, row_sql

HEAD_NOW: Final = "SELECT position, hash FROM audit_head"
MOVE_HEAD: Final = "UPDATE audit_head SET position = ?, hash = ?"
INSERT_CHAINED: Final = (
    "INSERT INTO events (id, invocation_id, seq, kind, at, detail, state, prev_hash, hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_RECORD_EVENT: Final = (
    "INSERT INTO record_events (position, record, seq, kind, at, detail, state, prev_hash, hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

Rows = list[tuple[Any, ...]]


def chained(head: Sequence[Any], events: Sequence[Unlinked]) -> tuple[Rows, Rows, tuple[int, str]]:
    """The rows of `events` appended in order after the chain's `head` (position, hash): those of `INSERT_CHAINED`
    (invocations' events: an event's id is its position, the head's + 1, as SQLite would give it, so it is hashed
    before it is inserted), those of `INSERT_RECORD_EVENT` (records': bastion.ledger.kept), and the head they leave."""
    linked = links((int(head[0]), str(head[1])), events)
    invocations: Rows = []
    records: Rows = []
    for event, link in zip(events, linked, strict=True):
        (records if event.kind in RECORD_KINDS else invocations).append(
            (link.position, *event, link.prev_hash, link.hash)
        )
    return invocations, records, (linked[-1].position, linked[-1].hash)


def append_events(conn: sqlite3.Connection, events: Sequence[Unlinked]) -> None:
    """Append `events` to the chain, in order, inside the caller's transaction (which holds the write lock, so the
    head read first stays the head): each hashed here, after the one before it, and inserted with its hash; the head
    of record moves to the last.

    (Chained in SQL instead, with the hash a function SQLite calls back, an event cost twice as much.)"""
    if not events:
        return
    invocations, records, head = chained(conn.execute(HEAD_NOW).fetchone(), events)
    if invocations:
        conn.executemany(INSERT_CHAINED, invocations)
    if records:
        conn.executemany(INSERT_RECORD_EVENT, records)
    conn.execute(MOVE_HEAD, head)


async def adopt_records(db: aiosqlite.Connection, kinds: Sequence[Kept]) -> None:
    """Chain the records of `kinds` an upgraded ledger holds: one `record_adopted` event each, at the head."""
    at = stored_time(datetime.now(UTC))
    adopted = [
        changed_record(kept, row, "record_adopted", at)
        for kept in kinds
        for row in await db.execute_fetchall(adopted_sql(kept))
    ]
    if adopted:
        _, records, head = chained(next(iter(await db.execute_fetchall(HEAD_NOW))), adopted)
        await db.executemany(INSERT_RECORD_EVENT, records)
        await db.execute(MOVE_HEAD, head)


def recorded(
    conn: sqlite3.Connection, statement: str, params: Any, kept: Kept, kind: RecordKind, at: str
) -> list[Sequence[Any]]:
    """Run `statement`, a change of `kept`'s rows returning `kept.returning`, and append an event of `kind` at `at`
    for every row it changed, in the caller's transaction; those rows (`kept.columns`)."""
    return recorded_each(conn, statement, [params], kept, kind, at)


def recorded_each(
    conn: sqlite3.Connection, statement: str, each: Sequence[Any], kept: Kept, kind: RecordKind, at: str
) -> list[Sequence[Any]]:
    """`recorded`, with `statement` run once for each parameters of `each`, whose changes are of distinct records
    (each event's seq is read before any is appended), and their events appended together."""
    rows = [row for params in each for row in conn.execute(statement, params).fetchall()]
    append_events(conn, [changed_record(kept, row, kind, at) for row in rows])
    return [row[: len(kept.columns)] for row in rows]


def record_row(conn: sqlite3.Connection, key: str) -> Sequence[Any] | None:
    """The row of the record `key` (bastion.ledger.kept), as its state digests it; None when it is gone."""
    sql = row_sql(key, "?")
    found: Sequence[Any] | None = conn.execute(sql, (key,)).fetchone() if sql is not None else None
    return found
