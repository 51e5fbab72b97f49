"""`bastion`: the command line and the composition root (config -> ledger -> sources -> gateway -> server).

Exit statuses: 0 success, 1 a refused operation (not found, conflict), 2 a usage or config error.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
import typer
from rich.console import Console
from rich.table import Table

from bastion import __version__
from bastion.config import Config, find_config_dir, init_config_dir, load_config, sqlite_path, validate_profile
from bastion.connectors import McpConnector
from bastion.errors import BastionError, ConfigError, NotFound
from bastion.gateway import Gateway
from bastion.ledger import Redactor, SqliteLedger
from bastion.models import STATUSES, CallContext, Invocation, Status
from bastion.server.http import is_loopback, serve_http
from bastion.server.mcp import FrontDoor, serve_stdio

app = typer.Typer(
    help="Bastion: one policy-gated, audited MCP gateway for your agents' side effects.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
connectors_app = typer.Typer(help="Downstream MCP servers: status and checks.", no_args_is_help=True)
invocations_app = typer.Typer(help="The ledger: what was called, by whom, and what came of it.", no_args_is_help=True)
app.add_typer(connectors_app, name="connectors")
app.add_typer(invocations_app, name="invocations")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
logger = logging.getLogger("bastion")

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="Configuration directory (else $BASTION_CONFIG, ./bastion.toml, ~/.config/bastion)."
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON instead of a table.")]
T = TypeVar("T")


class Exit(Exception):
    """A clean stop with a message and an exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def main() -> None:
    """Console entry point."""
    logging.basicConfig(
        level=os.environ.get("BASTION_LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        app()
    except Exit as exc:
        err.print(str(exc), markup=False, highlight=False)
        raise SystemExit(exc.code) from None


def _run(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    try:
        return anyio.run(fn, *args)
    except ConfigError as exc:
        raise Exit(f"error: {exc.message}", 2) from exc
    except NotFound as exc:
        raise Exit(f"error: {exc.message}", 1) from exc
    except BastionError as exc:
        raise Exit(f"error: {exc.error_class}: {exc.message}", 1) from exc


def _emit_json(data: Any) -> None:
    """JSON for scripts: plain stdout, never wrapped or coloured."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# -- composition ------------------------------------------------------------------------------------


def _load(config_dir: Path | None, *, report: bool = True) -> Config:
    directory = find_config_dir(config_dir, env=os.environ, cwd=Path.cwd(), home=Path.home())
    config = load_config(directory)
    if report:
        for issue in config.issues:
            err.print(f"warning: {issue} (this part of the configuration is skipped)", markup=False, highlight=False)
    return config


@asynccontextmanager
async def _ledger(config: Config) -> AsyncIterator[SqliteLedger]:
    settings = config.settings.ledger
    redactor = Redactor(extra_secret_keys=settings.extra_secret_keys, max_bytes=settings.max_result_bytes)
    ledger = await SqliteLedger.open(sqlite_path(config.ledger_url), redactor=redactor)
    try:
        yield ledger
    finally:
        await ledger.close()


@asynccontextmanager
async def _gateway(config: Config) -> AsyncIterator[Gateway]:
    disabled = set(config.policy.sources.disabled)
    list_timeout = config.settings.limits.list_timeout_seconds
    sources = [McpConnector(c, list_timeout=list_timeout) for c in config.connectors if c.id not in disabled]
    async with _ledger(config) as ledger:
        gateway = Gateway(config, ledger, sources)
        async with gateway.running():
            yield gateway


# -- serve ------------------------------------------------------------------------------------------


@app.command()
def serve(
    config_dir: ConfigOption = None,
    transport: Annotated[
        Literal["stdio", "http"], typer.Option(help="stdio for one local host; http serves /mcp, /sse and /healthz.")
    ] = "stdio",
    host: Annotated[str, typer.Option(help="Address to bind (http).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (http).")] = 8765,
    profile: Annotated[str | None, typer.Option(help="Policy profile bound to every session.")] = None,
) -> None:
    """Serve the gateway to agent hosts over stdio (default) or HTTP."""
    config = _load(config_dir)
    if profile is not None:
        try:
            validate_profile(config, profile)
        except ConfigError as exc:
            raise Exit(f"error: {exc.message}", 2) from exc
    if transport == "http" and not is_loopback(host):
        raise Exit(
            f"error: refusing to serve on {host} without approver tokens; Bastion binds to loopback only "
            "until token authentication is configured. Use --host 127.0.0.1.",
            2,
        )

    async def run() -> None:
        async with _gateway(config) as gateway:
            if transport == "stdio":
                await serve_stdio(FrontDoor(gateway, profile=profile, session_id="stdio"))
            else:

                def ready(base_url: str) -> None:
                    _print_connect_help(config, base_url, len(gateway.catalog.tools))

                await serve_http(FrontDoor(gateway, profile=profile), host=host, port=port, on_ready=ready)

    _run(run)


def _print_connect_help(config: Config, base_url: str, tools: int) -> None:
    url = f"{base_url}/mcp"
    where = str(config.directory) if config.directory else "the embedded default (demo notes connector)"
    err.print(f"Bastion {__version__} serving {tools} tools from {where}", markup=False, highlight=False)
    err.print(f"  listening on {base_url}", markup=False, highlight=False)
    err.print(
        f"  MCP (streamable HTTP): {url}   legacy SSE: {base_url}/sse   health: {base_url}/healthz", highlight=False
    )
    err.print(f"  ledger: {config.ledger_url}", markup=False, highlight=False)
    err.print("Connect Claude Code:", highlight=False)
    err.print(f"  claude mcp add --transport http bastion {url}", markup=False, highlight=False)
    err.print("Connect Codex (add to ~/.codex/config.toml):", highlight=False)
    err.print(f'  [mcp_servers.bastion]\n  url = "{url}"', markup=False, highlight=False)
    err.print("Press Ctrl-C to stop.", highlight=False)


# -- catalog and connectors -------------------------------------------------------------------------


@app.command()
def catalog(config_dir: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Show the merged catalog: tool, source, risk, mode and why (connects to every source once)."""
    config = _load(config_dir)

    async def run() -> list[dict[str, Any]]:
        async with _gateway(config) as gateway:
            rows = []
            for entry in gateway.catalog.entries.values():
                decision = gateway.decide(entry, CallContext(session_id="cli"))
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
                    }
                )
            return rows

    rows = _run(run)
    if as_json:
        _emit_json(rows)
        return
    table = Table("tool", "source", "risk", "mode", "mode source", "hidden", title=f"{len(rows)} tools")
    for r in rows:
        table.add_row(r["tool"], r["source_id"], r["risk"], r["mode"], r["mode_source"], "yes" if r["hidden"] else "")
    out.print(table)


@connectors_app.command("list")
def connectors_list(config_dir: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Connect to every connector once and show its status, tool count and last error."""
    _show_connectors(config_dir, None, as_json)


@connectors_app.command("check")
def connectors_check(
    source_id: Annotated[str | None, typer.Argument(help="Connector id (default: all).")] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Connect and list; exit 1 when a checked connector is not ready."""
    statuses = _show_connectors(config_dir, source_id, as_json)
    if any(s["state"] != "ready" for s in statuses):
        raise Exit("error: a connector is not ready; see last_error above", 1)


def _show_connectors(config_dir: Path | None, only: str | None, as_json: bool) -> list[dict[str, Any]]:
    config = _load(config_dir)
    if only is not None:
        if only not in {c.id for c in config.connectors}:
            known = ", ".join(sorted(c.id for c in config.connectors)) or "none"
            raise Exit(f"error: no connector {only!r} (known: {known})", 1)
        config = config.model_copy(update={"connectors": [c for c in config.connectors if c.id == only]})

    async def run() -> list[dict[str, Any]]:
        async with _gateway(config) as gateway:
            return [s.model_dump(mode="json") for s in gateway.statuses()]

    statuses = _run(run)
    if as_json:
        _emit_json(statuses)
        return statuses
    table = Table("connector", "state", "tools", "protocol", "last error")
    for s in statuses:
        table.add_row(s["source_id"], s["state"], str(s["tools"]), s["protocol_version"] or "", s["last_error"] or "")
    out.print(table)
    return statuses


# -- invocations ------------------------------------------------------------------------------------


@invocations_app.command("list")
def invocations_list(
    config_dir: ConfigOption = None,
    status: Annotated[str | None, typer.Option(help=f"Only this status: {', '.join(STATUSES)}.")] = None,
    source: Annotated[str | None, typer.Option(help="Only this source id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """List invocations from the ledger, newest first."""
    if status is not None and status not in STATUSES:
        raise Exit(f"error: unknown status {status!r}; use one of {', '.join(STATUSES)}", 2)
    config = _load(config_dir, report=False)

    async def run() -> list[Invocation]:
        async with _ledger(config) as ledger:
            return await ledger.list(status=_status(status), source_id=source, limit=limit)

    found = _run(run)
    if as_json:
        _emit_json([invocation_json(i) for i in found])
        return
    table = Table("id", "created", "tool", "status", "mode", "mode source", "error", title=f"{len(found)} invocations")
    for i in found:
        table.add_row(
            i.id,
            i.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            i.tool,
            i.status,
            i.mode,
            i.mode_source,
            i.error_class or "",
        )
    out.print(table)


def _status(value: str | None) -> Status | None:
    for status in STATUSES:
        if status == value:
            return status
    return None


@invocations_app.command("show")
def invocations_show(
    invocation_id: Annotated[str, typer.Argument(help="The invocation id.")],
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one invocation with its redacted args, result and event history."""
    config = _load(config_dir, report=False)

    async def run() -> dict[str, Any]:
        async with _ledger(config) as ledger:
            invocation = await ledger.get(invocation_id)
            if invocation is None:
                raise NotFound(f"no invocation {invocation_id!r} in {config.ledger_url}")
            data = invocation_json(invocation)
            data["events"] = [e.model_dump(mode="json") for e in await ledger.events(invocation_id)]
            return data

    data = _run(run)
    if as_json:
        _emit_json(data)
        return
    table = Table(show_header=False, box=None)
    for key, value in data.items():
        if key in ("args", "result"):
            value = json.dumps(value, indent=2, ensure_ascii=False)
        elif key == "events":
            value = "\n".join(
                f"{e['seq']}. {e['at']} {e['kind']} {json.dumps(e['detail']) if e['detail'] else ''}" for e in value
            )
        table.add_row(f"[bold]{key}[/bold]", "" if value is None else str(value))
    out.print(table)


def invocation_json(invocation: Invocation) -> dict[str, Any]:
    """The JSON shape of an invocation for scripts (DESIGN.md §9)."""
    return invocation.model_dump(mode="json")


# -- doctor and init --------------------------------------------------------------------------------


@app.command()
def doctor(config_dir: ConfigOption = None) -> None:
    """Validate the configuration: every problem with file:line, exit 2 if there is any."""
    try:
        directory = find_config_dir(config_dir, env=os.environ, cwd=Path.cwd(), home=Path.home())
    except ConfigError as exc:
        raise Exit(f"error: {exc.message}", 2) from exc
    config = load_config(directory)
    where = str(directory) if directory else "embedded default configuration"
    for issue in config.issues:
        out.print(f"error: {issue}", markup=False, highlight=False)
    if config.issues:
        raise Exit(f"{len(config.issues)} problem(s) in {where}", 2)
    out.print(
        f"ok: {where}: {len(config.connectors)} connector(s), "
        f"{len(config.policy.modes)} org mode(s), {len(config.policy.profiles)} profile(s); ledger {config.ledger_url}",
        markup=False,
        highlight=False,
    )


@app.command()
def init(directory: Annotated[Path, typer.Argument(help="Where to write a starter configuration.")]) -> None:
    """Write a starter configuration directory (refuses to overwrite anything)."""
    try:
        written = init_config_dir(directory)
    except ConfigError as exc:
        raise Exit(f"error: {exc.message}", 2) from exc
    for path in written:
        out.print(f"wrote {path}", markup=False, highlight=False)
    out.print(f"next: bastion doctor --config {directory}  then  bastion serve --config {directory}", highlight=False)


@app.command()
def version() -> None:
    """Print the version."""
    out.print(__version__)
