"""Observable actions (seed 004, issue 16): `bastion invocations reconcile` settles a call whose outcome was unknown,
and `bastion audit verify|export|prune` checks, exports and trims the ledger's tamper-evident history."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Annotated, Final

import typer

from bastion.cli.app import (
    ConfigOption,
    Exit,
    JsonOption,
    app,
    emit_json,
    load,
    local_approver,
    open_ledger,
    out,
    run_async,
)
from bastion.cli.inspect import invocations_app
from bastion.models import AuditReport, Invocation, PruneReport, utcnow
from bastion.pipeline import authority
from bastion.pipeline.authority import MIN_ID_PREFIX
from bastion.pipeline.views import audit_record_json, invocation_json

audit_app = typer.Typer(
    help="The ledger's tamper-evident history: verify its hash chain, export it, prune it by age.",
    no_args_is_help=True,
)
app.add_typer(audit_app, name="audit")

EXPORT_PAGE: Final = 1000
OUTCOMES: Final = ("completed", "failed")


@invocations_app.command("reconcile")
def invocations_reconcile(
    invocation_id: Annotated[
        str,
        typer.Argument(
            help=f"The unknown (or stuck executing) invocation: its id or its first {MIN_ID_PREFIX}+ characters."
        ),
    ],
    outcome: Annotated[
        str, typer.Option(help="What came of it, as you found it in the downstream: completed or failed.")
    ],
    note: Annotated[str | None, typer.Option(help="How you know (kept in the `reconciled` event).")] = None,
    token: Annotated[
        str | None, typer.Option(help="An owner or admin token (else $BASTION_TOKEN); needed once the ledger has one.")
    ] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Record the outcome of a call Bastion could not know (status unknown), after looking in the downstream for
    its correlation id (io.bastion/correlation-id) or idempotency key. Owners and admins only."""
    if outcome not in OUTCOMES:
        raise Exit(f"error: --outcome must be completed or failed, got {outcome!r}", 2)
    chosen: authority.Outcome = "completed" if outcome == "completed" else "failed"
    config = load(config_dir, report=False)

    async def run() -> Invocation:
        async with open_ledger(config) as ledger:
            approver = await local_approver(ledger, config, token)
            return await authority.reconcile(ledger, invocation_id, outcome=chosen, principal=approver, note=note)

    reconciled = run_async(run)
    if as_json:
        emit_json(invocation_json(reconciled))
        return
    out.print(f"reconciled {reconciled.id} ({reconciled.tool}) as {reconciled.status}", markup=False, highlight=False)


@audit_app.command("verify")
def audit_verify(config_dir: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Check the hash chain of every event from the last prune's checkpoint to the newest; exit 1 at the first
    break, naming it. Keep the head hash printed somewhere else: it anchors the history up to now."""
    config = load(config_dir, report=False)

    async def run() -> AuditReport:
        async with open_ledger(config) as ledger:
            return await ledger.audit.verify()

    report = run_async(run)
    if as_json:
        emit_json(report.model_dump(mode="json"))
    elif report.broken is None:
        start = f"from the checkpoint at event {report.checkpoint.event_id}" if report.checkpoint else "from the start"
        head = f"; head: event {report.head_id} {report.head_hash}" if report.head_id is not None else ""
        out.print(f"ok: {report.verified} events verified {start}{head}", markup=False, highlight=False)
    else:
        out.print(
            f"broken at event {report.broken.event_id} ({report.broken.reason}): {report.broken.message}; "
            f"{report.verified} events before it verified",
            markup=False,
            highlight=False,
        )
    if report.broken is not None:
        raise typer.Exit(1)


@audit_app.command("export")
def audit_export(
    since: Annotated[
        int, typer.Option(help="Only events after this cursor (an event id: the last `id` of an earlier export).")
    ] = 0,
    format_: Annotated[
        str, typer.Option("--format", help="Output format: jsonl (one JSON object per line).")
    ] = "jsonl",
    config_dir: ConfigOption = None,
) -> None:
    """Write every event after the cursor, oldest first, one JSON line each: the event, its chain hashes and its
    invocation, redacted as stored. Resume a later export with --since set to the last line's `id`."""
    if format_ != "jsonl":
        raise Exit(f"error: unknown --format {format_!r}; use jsonl", 2)
    config = load(config_dir, report=False)

    async def run() -> None:
        async with open_ledger(config) as ledger:
            cursor = since
            while page := await ledger.audit.export(cursor, EXPORT_PAGE):
                lines = (json.dumps(audit_record_json(event, inv), ensure_ascii=False) for event, inv in page)
                sys.stdout.write("".join(line + "\n" for line in lines))
                cursor = page[-1][0].id
            sys.stdout.flush()

    run_async(run)


@audit_app.command("prune")
def audit_prune(
    older_than_days: Annotated[
        float,
        typer.Option(
            min=0, help="Remove calls that finished (completed, failed, denied, expired) before this many days ago."
        ),
    ],
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove the oldest finished calls and their events, keeping a checkpoint (the last removed event's hash) so the
    rest still verifies. It stops at the first call still unresolved or too recent: the history stays a prefix cut.
    Export first if you must keep them."""
    config = load(config_dir, report=False)
    now = utcnow()

    async def run() -> PruneReport:
        async with open_ledger(config) as ledger:
            return await ledger.audit.prune(now - timedelta(days=older_than_days), now=now)

    report = run_async(run)
    if as_json:
        emit_json(report.model_dump(mode="json"))
        return
    kept = f"; stopped at invocation {report.kept_by}, which is unresolved or too recent" if report.kept_by else ""
    out.print(f"pruned {report.events} events of {report.invocations} invocations{kept}", markup=False, highlight=False)
