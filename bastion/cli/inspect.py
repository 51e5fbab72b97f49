"""Looking at a configuration and its ledger: `catalog`, `connectors`, `invocations`, `init`, `version`."""

from __future__ import annotations

import json
import shlex
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from bastion import __version__
from bastion.cli.app import ConfigOption, Exit, JsonOption, app, command_group, emit_json, out, timestamp
from bastion.cli.tables import Column, fitted_table
from bastion.errors import ConfigError, ConnectorUnavailable, NotFound
from bastion.program import bastion_command
from bastion.terms import MIN_ID_PREFIX, STATUSES, Status

if TYPE_CHECKING:
    from rich.table import Table

    from bastion.models import Invocation

connectors_app = command_group(
    "connectors", "Sources: downstream MCP servers and providers ([providers.<id>]): status and checks."
)
invocations_app = command_group("invocations", "The ledger: what was called, by whom, and what came of it.")


# -- catalog and connectors -------------------------------------------------------------------------

CATALOG_COLUMNS: Final = (
    Column("tool"),
    Column("source", "word"),
    Column("risk", "word"),
    Column("mode", "word"),
    Column("mode source", optional=True),
    Column("drift", "word", optional=True),
    Column("hidden", "word", optional=True),
)
CONNECTOR_COLUMNS: Final = (
    Column("connector", "id"),
    Column("state", "word"),
    Column("tools", "word"),
    Column("protocol", "word", optional=True),
    Column("last error"),
)
INVOCATION_COLUMNS: Final = (
    Column("id", "id"),
    Column("created", "time", optional=True),
    Column("tool"),
    Column("status", "word"),
    Column("mode", "word", optional=True),
    Column("mode source", optional=True),
    Column("error"),
)


@app.command()
def catalog(config_dir: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Show the merged catalog: tool, source, risk, mode, why, and drift (connects to every source once)."""
    from bastion.cli.compose import load, open_gateway, run_async
    from bastion.models import CallContext

    config = load(config_dir)

    async def run() -> list[dict[str, Any]]:
        async with open_gateway(config, progress=not as_json) as gateway:
            rows = []
            for entry in gateway.catalog.entries.values():
                decision = gateway.mode_of(entry, CallContext(session_id="cli"))
                rows.append(
                    {
                        "tool": entry.name,
                        "source_id": entry.source_id,
                        "action_id": entry.action_id,
                        "policy_key": entry.key,
                        "risk": entry.action.risk,
                        "mode": decision.mode,
                        "mode_source": decision.source,
                        "hidden": entry.action.hidden,
                        "drift": gateway.pins.drift(entry.source_id, entry.action_id) is not None,
                    }
                )
            return rows

    rows = run_async(run)
    if as_json:
        emit_json(rows)
        return
    cells = [
        (
            r["tool"],
            r["source_id"],
            r["risk"],
            r["mode"],
            r["mode_source"],
            "drifted" if r["drift"] else "",
            "yes" if r["hidden"] else "",
        )
        for r in rows
    ]
    out.print(fitted_table(CATALOG_COLUMNS, cells, width=out.width, title=f"{len(rows)} tools"))


@connectors_app.command("list")
def connectors_list(config_dir: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Start every connector and provider once and show its state, tool count, protocol version and last error
    (a provider without its credential is `unavailable`: binding_required)."""
    _show_connectors(config_dir, None, as_json)


@connectors_app.command("check")
def connectors_check(
    source_id: Annotated[str | None, typer.Argument(help="The one connector to check, by id (default: all).")] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start the connectors and providers (all, or SOURCE_ID), show their status as `list` does; exit 1 if one is
    not ready."""
    statuses = _show_connectors(config_dir, source_id, as_json)
    if any(s["state"] != "ready" for s in statuses):
        if as_json:
            raise typer.Exit(1)  # the statuses printed are the whole answer; a second document would break it
        raise Exit.of(ConnectorUnavailable("a source is not ready; see its last error above"))


def _show_connectors(config_dir: Path | None, only: str | None, as_json: bool) -> list[dict[str, Any]]:
    from bastion.cli.compose import load, open_gateway, run_async

    config = load(config_dir)
    if only is not None:
        sources = {c.id for c in config.connectors} | set(config.providers)
        if only not in sources:
            known = ", ".join(sorted(sources)) or "none"
            raise Exit.of(NotFound(f"no connector or provider {only!r} (known: {known})"))
        config = config.model_copy(
            update={
                "connectors": [c for c in config.connectors if c.id == only],
                "providers": {pid: p for pid, p in config.providers.items() if pid == only},
            }
        )

    async def run() -> list[dict[str, Any]]:
        async with open_gateway(config, progress=not as_json) as gateway:
            return [s.model_dump(mode="json") for s in gateway.statuses()]

    statuses = run_async(run)
    if as_json:
        emit_json(statuses)
        return statuses
    rows = [
        (s["source_id"], s["state"], str(s["tools"]), s["protocol_version"] or "", s["last_error"] or "")
        for s in statuses
    ]
    out.print(fitted_table(CONNECTOR_COLUMNS, rows, width=out.width))
    for s in statuses:
        if s["last_error"]:  # whole here: the table may have cut it
            out.print(f"{s['source_id']}: {s['last_error']}", markup=False, highlight=False)
    return statuses


# -- invocations ------------------------------------------------------------------------------------


@invocations_app.command("list")
def invocations_list(
    config_dir: ConfigOption = None,
    status: Annotated[str | None, typer.Option(help=f"Only this status: {', '.join(STATUSES)}.")] = None,
    source: Annotated[str | None, typer.Option(help="Only this source id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    unresolved: Annotated[
        bool,
        typer.Option(
            "--unresolved",
            help="Only calls whose outcome is not known, oldest first: unknown ones, and executing ones not updated "
            "for --stale-seconds (settle them with `bastion invocations reconcile`).",
        ),
    ] = False,
    stale_seconds: Annotated[
        float,
        typer.Option(
            min=0, metavar="SECONDS", help="With --unresolved: an executing call not updated for this long is stale."
        ),
    ] = 300.0,
    as_json: JsonOption = False,
) -> None:
    """List invocations from the ledger, newest first."""
    if status is not None and status not in STATUSES:
        raise Exit(f"error: unknown status {status!r}; use one of {', '.join(STATUSES)}", 2)
    if unresolved and (status is not None or source is not None):
        raise Exit("error: --unresolved lists unknown and stale executing calls; leave out --status and --source", 2)
    from bastion.cli.compose import load, open_ledger, run_async
    from bastion.models import utcnow
    from bastion.pipeline import authority
    from bastion.pipeline.documents import invocation_json

    config = load(config_dir, report=False)

    async def run() -> list[Invocation]:
        async with open_ledger(config) as ledger:
            if unresolved:
                stale = timedelta(seconds=stale_seconds)
                return await authority.unresolved(ledger, stale_after=stale, now=utcnow(), limit=limit)
            return await ledger.invocations.list(status=_status(status), source_id=source, limit=limit)

    found = run_async(run)
    if as_json:
        emit_json([invocation_json(i) for i in found])
        return
    rows = [
        (i.id, timestamp(i.created_at), i.tool, i.status, i.mode, i.mode_source, i.error_class or "") for i in found
    ]
    out.print(fitted_table(INVOCATION_COLUMNS, rows, width=out.width, title=f"{len(found)} invocations"))


def _status(value: str | None) -> Status | None:
    for status in STATUSES:
        if status == value:
            return status
    return None


@invocations_app.command("show")
def invocations_show(
    invocation_id: Annotated[
        str,
        typer.Argument(
            help=f"The invocation: its id, or the first {MIN_ID_PREFIX}+ characters of it (see `bastion invocations "
            "list`)."
        ),
    ],
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one invocation with its redacted args, result and event history (and a manifest action's steps)."""
    from bastion.cli.compose import find_invocation, load, open_ledger, run_async
    from bastion.pipeline.documents import invocation_detail_json

    config = load(config_dir, report=False)

    async def run() -> dict[str, Any]:
        async with open_ledger(config) as ledger:
            invocation = await find_invocation(ledger, config, invocation_id)
            detail = invocation_detail_json(invocation, await ledger.invocations.events(invocation.id))
            steps = await ledger.invocations.list(parent_id=invocation.id, limit=1000)
            if steps:
                detail["steps"] = [
                    {"id": s.id, "policy_key": s.policy_key, "status": s.status, "error_class": s.error_class}
                    for s in reversed(steps)
                ]
            return detail

    data = run_async(run)
    if as_json:
        emit_json(data)
        return
    out.print(details_table(data))


def details_table(data: dict[str, Any]) -> Table:
    """An invocation (with its `events`) as a two-column table for people."""
    from rich.table import Table

    table = Table(show_header=False, box=None)
    for key, value in data.items():
        if key == "risk_source":
            continue  # shown with the risk
        if key == "risk" and data.get("risk_source"):
            value = f"{value} (from {data['risk_source']})"
        elif key in ("args", "result"):
            value = json.dumps(value, indent=2, ensure_ascii=False)
        elif key == "events":
            value = "\n".join(
                f"{e['seq']}. {e['at']} {e['kind']} {json.dumps(e['detail']) if e['detail'] else ''}" for e in value
            )
        elif key == "drift" and value is not None:
            value = "\n".join(value)
        elif key == "steps":
            value = "\n".join(f"{s['id']} {s['policy_key']} {s['status']} {s['error_class'] or ''}" for s in value)
        table.add_row(f"[bold]{key}[/bold]", "" if value is None else str(value))
    return table


# -- init and version -----------------------------------------------------------------------


@app.command()
def init(directory: Annotated[Path, typer.Argument(help="Where to write a starter configuration.")]) -> None:
    """Write a starter configuration directory (refuses to overwrite anything)."""
    from bastion.config import init_config_dir

    try:
        written = init_config_dir(directory)
    except ConfigError as exc:
        raise Exit.of(exc) from exc
    for path in written:
        out.print(f"wrote {path}", markup=False, highlight=False)
    where = shlex.quote(str(directory.resolve()))
    bastion = bastion_command()
    out.print(
        f"next: {bastion} doctor --config {where}  then  {bastion} serve --config {where}",
        markup=False,
        highlight=False,
    )


@app.command()
def version() -> None:
    """Print the version."""
    out.print(__version__)
