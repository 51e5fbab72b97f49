"""Verifying an audit export offline: with the export (`bastion audit export`), the signed anchors, and the public
key, and nothing else: no database, no configuration, no Bastion process.

    python -m bastion.ledger.offline export.jsonl --public-key ed25519:... [--anchors anchors.jsonl]

Each export line carries, under `stored`, the exact text the chain hashed (the event's detail, the invocation's row
as stored) and the grant an approval left, so the same checks `bastion audit verify` makes run here, by the same
functions (bastion.ledger.chain, bastion.ledger.decisions) over the lines instead of the tables: every link and hash,
every row against its newest event, every anchor within the export, every approval of a held call signed, every use
of a grant inside it. An export that starts after the chain's start (`--since`, or a pruned ledger) is checked from
its first event on; what came before is not in it. Exit status: 0 holds, 1 broken, 2 unusable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import anyio

from bastion.errors import ConfigError
from bastion.ledger.anchors import Anchor, parse_public, public_text, read_anchors, signature_fault
from bastion.ledger.backend import INVOCATION_COLUMNS
from bastion.ledger.chain import StoredRecord, stored_time, verify_chain, verify_records
from bastion.ledger.decisions import (
    GRANT_SOURCE,
    EarlierApproval,
    GrantUse,
    HeldDecision,
    granted,
    required_approvers,
    verify_decisions,
)
from bastion.ledger.scrubbing import accepted
from bastion.models import AuditReport, ChainBreak, ChainedEvent, Exported, Grant

_COLUMN: dict[str, int] = {name: index for index, name in enumerate(INVOCATION_COLUMNS)}


def export_line(exported: Exported) -> dict[str, Any]:
    """One line of an audit export (`bastion audit export`, `GET /api/audit`): the event with its chain hashes (its
    detail parsed back from the stored text), its invocation as stored when exported (redacted as stored), and under
    `stored` the exact texts the chain hashed and the grant the event names, which `verify_export` reads."""
    event = exported.event
    line = event.model_dump(mode="json")
    line["detail"] = json.loads(event.detail)
    line["invocation"] = None if exported.invocation is None else exported.invocation.model_dump(mode="json")
    line["stored"] = {
        "detail": event.detail,
        "row": [stored_time(value) if isinstance(value, datetime) else value for value in exported.row],
        "grant": exported.grant.model_dump(mode="json") if exported.grant is not None else None,
    }
    return line


class _Line(NamedTuple):
    event: ChainedEvent
    row: Sequence[Any]
    grant: Grant | None


def _parsed(number: int, text: str) -> _Line:
    """One export line; ConfigError naming the line when it is not one `bastion audit export` wrote."""
    try:
        line = json.loads(text)
        stored = line["stored"]
        event = ChainedEvent.model_validate(line | {"detail": stored["detail"]})
        row = stored["row"]
        grant = Grant.model_validate(stored["grant"]) if stored.get("grant") else None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"line {number} is not an export line with its stored texts ({exc}); export it again with `bastion audit "
            "export` of this version"
        ) from exc
    if not isinstance(row, list) or (event.record is None and len(row) != len(INVOCATION_COLUMNS)):
        raise ConfigError(f"line {number}: its stored row has not the {len(INVOCATION_COLUMNS)} columns of a record")
    return _Line(event, row, grant)


async def verify_export(lines: Sequence[_Line], anchors: Sequence[Anchor], trusted: Sequence[str]) -> AuditReport:
    """The report of `bastion audit verify`, made from an export's lines."""
    for number, anchor in enumerate(anchors, start=1):
        fault = signature_fault(
            "anchor", anchor.position, anchor.hash, anchor.at, anchor.key, anchor.signature, trusted
        )
        if fault is not None:
            message = f"anchor {number} (position {anchor.position}) does not hold: {fault}"
            return AuditReport(
                verified=0, broken=ChainBreak(event_id=0, position=anchor.position, reason="anchor", message=message)
            )
    if not lines:
        return AuditReport(verified=0)
    first, last = lines[0].event, lines[-1].event
    start = first.position - 1
    anchored = {anchor.position: anchor.hash for anchor in anchors if anchor.position > start}

    async def page(after: int, limit: int) -> list[ChainedEvent]:
        return [line.event for line in lines if line.event.position > after][:limit]

    scrubbed, _ = accepted((line.event.detail for line in lines if line.event.kind == "scrubbed"), trusted)
    chain = await verify_chain(
        None,
        page,
        head_of_record=(last.position, last.hash),
        anchored=anchored,
        start=(start, first.prev_hash),
        scrubbed=scrubbed,
    )
    records = _records(lines)
    report = await verify_records(chain, _pages(sorted(records.values())), _nothing)
    calls = {line.event.invocation_id: records[line.event.invocation_id] for line in lines if line.event.invocation_id}
    held, uses = _pages(_held(lines, calls)), _pages(_uses(calls, _grants(lines)))
    return await verify_decisions(report, held, uses, trusted, scrubbed.keys())


def _records(lines: Sequence[_Line]) -> dict[str, StoredRecord]:
    """Each invocation and record of the export: its row as exported (the last line's), and the state its newest
    event carries."""
    newest: dict[str, ChainedEvent] = {}
    rows: dict[str, Sequence[Any]] = {}
    counts: dict[str, int] = {}
    for line in lines:
        event = line.event
        subject = event.subject
        if subject not in newest or event.seq > newest[subject].seq:
            newest[subject] = event
        rows[subject] = line.row
        counts[subject] = counts.get(subject, 0) + 1
    return {
        key: StoredRecord(key, rows[key], newest[key].state, counts[key], kept_step=False) for key in sorted(newest)
    }


def _held(lines: Sequence[_Line], records: Mapping[str, StoredRecord]) -> list[HeldDecision]:
    """The approvals of held calls in the export, by invocation id."""
    pending = {line.event.invocation_id: line.event.detail for line in lines if line.event.kind == "pending"}
    held_at = {line.event.invocation_id: line.event.position for line in lines if line.event.kind == "pending"}
    earlier: dict[str, list[EarlierApproval]] = {}
    for line in sorted(lines, key=lambda line: line.event.seq):
        event = line.event
        if event.kind == "approval_recorded" and event.invocation_id is not None:
            approval = EarlierApproval(event.detail, event.at, event.state is not None)
            earlier.setdefault(event.invocation_id, []).append(approval)
    held = []
    for line in lines:
        event = line.event
        if event.kind != "approved" or event.invocation_id is None or event.invocation_id not in pending:
            continue
        row = records[event.invocation_id].values
        held.append(
            HeldDecision(
                event.invocation_id,
                str(row[_COLUMN["args_hash"]]),
                _text(row[_COLUMN["fingerprint"]]),
                event.detail,
                event.at,
                event.state is not None,
                line.grant if line.grant is not None and line.grant.id == granted(event.detail) else None,
                required_approvers(pending[event.invocation_id]),
                tuple(earlier.get(event.invocation_id, ())),
                pending[event.invocation_id],
                held_at[event.invocation_id],
            )
        )
    return sorted(held, key=lambda decision: decision.invocation_id)


def _grants(lines: Iterable[_Line]) -> dict[str, Grant]:
    return {line.grant.id: line.grant for line in lines if line.grant is not None}


def _uses(records: Mapping[str, StoredRecord], grants: Mapping[str, Grant]) -> list[GrantUse]:
    """The calls of the export a grant let through, each with that grant when the export holds it."""
    uses = []
    for key, record in sorted(records.items()):
        row = record.values
        source = row[_COLUMN["mode_source"]]
        if not isinstance(source, str) or not source.startswith(GRANT_SOURCE):
            continue
        grant_id = source.removeprefix(GRANT_SOURCE)
        created = datetime.fromisoformat(str(row[_COLUMN["created_at"]]))
        policy_key, session_id = str(row[_COLUMN["policy_key"]]), str(row[_COLUMN["session_id"]])
        principal = _text(row[_COLUMN["principal"]])
        uses.append(GrantUse(key, policy_key, session_id, principal, created, grant_id, grants.get(grant_id)))
    return uses


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _pages(items: Sequence[Any]) -> Any:
    """A reader of `items` (sorted by invocation id) by pages after an id, as the verification functions read."""

    async def read(after: str, limit: int) -> list[Any]:
        return [item for item in items if item[0] > after][:limit]

    return read


async def _nothing() -> list[str]:
    return []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bastion.ledger.offline", description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path, help="the JSON lines `bastion audit export` wrote")
    parser.add_argument("--public-key", action="append", default=[], help="a trusted key (ed25519:...); repeat")
    parser.add_argument("--anchors", type=Path, help="the anchors file (`bastion audit anchor`)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        trusted = [public_text(parse_public(key)) for key in args.public_key]
        text = args.export.read_text(encoding="utf-8")
        lines = [_parsed(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
        anchors = read_anchors(args.anchors) if args.anchors is not None else []
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = anyio.run(verify_export, lines, anchors, trusted)
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
    elif report.broken is None:
        print(
            f"ok: {report.verified} events, {report.records} invocations, {report.decisions} signed approvals, "
            f"{report.grant_uses} grant uses, {report.anchors} anchors"
            + ("" if trusted else "; no --public-key: signatures not checked")
        )
    else:
        print(f"broken ({report.broken.reason}): {report.broken.message}")
    return 0 if report.broken is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
