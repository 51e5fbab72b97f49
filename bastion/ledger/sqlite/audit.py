"""The audit chain of a SQLite ledger (bastion.ledger.chain): reading it in order, exporting it from a cursor, and
pruning its oldest part by retention while keeping it verifiable.

One writer at a time means the chain's order is the events' id order, and a position is an event id.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from bastion.ledger.audit_reads import AuditReads
from bastion.ledger.chain import TERMINAL, CheckpointSigner
from bastion.ledger.kept import restated, stale_sql
from bastion.ledger.scrubbing import SCRUBBED, SCRUBBED_COLUMNS, Found, Scrub, plan
from bastion.ledger.sqlite.chain import append_events, record_row
from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.ledger.sqlite.grants import grants_by_id
from bastion.ledger.sqlite.invocations import SCRUB_ROW, changed
from bastion.ledger.sqlite.reads import invocation_from_row
from bastion.ledger.sqlite.schema import dumps, timestamp
from bastion.models import AuditCheckpoint, PruneReport, ScrubReport, utcnow

CHECKPOINT: Final = (
    "SELECT position, event_id, hash, at, events, invocations, key, signature FROM audit_checkpoints "
    "ORDER BY position DESC LIMIT 1"
)
_PRUNABLE: Final = (
    f"(invocations.status IN ({', '.join(repr(s) for s in TERMINAL)}) AND invocations.updated_at < :before)"
)
# The first event of an invocation that must be kept (unresolved, in flight, or too recent): pruning stops before it.
FIRST_KEPT: Final = f"""
    SELECT events.id, events.invocation_id FROM events JOIN invocations ON invocations.id = events.invocation_id
    WHERE NOT {_PRUNABLE} ORDER BY events.id LIMIT 1
"""
# The last event a prune removes: of an invocation or of a record, never the chain's head.
LAST_PRUNABLE: Final = """
    SELECT position, hash
    FROM (SELECT id AS position, hash FROM events UNION ALL SELECT position, hash FROM record_events)
    WHERE position < :limit AND position < (SELECT position FROM audit_head) ORDER BY position DESC LIMIT 1
"""
STALE: Final = stale_sql(":through")
DELETE_RECORD_EVENTS: Final = "DELETE FROM record_events WHERE position <= :through"
INSERT_CHECKPOINT: Final = (
    "INSERT INTO audit_checkpoints (position, event_id, hash, at, events, invocations, key, signature) "
    "VALUES (:position, :position, :hash, :at, :events, :invocations, :key, :signature)"
)
PRUNED_INVOCATIONS: Final = "SELECT DISTINCT invocation_id FROM events WHERE id <= :through"
DELETE_EVENTS: Final = "DELETE FROM events WHERE id <= :through"
# Invocations left with no event and no kept step (a kept step's parent stays with it).
DELETE_INVOCATIONS: Final = """
    DELETE FROM invocations
    WHERE id IN (SELECT value FROM json_each(:ids))
      AND NOT EXISTS (SELECT 1 FROM events WHERE events.invocation_id = invocations.id)
      AND NOT EXISTS (
          SELECT 1 FROM invocations AS step
          WHERE step.parent_id = invocations.id AND step.id NOT IN (SELECT value FROM json_each(:ids))
      )
"""
UPDATE_CHECKPOINT_COUNTS: Final = (
    "UPDATE audit_checkpoints SET events = :events, invocations = :invocations WHERE position = :position"
)


def checkpoint_from_row(row: Sequence[Any]) -> AuditCheckpoint:
    return AuditCheckpoint(
        position=row[0],
        event_id=row[1],
        hash=row[2],
        at=datetime.fromisoformat(row[3]),
        events=row[4],
        invocations=row[5],
        key=row[6],
        signature=row[7],
    )


_HOLDING: Final = " OR ".join(f"instr({name}, :form) > 0" for name in SCRUBBED_COLUMNS)
SCRUB_ROWS: Final = f"SELECT id, {', '.join(SCRUBBED_COLUMNS)} FROM invocations WHERE {_HOLDING}"
SCRUB_EVENTS: Final = "SELECT id, id, invocation_id, hash, detail FROM events WHERE instr(detail, :form) > 0"
SCRUBBED_NOW: Final = f"SELECT {', '.join(SCRUBBED_COLUMNS)} FROM invocations WHERE id = ?"
SCRUB_DETAIL: Final = "UPDATE events SET detail = ? WHERE id = ?"
SCRUB_OUTBOX: Final = "UPDATE outbox SET body = replace(body, :form, :scrubbed) WHERE instr(body, :form) > 0"
_NO_UPDATE: Final = "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'events_no_update'"


class SqliteAudit(AuditReads):
    """The audit chain of one SQLite ledger file; satisfies `bastion.pipeline.seams.AuditLog`."""

    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(
            db,
            placeholder="?",
            position="id",
            moment=datetime.fromisoformat,
            grants_by_id=grants_by_id,
            from_row=invocation_from_row,
        )
        self._db: SqliteDatabase = db

    async def checkpoint(self) -> AuditCheckpoint | None:
        """The latest prune's checkpoint, or None when nothing was ever pruned."""
        row = await self._db.fetchone(CHECKPOINT)
        return None if row is None else checkpoint_from_row(row)

    async def scrub(self, scrub: Scrub) -> ScrubReport:
        """Replace every form of a leaked secret in invocations, event details and the outbox, in one transaction,
        as `verify` accepts it (bastion.ledger.scrubbing): a signed `scrubbed` event on every invocation touched."""

        def work(conn: sqlite3.Connection) -> ScrubReport:
            rows: dict[str, Sequence[Any]] = {}
            events: dict[int, Found] = {}
            outbox = 0
            for form in scrub.forms:
                rows.update((row[0], row) for row in conn.execute(SCRUB_ROWS, {"form": form}))
                events.update((row[0], Found(*row)) for row in conn.execute(SCRUB_EVENTS, {"form": form}))
                outbox += conn.execute(SCRUB_OUTBOX, {"form": form, "scrubbed": SCRUBBED}).rowcount
            planned = plan(scrub, rows.values(), events.values())
            # The events table refuses updates (a trigger): a scrub lifts it for its own transaction only.
            (trigger,) = conn.execute(_NO_UPDATE).fetchone()
            conn.execute("DROP TRIGGER events_no_update")
            conn.executemany(SCRUB_DETAIL, [(detail, event_id) for event_id, detail in planned.details.items()])
            conn.execute(trigger)
            at = timestamp(utcnow())
            changes = []
            for invocation_id, detail in planned.signed.items():
                values = planned.rows.get(invocation_id) or conn.execute(SCRUBBED_NOW, (invocation_id,)).fetchone()
                (returned,) = conn.execute(SCRUB_ROW, (*values, invocation_id)).fetchall()
                changes.append(changed(returned, "scrubbed", at, dumps(detail)))
            append_events(conn, changes)
            return ScrubReport(invocations=len(planned.signed), events=len(planned.details), outbox=outbox)

        return await self._db.write(work)

    async def prune(self, before: datetime, *, now: datetime, sign: CheckpointSigner | None = None) -> PruneReport:
        """Delete the oldest events, up to the first that belongs to an invocation not finished before `before`
        (and never the newest event), with the invocations left without events; record a checkpoint carrying the
        last pruned event's hash (signed with `sign`, when given), in one transaction."""
        params = {"before": timestamp(before)}

        def work(conn: sqlite3.Connection) -> PruneReport:
            kept = conn.execute(FIRST_KEPT, params).fetchone()
            limit = kept[0] if kept is not None else (1 << 62)
            last = conn.execute(LAST_PRUNABLE, {"limit": limit}).fetchone()
            kept_by = kept[1] if kept is not None else None
            if last is None:
                return PruneReport(events=0, invocations=0, kept_by=kept_by)
            through, hash_ = last
            key, signature = sign(through, hash_, now) if sign is not None else (None, None)
            ids = dumps([row[0] for row in conn.execute(PRUNED_INVOCATIONS, {"through": through}).fetchall()])
            at = timestamp(now)
            # The checkpoint first: the delete trigger lets only events up to it go.
            conn.execute(
                INSERT_CHECKPOINT,
                {
                    "position": through,
                    "hash": hash_,
                    "at": at,
                    "events": 0,
                    "invocations": 0,
                    "key": key,
                    "signature": signature,
                },
            )
            stale = conn.execute(STALE, {"through": through}).fetchall()
            rows = {key: row for key in {row[0] for row in stale} if (row := record_row(conn, key)) is not None}
            append_events(conn, restated(stale, rows, at))
            conn.execute(DELETE_RECORD_EVENTS, {"through": through})
            events = conn.execute(DELETE_EVENTS, {"through": through}).rowcount
            invocations = conn.execute(DELETE_INVOCATIONS, {"ids": ids}).rowcount
            counts = {"position": through, "events": events, "invocations": invocations}
            conn.execute(UPDATE_CHECKPOINT_COUNTS, counts)
            checkpoint = AuditCheckpoint(
                position=through,
                event_id=through,
                hash=hash_,
                at=now,
                events=events,
                invocations=invocations,
                key=key,
                signature=signature,
            )
            return PruneReport(events=events, invocations=invocations, checkpoint=checkpoint, kept_by=kept_by)

        return await self._db.write(work)
