"""What verifying a ledger reads of it, the same on both backends (`AuditReads`, the base of `SqliteAudit` and
`PostgresAudit`): the head of record, the rows with what their events say, the approvals of held calls and the
uses of grants. The statements differ only in their placeholder, and the backends in how a timestamp comes back.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from bastion.ledger.backend import INVOCATION_COLUMNS
from bastion.ledger.chain import GENESIS, ReadOrphans, ReadRecords, StoredRecord, verify_chain, verify_records
from bastion.ledger.decisions import (
    GRANT_SOURCE,
    EarlierApproval,
    GrantUse,
    HeldDecision,
    granted,
    required_approvers,
)
from bastion.ledger.kept import KEPT, Kept, orphans_sql, records_sql, row_sql
from bastion.models import AuditCheckpoint, AuditReport, ChainedEvent, Exported, Grant, Invocation

HEAD: Final = "SELECT position, hash FROM audit_head"
# The chain: the invocations' events and the records' (bastion.ledger.kept), which share its positions.
_CHAIN: Final = """
    SELECT id, {position} AS position, invocation_id, NULL AS record, seq, kind, at, detail, prev_hash, hash, state
    FROM events WHERE {position} > {p}
    UNION ALL
    SELECT position, position, NULL, record, seq, kind, at, detail, prev_hash, hash, state
    FROM record_events WHERE position > {p}
"""
_CHAIN_PAGE: Final = "SELECT * FROM ({chain}) AS chain ORDER BY position LIMIT {p}"
_EXPORT_PAGE: Final = f"""
    SELECT chain.*, {", ".join(f"invocations.{name}" for name in INVOCATION_COLUMNS)}
    FROM ({{chain}}) AS chain LEFT JOIN invocations ON invocations.id = chain.invocation_id
    ORDER BY chain.position LIMIT {{p}}
"""
_CHAIN_WIDTH: Final = 11
_SCRUBS: Final = "SELECT detail FROM events WHERE kind = 'scrubbed'"
_OF_ROW: Final = "events.invocation_id = invocations.id"
_RECORDS: Final = f"""
    SELECT {", ".join(f"invocations.{name}" for name in INVOCATION_COLUMNS)},
           (SELECT state FROM events WHERE {_OF_ROW} ORDER BY seq DESC LIMIT 1),
           (SELECT COUNT(*) FROM events WHERE {_OF_ROW}),
           EXISTS (SELECT 1 FROM invocations AS step WHERE step.parent_id = invocations.id)
    FROM invocations WHERE id > {{p}} ORDER BY id LIMIT {{p}}
"""
ORPHANS: Final = """
    SELECT DISTINCT invocation_id FROM events
    WHERE NOT EXISTS (SELECT 1 FROM invocations WHERE invocations.id = events.invocation_id)
    ORDER BY invocation_id LIMIT 100
"""
_DECISIONS: Final = """
    SELECT invocations.id, invocations.args_hash, invocations.fingerprint, events.detail, events.at, events.state,
           held.detail, held.{position}
    FROM events JOIN invocations ON invocations.id = events.invocation_id
    JOIN events AS held ON held.invocation_id = events.invocation_id AND held.kind = 'pending'
    WHERE events.kind = 'approved' AND invocations.id > {p}
    ORDER BY invocations.id LIMIT {p}
"""
_EARLIER_APPROVALS: Final = """
    SELECT invocation_id, detail, at, state FROM events
    WHERE kind = 'approval_recorded' AND invocation_id IN ({ids}) ORDER BY invocation_id, seq
"""
_GRANT_USES: Final = f"""
    SELECT id, policy_key, session_id, principal, created_at, substr(mode_source, {len(GRANT_SOURCE) + 1})
    FROM invocations
    WHERE substr(mode_source, 1, {len(GRANT_SOURCE)}) = '{GRANT_SOURCE}' AND id > {{p}} ORDER BY id LIMIT {{p}}
"""


GrantsById = Callable[[Any, Collection[str]], Awaitable[dict[str, Grant]]]
"""A backend's grants of these ids that exist, by id (given its database)."""


class AuditReads:
    """The reads `verify` makes, over one backend's database: `placeholder` is its parameter mark, `moment` turns a
    timestamp as it comes back into a datetime, `grants_by_id` reads grants. A backend adds its chain's order
    (`chain`) and its checkpoint."""

    def __init__(
        self,
        db: Any,
        *,
        placeholder: str,
        position: str,
        moment: Callable[[Any], datetime],
        grants_by_id: GrantsById,
        from_row: Callable[[Sequence[Any]], Invocation],
    ) -> None:
        """`position`: the column of an invocation event's chain position; `from_row`: an invocation from its row."""
        self._db = db
        self._placeholder = placeholder
        self._moment = moment
        self._grants_by_id = grants_by_id
        self._from_row = from_row
        chain = _CHAIN.format(position=position, p=placeholder)
        self._chain_sql = _CHAIN_PAGE.format(chain=chain, p=placeholder)
        self._export_sql = _EXPORT_PAGE.format(chain=chain, p=placeholder)
        self._placeholder = placeholder
        self._kept_sql = {kept.prefix: records_sql(kept, placeholder) for kept in KEPT}
        self._records_sql = _RECORDS.format(p=placeholder)
        self._decisions_sql = _DECISIONS.format(p=placeholder, position=position)
        self._grant_uses_sql = _GRANT_USES.format(p=placeholder)

    async def checkpoint(self) -> AuditCheckpoint | None:
        raise NotImplementedError

    async def chain(self, after: int, limit: int) -> builtins.list[ChainedEvent]:
        """At most `limit` events of the chain after position `after`, in chain order."""
        return [self._chained(row) for row in await self._db.fetchall(self._chain_sql, (after, after, limit))]

    async def export(self, after: int, limit: int) -> builtins.list[Exported]:
        """At most `limit` events with a chain position above `after`, in chain order, each with its invocation as
        stored now and its row exactly as stored (a record's event: the record's row), and the grant its detail names
        (bastion.ledger.offline). Positions follow the order the appending transactions commit, so an export resumed
        from the last position it saw misses nothing."""
        rows = await self._db.fetchall(self._export_sql, (after, after, limit))
        events = [self._chained(row) for row in rows]
        grants = await self.grants_named(event.detail for event in events)
        exported = []
        for event, row in zip(events, rows, strict=True):
            grant = grants.get(granted(event.detail) or "")
            if event.record is None:
                stored = row[_CHAIN_WIDTH:]
                exported.append(Exported(event, self._from_row(stored), stored, grant))
            else:
                exported.append(Exported(event, None, await self._record_row(event.record), grant))
        return exported

    async def _record_row(self, key: str) -> Sequence[Any]:
        """A record's row as its state digests it (bastion.ledger.kept); empty when it is gone."""
        sql = row_sql(key, self._placeholder)
        found = await self._db.fetchall(sql, (key,)) if sql is not None else []
        return found[0] if found else ()

    def _chained(self, row: Sequence[Any]) -> ChainedEvent:
        return ChainedEvent(
            id=row[0],
            position=row[1],
            invocation_id=row[2],
            record=row[3],
            seq=row[4],
            kind=row[5],
            at=self._moment(row[6]),
            detail=row[7],
            prev_hash=row[8],
            hash=row[9],
            state=row[10],
        )

    async def head(self) -> tuple[int, str]:
        """The chain's head of record (position, hash): kept apart from the events; (0, the genesis) when missing."""
        rows = await self._db.fetchall(HEAD)
        return (int(rows[0][0]), str(rows[0][1])) if rows else (0, GENESIS)

    async def verify(
        self,
        anchored: Mapping[int, str] = MappingProxyType({}),
        scrubbed: Mapping[int, tuple[int, str, str]] = MappingProxyType({}),
    ) -> AuditReport:
        """Check the chain from the checkpoint to its head of record, then every invocation row against its newest
        event; the report names the first break. `anchored`: (position: hash) of anchors whose signatures hold;
        `scrubbed`: the events signed scrubs changed (bastion.ledger.scrubbing)."""
        chain = await verify_chain(
            await self.checkpoint(),
            self.chain,
            head_of_record=await self.head(),
            anchored=anchored,
            scrubbed=scrubbed,
        )
        report = await verify_records(chain, self._records, self._orphans)
        for kept in KEPT:
            report = await verify_records(report, self._kept_records(kept), self._kept_orphans(kept), what="record")
        return report

    def _kept_records(self, kept: Kept) -> ReadRecords:
        width, sql = len(kept.columns), self._kept_sql[kept.prefix]

        async def read(after: str, limit: int) -> builtins.list[StoredRecord]:
            rows = await self._db.fetchall(sql, (after, limit))
            return [StoredRecord(row[width], row[:width], row[width + 1], row[width + 2], False) for row in rows]

        return read

    def _kept_orphans(self, kept: Kept) -> ReadOrphans:
        async def read() -> builtins.list[str]:
            return [row[0] for row in await self._db.fetchall(orphans_sql(kept))]

        return read

    async def scrubs(self) -> builtins.list[str]:
        """The details (JSON text) of every `scrubbed` event: what each scrub changed, signed."""
        return [row[0] for row in await self._db.fetchall(_SCRUBS)]

    async def decisions(self, after: str, limit: int) -> builtins.list[HeldDecision]:
        """The approvals of held calls with an invocation id above `after`, in id order, each with the grant it names
        as stored now (bastion.ledger.decisions)."""
        rows = await self._db.fetchall(self._decisions_sql, (after, limit))
        grants = await self.grants_named(row[3] for row in rows)
        several = [row[0] for row in rows if required_approvers(row[6]) > 1]
        earlier: dict[str, list[EarlierApproval]] = {}
        if several:
            sql = _EARLIER_APPROVALS.format(ids=", ".join([self._placeholder] * len(several)))
            for invocation_id, detail, at, state in await self._db.fetchall(sql, tuple(several)):
                earlier.setdefault(invocation_id, []).append(
                    EarlierApproval(detail, self._moment(at), state is not None)
                )
        return [
            HeldDecision(
                row[0],
                row[1],
                row[2],
                row[3],
                self._moment(row[4]),
                row[5] is not None,
                grants.get(granted(row[3]) or ""),
                required_approvers(row[6]),
                tuple(earlier.get(row[0], ())),
                row[6],
                row[7],
            )
            for row in rows
        ]

    async def grant_uses(self, after: str, limit: int) -> builtins.list[GrantUse]:
        """The calls grants let through with an invocation id above `after`, in id order, each with its grant."""
        rows = await self._db.fetchall(self._grant_uses_sql, (after, limit))
        grants = await self._grants_by_id(self._db, {row[5] for row in rows})
        return [
            GrantUse(row[0], row[1], row[2], row[3], self._moment(row[4]), row[5], grants.get(row[5])) for row in rows
        ]

    async def grants_named(self, details: Iterable[str]) -> dict[str, Grant]:
        """The grants the event details (JSON text) name, by id."""
        return await self._grants_by_id(self._db, {grant_id for detail in details if (grant_id := granted(detail))})

    async def _records(self, after: str, limit: int) -> builtins.list[StoredRecord]:
        width = len(INVOCATION_COLUMNS)
        rows = await self._db.fetchall(self._records_sql, (after, limit))
        return [StoredRecord(row[0], row[:width], row[width], row[width + 1], bool(row[width + 2])) for row in rows]

    async def _orphans(self) -> builtins.list[str]:
        return [row[0] for row in await self._db.fetchall(ORPHANS)]
