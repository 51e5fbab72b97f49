"""Appending to the audit chain on PostgreSQL (bastion.ledger.chain computes it, as for every backend).

A transaction that appends events first locks the chain's head of record (`HEAD_FOR_UPDATE`, the one row of
`audit_head`, held until commit), which also serialises the writers: positions follow the order of commit. Then it
makes its change, and `append` inserts the change's events with their links, moves the head and notifies the change
feeds, in one statement. Head first, then rows: one lock order for every writer (a decision racing the expiry sweep,
which updates many rows, cannot deadlock with it).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from bastion.ledger.chain import Unlinked, links, record_state, stored_time
from bastion.ledger.kept import Kept, RecordKind, adopted_sql, changed_record, row_sql
from bastion.ledger.postgres.database import NOTIFY, Connection

HEAD_FOR_UPDATE: Final = "SELECT position, hash FROM audit_head FOR UPDATE"

_ARRAYS: Final = (
    ("invocation_id", "text"),
    ("seq", "integer"),
    ("kind", "text"),
    ("at", "timestamptz"),
    ("detail", "text"),
    ("state", "text"),
    ("position", "bigint"),
    ("prev_hash", "text"),
    ("hash", "text"),
)
_COLUMNS: Final = ", ".join(name for name, _ in _ARRAYS)

APPENDED: Final = f"""
    appended AS (
        INSERT INTO events ({_COLUMNS})
        SELECT {_COLUMNS}
        FROM unnest({", ".join(f"%({name}s)s::{kind}[]" for name, kind in _ARRAYS)}) AS event ({_COLUMNS})
        ORDER BY event.position
        RETURNING id, invocation_id, kind
    ), moved AS (
        UPDATE audit_head SET position = %(head_position)s, hash = %(head_hash)s
    )
"""
"""The common table expressions that append the events given as arrays and move the head (see `appending`)."""

APPEND: Final = f"WITH {APPENDED} SELECT appended.id, appended.invocation_id, appended.kind, {NOTIFY} FROM appended"


class Change(NamedTuple):
    """An event to append for a change that left an invocation's row as `row` (`INVOCATION_COLUMNS` order)."""

    row: Sequence[Any]
    seq: int
    kind: str
    at: datetime
    detail: str = "{}"


async def head(conn: Connection) -> tuple[int, str]:
    """Lock the chain's head of record for this transaction and read it: the first statement of every append."""
    found = await (await conn.execute(HEAD_FOR_UPDATE)).fetchone()
    assert found is not None, "audit_head holds one row from the migration that made it"
    return int(found[0]), str(found[1])


def appending(at_head: tuple[int, str], changes: Sequence[Change]) -> dict[str, Any]:
    """The parameters of `APPENDED` for `changes` appended after the head: their links computed here."""
    unlinked = [
        Unlinked(
            change.row[0], change.seq, change.kind, stored_time(change.at), change.detail, record_state(change.row)
        )
        for change in changes
    ]
    linked = links(at_head, unlinked)
    params: dict[str, Any] = {
        "invocation_ids": [event.subject for event in unlinked],
        "seqs": [event.seq for event in unlinked],
        "kinds": [event.kind for event in unlinked],
        "ats": [change.at for change in changes],
        "details": [event.detail for event in unlinked],
        "states": [event.state for event in unlinked],
        "positions": [link.position for link in linked],
        "prev_hashs": [link.prev_hash for link in linked],
        "hashs": [link.hash for link in linked],
    }
    last = linked[-1] if linked else None
    params["head_position"] = last.position if last else at_head[0]
    params["head_hash"] = last.hash if last else at_head[1]
    return params


async def append(conn: Connection, at_head: tuple[int, str], changes: Sequence[Change]) -> builtins.list[Any]:
    """Append the events of `changes` after the head taken by this transaction; the `(event id, invocation id, kind)`
    rows the change feed announces."""
    if not changes:
        return []
    return await (await conn.execute(APPEND, appending(at_head, changes))).fetchall()


_INSERT_RECORD_EVENT: Final = (
    "INSERT INTO record_events (position, record, seq, kind, at, detail, state, prev_hash, hash) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_MOVE_HEAD: Final = "UPDATE audit_head SET position = %s, hash = %s"


async def recorded(
    conn: Connection, statement: str, params: Any, kept: Kept, kind: RecordKind, at: datetime
) -> builtins.list[Sequence[Any]]:
    """Run `statement`, a change of `kept`'s rows returning `kept.returning`, and append an event of `kind` at `at`
    for every row it changed (bastion.ledger.kept), in the caller's transaction, the chain's head taken first (or
    again: in a transaction that appended already, it is where that left it); those rows (`kept.columns`)."""
    at_head = await head(conn)
    rows = await (await conn.execute(statement, params)).fetchall()
    await append_records(conn, at_head, [changed_record(kept, row, kind, stored_time(at)) for row in rows], at)
    return [row[: len(kept.columns)] for row in rows]


async def append_records(conn: Connection, at_head: tuple[int, str], events: Sequence[Unlinked], at: datetime) -> None:
    """Append records' events (all stamped `at`) after the head this transaction holds, and move it."""
    if not events:
        return
    linked = links(at_head, events)
    await conn.cursor().executemany(
        _INSERT_RECORD_EVENT,
        [
            (
                link.position,
                event.subject,
                event.seq,
                event.kind,
                at,
                event.detail,
                event.state,
                link.prev_hash,
                link.hash,
            )
            for event, link in zip(events, linked, strict=True)
        ],
    )
    await conn.execute(_MOVE_HEAD, (linked[-1].position, linked[-1].hash))


async def adopt_records(conn: Connection, kinds: Sequence[Kept]) -> None:
    """Chain the records of `kinds` an upgraded ledger holds: one `record_adopted` event each, at the head."""
    at = datetime.now(UTC)
    adopted = [
        changed_record(kept, row, "record_adopted", stored_time(at))
        for kept in kinds
        for row in await (await conn.execute(adopted_sql(kept))).fetchall()
    ]
    await append_records(conn, await head(conn), adopted, at)


async def record_row(conn: Connection, key: str) -> Sequence[Any] | None:
    """The row of the record `key` (bastion.ledger.kept), as its state digests it; None when it is gone."""
    sql = row_sql(key, "%s")
    return None if sql is None else await (await conn.execute(sql, (key,))).fetchone()
