"""Observable actions: `bastion invocations reconcile` settles a call whose outcome was unknown,
by hand or by asking its provider (`--check`), and `bastion audit verify|export|prune` checks, exports and trims the
ledger's tamper-evident history."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from bastion.cli.app import ConfigOption, Exit, JsonOption, TokenOption, command_group, emit_json, out
from bastion.cli.inspect import invocations_app
from bastion.errors import BastionError, ConfigError, ConnectorUnavailable
from bastion.program import bastion_command
from bastion.terms import MIN_ID_PREFIX

if TYPE_CHECKING:
    from bastion.config import Config
    from bastion.models import AuditReport, Invocation, PruneReport
    from bastion.pipeline import authority
    from bastion.pipeline.authority import SourceOf
    from bastion.sources.seam import ActionSource

audit_app = command_group(
    "audit", "The ledger's tamper-evident history: verify its hash chain, export it, prune it by age."
)

EXPORT_PAGE: Final = 1000
OUTCOMES: Final = ("completed", "failed")
START_SECONDS: Final = 10.0
"""How long a provider may take to open its client for a look-up."""


@invocations_app.command("reconcile")
def invocations_reconcile(
    invocation_id: Annotated[
        str,
        typer.Argument(
            help=f"The unknown (or stuck executing) invocation: its id or its first {MIN_ID_PREFIX}+ characters."
        ),
    ],
    outcome: Annotated[
        str | None,
        typer.Option(help="What came of it, as you found it in the downstream: completed or failed. Not with --check."),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Ask the call's provider instead (GitHub, Linear, Slack actions that mark what they make: see "
            "docs/serving.md) and record what it finds. Not with --outcome.",
        ),
    ] = False,
    note: Annotated[str | None, typer.Option(help="How you know (kept in the `reconciled` event).")] = None,
    token: Annotated[
        str | None, typer.Option(help="An owner or admin token (else $BASTION_TOKEN); needed once the ledger has one.")
    ] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Record the outcome of a call Bastion could not know (status unknown): by hand (--outcome), after looking in
    the downstream for its correlation id (io.bastion/correlation-id) or idempotency key, or by check (--check),
    where its provider looks it up. A check that finds nothing certain, or something that is no proof the call made
    it (not made by the provider's credential, elsewhere, at another time, its mark not keyed by this Bastion),
    leaves the call unknown and exits 1.
    Owners and admins only."""
    if check and outcome is not None:
        raise Exit("error: give --outcome (by hand) or --check (ask the provider), not both", 2)
    if not check and outcome is None:
        raise Exit("error: give --outcome completed|failed (what you found), or --check to ask the provider", 2)
    if outcome is not None and outcome not in OUTCOMES:
        raise Exit(f"error: --outcome must be completed or failed, got {outcome!r}", 2)
    from bastion.cli.compose import load, local_approver, open_ledger, run_async
    from bastion.pipeline import authority
    from bastion.pipeline.documents import invocation_json

    config = load(config_dir, report=False)
    if check:
        _reconcile_by_check(config, invocation_id, note=note, token=token, as_json=as_json)
        return
    chosen: authority.Outcome = "completed" if outcome == "completed" else "failed"

    async def run() -> Invocation:
        async with open_ledger(config) as ledger:
            approver = await local_approver(ledger, config, token)
            return await authority.reconcile(ledger, invocation_id, outcome=chosen, principal=approver, note=note)

    reconciled = run_async(run)
    if as_json:
        emit_json(invocation_json(reconciled))
        return
    out.print(f"reconciled {reconciled.id} ({reconciled.tool}) as {reconciled.status}", markup=False, highlight=False)


def _reconcile_by_check(
    config: Config, invocation_id: str, *, note: str | None, token: str | None, as_json: bool
) -> None:
    from bastion.cli.compose import local_approver, open_ledger, run_async
    from bastion.models import utcnow
    from bastion.pipeline import authority
    from bastion.pipeline.documents import check_json

    async def run() -> authority.Checked:
        async with open_ledger(config) as ledger:
            approver = await local_approver(ledger, config, token)
            full_id = await authority.resolve_invocation_id(ledger.invocations, invocation_id, approver)
            invocation = await ledger.invocations.get(full_id)
            source_id = invocation.source_id if invocation else None
            async with _provider(config, source_id, marker_key=ledger.marker_key) as source_of:
                try:
                    return await authority.reconcile_by_check(
                        ledger, full_id, source_of=source_of, principal=approver, now=utcnow(), note=note
                    )
                except BastionError as exc:  # raised past the provider's task group, which would wrap it in a group
                    refused = exc
            raise refused

    checked = run_async(run)
    settled, found = checked.invocation, checked.found
    by_hand = "Look for it yourself and settle it with --outcome completed|failed."
    if as_json:
        emit_json(check_json(settled, found))
    elif found is None:
        out.print(
            f"not found: {settled.source_id} has no trace of {settled.id} ({settled.tool}) it can be sure of; left "
            f"{settled.status}. {by_hand}",
            markup=False,
            highlight=False,
        )
    elif not found.accepted:
        out.print(
            f"not accepted: {settled.source_id} has {found.where} carrying the mark of {settled.id} ({settled.tool}), "
            f"but it is no proof the call made it: {found.reason}. Left {settled.status}, the check recorded (a "
            f"`checked` event: bastion invocations show {settled.id}). {by_hand}",
            markup=False,
            highlight=False,
        )
    else:
        out.print(
            f"reconciled {settled.id} ({settled.tool}) as {settled.status} by check: {found.where}",
            markup=False,
            highlight=False,
        )
    if found is None or not found.accepted:
        raise typer.Exit(1)


@invocations_app.command("rollback")
def invocations_rollback(
    invocation_id: Annotated[
        str,
        typer.Argument(
            help=f"The plugin call whose outcome is unknown: its id or its first {MIN_ID_PREFIX}+ characters."
        ),
    ],
    note: Annotated[str | None, typer.Option(help="Why (kept in the `reconciled` event).")] = None,
    token: Annotated[
        str | None, typer.Option(help="An owner or admin token (else $BASTION_TOKEN); needed once the ledger has one.")
    ] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run the rollback step of a plugin call whose outcome is unknown (Bastion stopped while it ran), in its sandbox
    and with the state the call left. When it succeeds the call is recorded failed (its effect undone), with the
    rollback's report; when it fails the call stays unknown and this exits 1. Bastion never runs it by itself: an
    approver decides. Owners and admins only."""
    from bastion.cli.compose import load, local_approver, open_ledger, run_async
    from bastion.pipeline import authority
    from bastion.pipeline.documents import invocation_json
    from bastion.sources.plugins import ACTION_FILE
    from bastion.sources.registry import load_sources

    config = load(config_dir, report=False)
    sources = load_sources(config)
    plugins = sources.plugins

    async def roll_back(action_id: str, arguments: dict[str, Any], invocation: str) -> Mapping[str, Any]:
        if plugins is None:
            problems = [problem.message for problem in sources.problems if problem.file.name == ACTION_FILE]
            why = "; ".join(problems) or "there are no plugin packages"
            raise ConnectorUnavailable(f"plugin {action_id!r} is not loaded ({why}); nothing ran")
        return await plugins.roll_back(action_id, arguments, correlation_id=invocation)

    async def run() -> Invocation:
        async with open_ledger(config) as ledger:
            approver = await local_approver(ledger, config, token)
            return await authority.reconcile_by_rollback(
                ledger, invocation_id, roll_back=roll_back, principal=approver, note=note
            )

    undone = run_async(run)
    if as_json:
        emit_json(invocation_json(undone))
        return
    out.print(f"rolled back {undone.id} ({undone.tool}); recorded {undone.status}", markup=False, highlight=False)


@asynccontextmanager
async def _provider(config: Config, source_id: str | None, *, marker_key: bytes) -> AsyncIterator[SourceOf]:
    """The configured provider `source_id`, running (its client open) while the block runs, as a `SourceOf`, with
    the ledger's `marker_key` to verify what it finds; no source for anything else (no other kind of source looks
    calls up)."""
    import anyio

    from bastion.sources.registry import provider_of

    provider = config.providers.get(source_id) if source_id is not None else None
    if source_id is None or provider is None:
        yield _none
        return
    source = provider_of(config, source_id, marker_key=marker_key)
    started = anyio.Event()

    async def on_change(_: str) -> None:
        started.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(source.run, on_change)
        with anyio.fail_after(START_SECONDS):
            await started.wait()
        yield lambda wanted: source if wanted == source_id else None
        tg.cancel_scope.cancel()


def _none(source_id: str) -> ActionSource | None:
    return None


@audit_app.command("verify")
def audit_verify(
    anchors: Annotated[
        Path | None,
        typer.Option(
            "--anchors",
            help="Check the chain against the signed anchors in this file (default: [ledger] anchor_file, if it "
            "exists; see `bastion audit anchor`).",
        ),
    ] = None,
    public_key: Annotated[
        list[str] | None,
        typer.Option(
            "--public-key",
            metavar="KEY",
            help="Trust this public key (ed25519:..., as `bastion audit key` prints it) for anchors and the prune "
            "checkpoint; repeat for several. The ledger's own signing key, when it is on this machine, is trusted.",
        ),
    ] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Check the hash chain of every event from the last prune's checkpoint to the head the ledger keeps, every
    invocation against the state its newest event carries, every call a grant let through against that grant, and,
    with trusted keys, the signed anchors, the checkpoint's signature and the signature of every approval of a held
    call; exit 1 at the first break, naming it. Without anchors a rewrite of the whole store, every hash recomputed,
    goes unseen: anchor the head outside the ledger (`bastion audit anchor`)."""
    from bastion.cli.compose import load, open_ledger, run_async
    from bastion.ledger.anchors import read_anchors, trusted_keys
    from bastion.ledger.verify import verify_signed

    config = load(config_dir, report=False)
    anchors_file = anchors if anchors is not None else config.anchor_file
    if anchors is not None and not anchors.exists():
        raise Exit(
            f"error: {anchors}: no such anchors file; give the file `{bastion_command()} audit anchor` appends to", 2
        )

    async def run() -> AuditReport:
        async with open_ledger(config) as ledger:
            trusted = trusted_keys(ledger.key_path, public_key or [])
            signed = read_anchors(anchors_file) if anchors_file is not None and anchors_file.exists() else []
            if signed and not trusted:
                raise ConfigError(
                    f"{anchors_file}: anchors need the public key that signed them: give --public-key (as "
                    f"`{bastion_command()} audit key` prints it where the ledger is kept)"
                )
            return await verify_signed(ledger.audit, signed, trusted)

    report = run_async(run)
    if as_json:
        emit_json(report.model_dump(mode="json"))
    elif report.broken is None:
        out.print(verified_line(report), markup=False, highlight=False)
    else:
        out.print(
            f"broken at event {report.broken.event_id} ({report.broken.reason}): {report.broken.message}; "
            f"{report.verified} events before it verified",
            markup=False,
            highlight=False,
        )
    if report.broken is not None:
        raise typer.Exit(1)


def verified_line(report: AuditReport) -> str:
    """What `audit verify` says of a chain that holds: what it checked, and what it could not."""
    start = f"from the checkpoint at position {report.checkpoint.position}" if report.checkpoint else "from the start"
    parts = [f"ok: {report.verified} events verified {start}"]
    if report.pre_chain:
        parts.append(f"{report.pre_chain} of them from before records were chained (their rows are not covered)")
    parts.append(f"{report.records} invocations match their events")
    if report.records_not_covered:
        parts.append(f"{report.records_not_covered} not covered")
    if report.trusted_keys:
        parts.append(f"{report.decisions} approvals of held calls signed")
    if report.decisions_unsigned:
        parts.append(f"{report.decisions_unsigned} approvals from before decisions were signed (not checked)")
    parts.append(f"{report.grant_uses} calls inside the grants that let them through")
    if report.anchors:
        parts.append(f"{report.anchors} signed anchors held")
    elif not report.trusted_keys:
        parts.append(f"no signing key to check anchors or the checkpoint with (see `{bastion_command()} audit key`)")
    if report.head_position is not None:
        parts.append(f"head: position {report.head_position} {report.head_hash}")
    return "; ".join(parts)


@audit_app.command("export")
def audit_export(
    since: Annotated[
        int,
        typer.Option(
            help="Only events after this cursor (a chain position: the last `position` of an earlier export)."
        ),
    ] = 0,
    format_: Annotated[
        str, typer.Option("--format", help="Output format: jsonl (one JSON object per line).")
    ] = "jsonl",
    config_dir: ConfigOption = None,
) -> None:
    """Write every event after the cursor, oldest first, one JSON line each: the event, its chain hashes and its
    invocation, redacted as stored. Resume a later export with --since set to the last line's `position`."""
    if format_ != "jsonl":
        raise Exit(f"error: unknown --format {format_!r}; use jsonl", 2)
    from bastion.cli.compose import load, open_ledger, run_async
    from bastion.ledger.offline import export_line

    config = load(config_dir, report=False)

    async def run() -> None:
        async with open_ledger(config) as ledger:
            cursor = since
            while page := await ledger.audit.export(cursor, EXPORT_PAGE):
                lines = (json.dumps(export_line(exported), ensure_ascii=False) for exported in page)
                sys.stdout.write("".join(line + "\n" for line in lines))
                cursor = page[-1].event.position
            sys.stdout.flush()

    run_async(run)


@audit_app.command("scrub")
def audit_scrub(
    secret_env: Annotated[
        str | None,
        typer.Option(
            "--secret-env",
            metavar="NAME",
            help="Read the leaked secret from this environment variable (never from the command line, which shell "
            "history and process lists keep).",
            show_default=False,
        ),
    ] = None,
    secret_stdin: Annotated[
        bool, typer.Option("--secret-stdin", help="Read the leaked secret from standard input (one line).")
    ] = False,
    token: TokenOption = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Replace a leaked secret everywhere the ledger stores it (calls' arguments, results and errors, events' details,
    webhook messages waiting) with [scrubbed], in one transaction. Each call touched gets a `scrubbed` event
    signed with the ledger's signing key, naming the events it changed, so `bastion audit verify` still holds. Owner
    and admin only. Rotate the secret too: a scrub removes what was stored, not what was seen."""
    import anyio

    from bastion.cli.compose import load, local_approver, open_ledger, run_async
    from bastion.ledger import scrubbing
    from bastion.ledger.anchors import load_or_create_signing_key, signing_key_path_for
    from bastion.models import ScrubReport

    if (secret_env is None) == (not secret_stdin):
        raise Exit("error: give the secret with exactly one of --secret-env NAME or --secret-stdin", 2)
    secret = sys.stdin.readline().rstrip("\n") if secret_stdin else os.environ.get(secret_env or "", "")
    if not secret:
        where = "standard input" if secret_stdin else f"${secret_env}"
        raise Exit(f"error: {where} holds no secret to scrub", 2)
    try:
        forms = scrubbing.forms(secret)
    except ValueError as exc:
        raise Exit(f"error: {exc}", 2) from exc
    config = load(config_dir)

    async def run() -> ScrubReport:
        async with open_ledger(config) as ledger:
            principal = await local_approver(ledger, config, token)
            if not principal.may_decide:
                raise Exit(f"error: {principal.name} has the {principal.role} role; only owner and admin may scrub", 1)
            key = await anyio.to_thread.run_sync(load_or_create_signing_key, signing_key_path_for(ledger.key_path))
            return await ledger.audit.scrub(scrubbing.Scrub(forms, principal.name, key))

    report = run_async(run)
    if as_json:
        emit_json(report.model_dump(mode="json"))
        return
    out.print(
        f"scrubbed {report.invocations} invocations, {report.events} event details and {report.outbox} webhook "
        "messages; `bastion audit verify` accepts the change by its signature",
        markup=False,
        highlight=False,
    )


@audit_app.command("prune")
def audit_prune(
    older_than_days: Annotated[
        float | None,
        typer.Option(
            min=0,
            metavar="DAYS",
            help="Remove calls that finished (completed, failed, denied, expired) before this many days ago. "
            "Default: [ledger] retention_days of bastion.toml.",
            show_default=False,
        ),
    ] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove the oldest finished calls and their events, keeping a checkpoint (the last removed event's hash) so the
    rest still verifies. It stops at the first call still unresolved or too recent: the history stays a prefix cut.
    Export first if you must keep them."""
    import anyio

    from bastion.cli.compose import load, open_ledger, run_async
    from bastion.ledger.anchors import load_or_create_signing_key, sign, signing_key_path_for
    from bastion.models import utcnow

    # Without an age the configuration decides: its problems are shown (a retention_days it skipped among them).
    config = load(config_dir, report=older_than_days is None)
    if older_than_days is None:
        older_than_days = config.settings.ledger.retention_days
    if older_than_days is None:
        raise Exit(
            "error: no age to prune by: pass --older-than-days N, or set retention_days = N under [ledger] in "
            "bastion.toml",
            2,
        )
    days = older_than_days
    now = utcnow()

    async def run() -> PruneReport:
        async with open_ledger(config) as ledger:
            key = await anyio.to_thread.run_sync(load_or_create_signing_key, signing_key_path_for(ledger.key_path))
            signer = functools.partial(sign, key, "checkpoint")
            return await ledger.audit.prune(now - timedelta(days=days), now=now, sign=signer)

    report = run_async(run)
    if as_json:
        emit_json(report.model_dump(mode="json"))
        return
    kept = f"; stopped at invocation {report.kept_by}, which is unresolved or too recent" if report.kept_by else ""
    out.print(f"pruned {report.events} events of {report.invocations} invocations{kept}", markup=False, highlight=False)
