"""The audit chain of a PostgreSQL ledger (bastion.ledger.chain): reading it in order, exporting it from a cursor,
and pruning its oldest part by retention while keeping it verifiable.

The chain's order is `position` (the order in which transactions appending events committed, see the migration in
bastion.ledger.postgres.schema); an export's cursor is a position too. A prune locks the chain's
head for its transaction, so nothing is appended while it cuts.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from bastion.ledger.audit_reads import AuditReads
from bastion.ledger.backend import INVOCATION_COLUMNS
from bastion.ledger.chain import TERMINAL, CheckpointSigner
from bastion.ledger.decisions import granted
from bastion.ledger.postgres.database import Connection, PostgresDatabase
from bastion.ledger.postgres.grants import grants_by_id
from bastion.ledger.postgres.reads import as_is, invocation_from_row
from bastion.models import AuditCheckpoint, ChainedEvent, Exported, PruneReport

_CHAIN: Final = (
    "SELECT events.id, events.position, events.invocation_id, events.seq, events.kind, events.at, events.detail, "
    "events.prev_hash, events.hash, events.state FROM events"
)
CHAIN_PAGE: Final = f"{_CHAIN} WHERE events.position > %s ORDER BY events.position LIMIT %s"
EXPORT_PAGE: Final = f"""
    {_CHAIN.replace("SELECT ", "SELECT " + ", ".join(f"invocations.{name}" for name in INVOCATION_COLUMNS) + ", ", 1)}
    JOIN invocations ON invocations.id = events.invocation_id
    WHERE events.position > %s ORDER BY events.position LIMIT %s
"""
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
LAST_PRUNABLE: Final = """
    SELECT position, id, hash FROM events WHERE position < %(limit)s AND position < %(head)s
    ORDER BY position DESC LIMIT 1
"""
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


def chained_from_row(row: Sequence[Any]) -> ChainedEvent:
    return ChainedEvent(
        id=row[0],
        position=row[1],
        invocation_id=row[2],
        seq=row[3],
        kind=row[4],
        at=row[5],
        detail=row[6],
        prev_hash=row[7],
        hash=row[8],
        state=row[9],
    )


class PostgresAudit(AuditReads):
    """The audit chain of one PostgreSQL ledger; satisfies `bastion.pipeline.seams.AuditLog`."""

    def __init__(self, db: PostgresDatabase) -> None:
        super().__init__(db, placeholder="%s", moment=as_is, grants_by_id=grants_by_id)
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

    async def chain(self, after: int, limit: int) -> builtins.list[ChainedEvent]:
        """At most `limit` events of the chain after position `after`, in chain order."""
        return [chained_from_row(row) for row in await self._db.fetchall(CHAIN_PAGE, (after, limit))]

    async def export(self, after: int, limit: int) -> builtins.list[Exported]:
        """At most `limit` events with a chain position above `after`, in chain order, each with its invocation as
        stored now (and its row exactly as stored), and the grant its detail names (bastion.ledger.offline). Positions
        are given in the order the appending transactions commit (the chain's head is locked
        until then), so an export resumed from the last position it saw misses nothing; ids, which commit out of
        order, could."""
        rows = await self._db.fetchall(EXPORT_PAGE, (after, limit))
        width = len(INVOCATION_COLUMNS)
        events = [chained_from_row(row[width:]) for row in rows]
        grants = await self.grants_named(event.detail for event in events)
        return [
            Exported(event, invocation_from_row(row[:width]), row[:width], grants.get(granted(event.detail) or ""))
            for event, row in zip(events, rows, strict=True)
        ]

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
