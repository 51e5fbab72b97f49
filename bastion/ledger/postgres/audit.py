"""The audit chain of a PostgreSQL ledger (bastion.ledger.chain): reading it in order, exporting it from a cursor,
and pruning its oldest part by retention while keeping it verifiable.

The chain's order is `position` (the order in which transactions appending events committed, see the migration in
bastion.ledger.postgres.schema); an export's cursor is a position too. A prune locks the chain's
head for its transaction, so nothing is appended while it cuts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from bastion.ledger.audit_reads import AuditReads
from bastion.ledger.chain import TERMINAL, CheckpointSigner, stored_time
from bastion.ledger.kept import restated, stale_sql
from bastion.ledger.postgres.chain import append, append_records, record_row
from bastion.ledger.postgres.chain import head as chain_head
from bastion.ledger.postgres.database import Connection, PostgresDatabase
from bastion.ledger.postgres.grants import grants_by_id
from bastion.ledger.postgres.invocations import SCRUB_ROW, changes
from bastion.ledger.postgres.reads import as_is, invocation_from_row
from bastion.ledger.scrubbing import SCRUBBED, SCRUBBED_COLUMNS, Found, Scrub, plan
from bastion.models import AuditCheckpoint, PruneReport, ScrubReport, utcnow

CHECKPOINT: Final = (
    "SELECT position, event_id, hash, at, events, invocations, key, signature FROM audit_checkpoints "
    "ORDER BY position DESC LIMIT 1"
)
LOCK_HEAD: Final = "SELECT position FROM audit_head FOR UPDATE"
_PRUNABLE: Final = (
    f"(invocations.status IN ({', '.join(repr(s) for s in TERMINAL)}) AND invocations.updated_at < %(before)s)"
)
FIRST_KEPT: Final = f"""
    SELECT events.position, events.invocation_id FROM events JOIN invocations ON invocations.id = events.invocation_id
    WHERE NOT {_PRUNABLE} ORDER BY events.position LIMIT 1
"""
# The last event a prune removes: of an invocation or of a record, never the chain's head.
LAST_PRUNABLE: Final = """
    SELECT position, id, hash FROM (
        SELECT position, id, hash FROM events UNION ALL SELECT position, position, hash FROM record_events
    ) AS chain
    WHERE position < %(limit)s AND position < %(head)s ORDER BY position DESC LIMIT 1
"""
STALE: Final = stale_sql("%(through)s")
DELETE_RECORD_EVENTS: Final = "DELETE FROM record_events WHERE position <= %(through)s"
INSERT_CHECKPOINT: Final = (
    "INSERT INTO audit_checkpoints (position, event_id, hash, at, events, invocations, key, signature) "
    "VALUES (%(position)s, %(event_id)s, %(hash)s, %(at)s, %(events)s, %(invocations)s, %(key)s, %(signature)s)"
)
DELETE_EVENTS: Final = "DELETE FROM events WHERE position <= %(through)s RETURNING invocation_id"
DELETE_INVOCATIONS: Final = """
    DELETE FROM invocations
    WHERE id = ANY(%(ids)s)
      AND NOT EXISTS (SELECT 1 FROM events WHERE events.invocation_id = invocations.id)
      AND NOT EXISTS (
          SELECT 1 FROM invocations AS step WHERE step.parent_id = invocations.id AND NOT step.id = ANY(%(ids)s)
      )
"""
UPDATE_CHECKPOINT_COUNTS: Final = (
    "UPDATE audit_checkpoints SET events = %(events)s, invocations = %(invocations)s WHERE position = %(position)s"
)


_HOLDING: Final = " OR ".join(f"strpos({name}, %(form)s) > 0" for name in SCRUBBED_COLUMNS)
SCRUB_ROWS: Final = f"SELECT id, {', '.join(SCRUBBED_COLUMNS)} FROM invocations WHERE {_HOLDING}"
SCRUBBED_NOW: Final = f"SELECT {', '.join(SCRUBBED_COLUMNS)} FROM invocations WHERE id = %s"
SCRUB_EVENTS: Final = "SELECT id, position, invocation_id, hash, detail FROM events WHERE strpos(detail, %(form)s) > 0"
SCRUB_DETAIL: Final = "UPDATE events SET detail = %s WHERE id = %s"
SCRUB_OUTBOX: Final = "UPDATE outbox SET body = replace(body, %(form)s, %(scrubbed)s) WHERE strpos(body, %(form)s) > 0"


class PostgresAudit(AuditReads):
    """The audit chain of one PostgreSQL ledger; satisfies `bastion.pipeline.seams.AuditLog`."""

    def __init__(self, db: PostgresDatabase) -> None:
        super().__init__(
            db,
            placeholder="%s",
            position="position",
            moment=as_is,
            grants_by_id=grants_by_id,
            from_row=invocation_from_row,
        )
        self._db: PostgresDatabase = db

    async def checkpoint(self) -> AuditCheckpoint | None:
        """The latest prune's checkpoint, or None when nothing was ever pruned."""
        row = await self._db.fetchone(CHECKPOINT)
        if row is None:
            return None
        return AuditCheckpoint(
            position=row[0],
            event_id=row[1],
            hash=row[2],
            at=row[3],
            events=row[4],
            invocations=row[5],
            key=row[6],
            signature=row[7],
        )

    async def scrub(self, scrub: Scrub) -> ScrubReport:
        """Replace every form of a leaked secret in invocations, event details and the outbox, in one transaction
        holding the chain's head, as `verify` accepts it (bastion.ledger.scrubbing): a signed `scrubbed` event on
        every invocation touched."""

        async def work(conn: Connection) -> ScrubReport:
            at_head = await chain_head(conn)
            rows: dict[str, Sequence[Any]] = {}
            events: dict[int, Found] = {}
            outbox = 0
            for form in scrub.forms:
                found = await (await conn.execute(SCRUB_ROWS, {"form": form})).fetchall()
                rows.update((str(row[0]), row) for row in found)
                for row in await (await conn.execute(SCRUB_EVENTS, {"form": form})).fetchall():
                    events[int(row[0])] = Found(*row)
                params = {"form": form, "scrubbed": SCRUBBED}
                outbox += (await conn.execute(SCRUB_OUTBOX, params)).rowcount
            planned = plan(scrub, rows.values(), events.values())
            # The events table refuses updates (a trigger): a scrub lifts it inside its own transaction only.
            await conn.execute("ALTER TABLE events DISABLE TRIGGER events_no_update")
            for event_id, detail in planned.details.items():
                await conn.execute(SCRUB_DETAIL, (detail, event_id))
            await conn.execute("ALTER TABLE events ENABLE TRIGGER events_no_update")
            now = utcnow()
            changed = []
            for invocation_id, signed in planned.signed.items():
                values = planned.rows.get(invocation_id)
                if values is None:
                    values = await (await conn.execute(SCRUBBED_NOW, (invocation_id,))).fetchone()
                returned = await (await conn.execute(SCRUB_ROW, (*(values or ()), invocation_id))).fetchall()
                changed += changes(returned, "scrubbed", now, json.dumps(signed, separators=(",", ":")))
            await append(conn, at_head, changed)
            return ScrubReport(invocations=len(planned.signed), events=len(planned.details), outbox=outbox)

        return await self._db.transaction(work)

    async def prune(self, before: datetime, *, now: datetime, sign: CheckpointSigner | None = None) -> PruneReport:
        """Delete the oldest events of the chain, up to the first that belongs to an invocation not finished before
        `before` (never the newest event), with the invocations left without events; record a checkpoint carrying
        the last pruned event's hash (signed with `sign`, when given), in one transaction holding the chain's
        head."""

        async def work(conn: Connection) -> PruneReport:
            head = await (await conn.execute(LOCK_HEAD)).fetchone()
            head_position = int(head[0]) if head is not None else 0
            kept = await (await conn.execute(FIRST_KEPT, {"before": before})).fetchone()
            kept_by = None if kept is None else str(kept[1])
            limit = head_position + 1 if kept is None else int(kept[0])
            last = await (await conn.execute(LAST_PRUNABLE, {"limit": limit, "head": head_position})).fetchone()
            if last is None:
                return PruneReport(events=0, invocations=0, kept_by=kept_by)
            through, event_id, hash_ = int(last[0]), int(last[1]), str(last[2])
            key, signature = sign(through, hash_, now) if sign is not None else (None, None)
            params = {
                "key": key,
                "signature": signature,
                "position": through,
                "event_id": event_id,
                "hash": hash_,
                "at": now,
                "events": 0,
                "invocations": 0,
            }
            await conn.execute(INSERT_CHECKPOINT, params)
            stale = await (await conn.execute(STALE, {"through": through})).fetchall()
            rows = {key: row for key in {row[0] for row in stale} if (row := await record_row(conn, key)) is not None}
            await append_records(conn, await chain_head(conn), restated(stale, rows, stored_time(now)), now)
            await conn.execute(DELETE_RECORD_EVENTS, {"through": through})
            deleted = await (await conn.execute(DELETE_EVENTS, {"through": through})).fetchall()
            ids = sorted({str(row[0]) for row in deleted})
            invocations = (await conn.execute(DELETE_INVOCATIONS, {"ids": ids})).rowcount
            counts = {"position": through, "events": len(deleted), "invocations": invocations}
            await conn.execute(UPDATE_CHECKPOINT_COUNTS, counts)
            checkpoint = AuditCheckpoint(
                position=through,
                event_id=event_id,
                hash=hash_,
                at=now,
                events=len(deleted),
                invocations=invocations,
                key=key,
                signature=signature,
            )
            return PruneReport(events=len(deleted), invocations=invocations, checkpoint=checkpoint, kept_by=kept_by)

        return await self._db.transaction(work)
