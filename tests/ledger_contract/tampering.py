"""Someone with write access to the ledger's store, but not to its signing key, changing it behind Bastion's back.

A `Store` is their connection, with the append-only triggers out of the way. Every kind of tampering is a function
of it. The naive tamperer stops there; the recomputing one then makes the store consistent again (`recompute`),
as someone who knows how the chain is computed (bastion.ledger.chain, it is no secret) would: every record's newest
event carries the record's digest, every event the hash of the one before, the head of record is the chain's end,
and a checkpoint has no events before it. Only what is signed with a key outside the store holds against them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import psycopg

from bastion.ledger import OpenLedger
from bastion.ledger.backend import INVOCATION_COLUMNS
from bastion.ledger.chain import GENESIS, event_hash, record_state, stored_time
from bastion.ledger.kept import KEPT, adopted_sql
from bastion.ledger.postgres import PostgresBackend
from bastion.ledger.sqlite import SqliteBackend
from tests.ledger_contract.samples import T0


@dataclass
class Store:
    """The tamperer's connection to the store of a ledger: SQL with `?` placeholders on either backend, and the
    name of the column that orders the chain (`id` on SQLite, `position` on PostgreSQL)."""

    sqlite: sqlite3.Connection | None
    postgres: psycopg.AsyncConnection[Any] | None

    @property
    def position(self) -> str:
        return "id" if self.sqlite is not None else "position"

    async def run(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        if self.sqlite is not None:
            return self.sqlite.execute(sql, params).fetchall()
        assert self.postgres is not None
        cursor = await self.postgres.execute(sql.replace("?", "%s").encode(), params)
        return await cursor.fetchall() if cursor.description is not None else []


@asynccontextmanager
async def store_of(ledger: OpenLedger) -> AsyncIterator[Store]:
    backend = ledger.backend
    if isinstance(backend, SqliteBackend):
        conn = sqlite3.connect(backend.database.path, isolation_level=None)
        try:
            conn.execute("DROP TRIGGER IF EXISTS events_no_update")
            conn.execute("DROP TRIGGER IF EXISTS events_no_delete")
            conn.execute("DROP TRIGGER IF EXISTS record_events_no_update")
            conn.execute("DROP TRIGGER IF EXISTS record_events_no_delete")
            yield Store(conn, None)
        finally:
            conn.close()
        return
    assert isinstance(backend, PostgresBackend)
    async with await psycopg.AsyncConnection.connect(backend.database.url, autocommit=True) as pg:
        await pg.execute("ALTER TABLE events DISABLE TRIGGER USER")
        await pg.execute("ALTER TABLE record_events DISABLE TRIGGER USER")
        await pg.execute("SET session_replication_role = replica")  # foreign keys out of the way too
        yield Store(None, pg)


Tampering = Callable[[Store], Awaitable[None]]

FORGED_TIME: Final = "2026-01-01T00:00:00.000000+00:00"
FIELD_VALUES: Final[dict[str, str]] = {
    "status": "failed",
    "args": '{"path":"/etc/passwd"}',
    "result": '{"ok":666}',
    "created_at": FORGED_TIME,
    "updated_at": FORGED_TIME,
    "expires_at": FORGED_TIME,
    "parent_id": "inv-0002",
}
"""What an edit of a field sets it to (any other field: `forged`)."""

EDITED: Final = "inv-0001"
"""The record the edits change: the oldest, so every event after it must be rehashed to hide an edit."""


def edit_field(name: str) -> Tampering:
    async def tamper(store: Store) -> None:
        await store.run(f"UPDATE invocations SET {name} = ? WHERE id = ?", (FIELD_VALUES.get(name, "forged"), EDITED))

    return tamper


async def _positions(store: Store) -> list[int]:
    return [row[0] for row in await store.run(f"SELECT {store.position} FROM events ORDER BY {store.position}")]


async def edit_event_detail(store: Store) -> None:
    second = (await _positions(store))[1]
    await store.run(f"UPDATE events SET detail = ? WHERE {store.position} = ?", ('{"by":"mallory"}', second))


async def edit_event_kind(store: Store) -> None:
    last_of_edited = await store.run(f"SELECT MAX({store.position}) FROM events WHERE invocation_id = ?", (EDITED,))
    await store.run(f"UPDATE events SET kind = 'failed' WHERE {store.position} = ?", (last_of_edited[0][0],))


async def delete_interior_event(store: Store) -> None:
    await store.run(f"DELETE FROM events WHERE {store.position} = ?", ((await _positions(store))[2],))


async def delete_tail(store: Store) -> None:
    newest = await _positions(store)
    await store.run(f"DELETE FROM events WHERE {store.position} >= ?", (newest[-2],))


async def delete_tail_and_head(store: Store) -> None:
    """The newest events, and the head of record moved back to the event before them."""
    newest = await _positions(store)
    await store.run(f"DELETE FROM events WHERE {store.position} >= ?", (newest[-2],))
    kept = await store.run(f"SELECT {store.position}, hash FROM events WHERE {store.position} = ?", (newest[-3],))
    await store.run("UPDATE audit_head SET position = ?, hash = ?", (kept[0][0], kept[0][1]))


async def delete_record(store: Store) -> None:
    await store.run("DELETE FROM invocations WHERE id = ?", ("inv-0002",))


async def delete_record_and_events(store: Store) -> None:
    await store.run("DELETE FROM events WHERE invocation_id = ?", ("inv-0002",))
    await store.run("DELETE FROM invocations WHERE id = ?", ("inv-0002",))


async def insert_record(store: Store) -> None:
    """A call that never happened, as a row copied from a real one."""
    columns = ", ".join(INVOCATION_COLUMNS)
    copied = ", ".join("'inv-9999'" if name == "id" else name for name in INVOCATION_COLUMNS)
    extra = ", last_seq" if store.postgres is not None else ""
    await store.run(
        f"INSERT INTO invocations ({columns}{extra}) SELECT {copied}{extra} FROM invocations WHERE id = ?", (EDITED,)
    )


async def insert_record_in_history(store: Store) -> None:
    """A call that never happened, made to look as old as the edited record: its row, and its event put in the chain
    after the edited record's second event."""
    await insert_record(store)
    after = (await _positions(store))[1]
    await _shift_after(store, after)
    kept = await store.run(f"SELECT hash, at FROM events WHERE {store.position} = ?", (after,))
    prev, at = kept[0]
    await insert_event_row(store, after + 1, "inv-9999", 1, "completed", at, "{}", prev, "f" * 64)


async def insert_event(store: Store) -> None:
    """A forged `approved` event, put between the edited record's second and third events."""
    positions = await _positions(store)
    after = positions[1]
    await _shift_after(store, after)
    kept = await store.run(f"SELECT hash, at FROM events WHERE {store.position} = ?", (after,))
    prev, at = kept[0]
    await insert_event_row(store, after + 1, EDITED, 99, "approved", at, '{"by":"mallory"}', prev, "f" * 64)


async def reorder(store: Store) -> None:
    """Two events of one record swap places in the chain (its second and third)."""
    first, second = (await _positions(store))[1:3]
    await store.run(f"UPDATE events SET {store.position} = ? WHERE {store.position} = ?", (-1, first))
    await store.run(f"UPDATE events SET {store.position} = ? WHERE {store.position} = ?", (first, second))
    await store.run(f"UPDATE events SET {store.position} = ? WHERE {store.position} = ?", (second, -1))


async def forge_checkpoint(store: Store) -> None:
    """An edited event hidden behind a checkpoint inserted after it, as if a prune had cut there."""
    await edit_event_detail(store)
    position, hash_ = (await store.run(f"SELECT {store.position}, hash FROM events ORDER BY {store.position}"))[3]
    await store.run(
        "INSERT INTO audit_checkpoints (position, event_id, hash, at, events, invocations) VALUES (?, ?, ?, ?, 0, 0)",
        (position, position, hash_, FORGED_TIME),
    )


KINDS: Final[dict[str, Tampering]] = {
    **{f"edit_{name}": edit_field(name) for name in INVOCATION_COLUMNS if name != "id"},
    "edit_event_detail": edit_event_detail,
    "edit_event_kind": edit_event_kind,
    "delete_interior_event": delete_interior_event,
    "delete_tail": delete_tail,
    "delete_tail_and_head": delete_tail_and_head,
    "delete_record": delete_record,
    "delete_record_and_events": delete_record_and_events,
    "insert_record": insert_record,
    "insert_record_in_history": insert_record_in_history,
    "insert_event": insert_event,
    "reorder": reorder,
    "forge_checkpoint": forge_checkpoint,
}
"""Every kind of tampering the contract tries, by name."""


async def recompute(store: Store) -> None:
    """Make the store consistent again after a tampering, as the recomputing tamperer does: a checkpoint has no
    events before it, a row without events gets one, events without a row go, every record's newest event carries
    its digest, every event is rehashed from the checkpoint's hash (or the genesis), and the head of record is the
    chain's end."""
    position = store.position
    checkpoint = await store.run("SELECT position, hash FROM audit_checkpoints ORDER BY position DESC LIMIT 1")
    start, prev = (checkpoint[0][0], checkpoint[0][1]) if checkpoint else (0, GENESIS)
    await store.run(f"DELETE FROM events WHERE {position} <= ?", (start,))
    await store.run("DELETE FROM events WHERE invocation_id NOT IN (SELECT id FROM invocations)")
    last = await store.run(f"SELECT COALESCE(MAX({position}), 0) FROM events")
    bare = await store.run(
        "SELECT id, updated_at FROM invocations WHERE id NOT IN (SELECT invocation_id FROM events) ORDER BY id"
    )
    next_position = max(int(last[0][0]), start)
    for invocation_id, at in bare:
        next_position += 1
        await insert_event_row(store, next_position, invocation_id, 1, "planned", at, "{}", GENESIS, GENESIS)
    rows = {
        row[0]: row for row in await store.run(f"SELECT {', '.join(INVOCATION_COLUMNS)} FROM invocations ORDER BY id")
    }
    events = [
        ("events", *row)
        for row in await store.run(
            f"SELECT {position}, invocation_id, seq, kind, at, detail, state FROM events ORDER BY {position}"
        )
    ]
    # The records chained beside invocations (bastion.ledger.kept): their rows by key, each given an event if it has
    # none, and their events, merged into the chain by position.
    for kept in KEPT:
        for row in await store.run(adopted_sql(kept)):
            rows[row[len(kept.columns)]] = row[: len(kept.columns)]
    await store.run("DELETE FROM record_events WHERE position <= ?", (start,))
    keys = [key for key in rows if ":" in key]
    have = {row[0] for row in await store.run("SELECT DISTINCT record FROM record_events")}
    for key in have - set(keys):
        await store.run("DELETE FROM record_events WHERE record = ?", (key,))
    last_record = await store.run("SELECT COALESCE(MAX(position), 0) FROM record_events")
    next_position = max(next_position, int(last_record[0][0]), *(event[1] for event in events))
    for key in sorted(set(keys) - have):
        next_position += 1
        await store.run(
            "INSERT INTO record_events (position, record, seq, kind, at, detail, state, prev_hash, hash) "
            "VALUES (?, ?, 1, 'record_adopted', ?, '{}', '', ?, ?)",
            (next_position, key, T0 if store.sqlite is None else stored_time(T0), GENESIS, GENESIS),
        )
    events += [
        ("record_events", *row)
        for row in await store.run("SELECT position, record, seq, kind, at, detail, state FROM record_events")
    ]
    events.sort(key=lambda event: int(event[1]))
    newest: dict[str, tuple[int, int]] = {}
    for _, event_position, subject, seq, *_ in events:
        if seq >= newest.get(subject, (0, 0))[0]:
            newest[subject] = (seq, event_position)
    for table, event_position, subject, seq, kind, at, detail, state in events:
        if newest[subject][1] == event_position:
            state = record_state(rows[subject])
        at_text = stored_time(at) if isinstance(at, datetime) else at
        hashed = event_hash(prev, event_position, subject, seq, kind, at_text, detail, state)
        column = position if table == "events" else "position"
        await store.run(
            f"UPDATE {table} SET prev_hash = ?, hash = ?, state = ? WHERE {column} = ?",
            (prev, hashed, state, event_position),
        )
        prev = hashed
    end = events[-1][1] if events else start
    await store.run("UPDATE audit_head SET position = ?, hash = ?", (end, prev))


async def _shift_after(store: Store, after: int) -> None:
    """Move every event after `after` one place on (highest first, as positions are unique)."""
    for (moved,) in reversed(
        await store.run(f"SELECT {store.position} FROM events WHERE {store.position} > ?", (after,))
    ):
        await store.run(f"UPDATE events SET {store.position} = ? WHERE {store.position} = ?", (moved + 1, moved))


async def insert_event_row(
    store: Store, position: int, invocation_id: str, seq: int, kind: str, at: Any, detail: str, prev: str, hash_: str
) -> None:
    """An event row as given, at `position`: its links and state left to `recompute`, or wrong."""
    if store.sqlite is not None:
        await store.run(
            "INSERT INTO events (id, invocation_id, seq, kind, at, detail, prev_hash, hash, state) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (position, invocation_id, seq, kind, at, detail, prev, hash_, "0" * 64),
        )
        return
    await store.run(
        "INSERT INTO events (position, invocation_id, seq, kind, at, detail, prev_hash, hash, state) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (position, invocation_id, seq, kind, at, detail, prev, hash_, "0" * 64),
    )
