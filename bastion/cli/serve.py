"""`bastion serve`: its arguments, the port bound before anything starts, and what it prints; the serving itself,
and its graceful stop on SIGTERM and SIGINT (exit status 0), are `bastion.assembly.serve`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal
from urllib.parse import urlsplit

import typer

from bastion import __version__
from bastion.cli.app import ConfigOption, Exit, app, err
from bastion.errors import ConfigError
from bastion.program import bastion_command

if TYPE_CHECKING:
    import socket

    from bastion.config import Config
    from bastion.pipeline.gateway import Gateway


@app.command()
def serve(
    config_dir: ConfigOption = None,
    transport: Annotated[
        Literal["stdio", "http"], typer.Option(help="stdio for one local host; http serves /mcp, /sse and /healthz.")
    ] = "stdio",
    host: Annotated[str, typer.Option(help="Address to bind (http).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (http); 0 picks a free one.")] = 8765,
    profile: Annotated[str | None, typer.Option(help="Policy profile bound to every session.")] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            help="A name hosts reach Bastion by over HTTP (besides [server] allowed_hosts); repeatable. "
            "Other names are refused (421) against DNS rebinding; beyond loopback any IP address is served.",
        ),
    ] = None,
) -> None:
    """Serve the gateway to agent hosts over stdio (default) or HTTP.

    It serves at once, while the connectors start: for [server] startup_wait_seconds (default 5) a
    host's listings wait for connectors still starting; one that comes up later is announced to the
    hosts with tools/list_changed.

    SIGTERM or Ctrl-C stops it gracefully: new calls are refused, running ones get
    [server] shutdown_grace_seconds (default 10) to finish, then every connector is stopped. A second
    signal stops at once.

    With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, a span of every call and
    downstream call is sent there over OTLP/HTTP (OTEL_SDK_DISABLED=true turns it off).
    """
    from bastion import assembly
    from bastion.cli.compose import load, redactor_in_logs, run_async
    from bastion.config import validate_profile
    from bastion.server.tracing import exporting_traces

    config = load(config_dir)
    if profile is not None:
        try:
            validate_profile(config, profile)
        except ConfigError as exc:
            raise Exit(f"error: {exc.message}", 2) from exc
    allowed_hosts = [*config.settings.server.allowed_hosts, *_host_names(allowed_host or [])]
    # Bound before the ledger is recovered or any connector starts: a port problem stops nothing half-started.
    listener = _listen(host, port) if transport == "http" else None

    def ready(gateway: Gateway, base_url: str, tokens: bool) -> None:
        _print_connect_help(config, base_url, gateway, tokens=tokens, allowed_hosts=allowed_hosts)

    async def run() -> None:
        try:
            await assembly.serve(
                config,
                transport=transport,
                host=host,
                port=port,
                profile=profile,
                allowed_hosts=allowed_hosts,
                listener=listener,
                inbox_url=_inbox_url(host, listener),
                redactor=redactor_in_logs(config),
                on_ready=ready,
            )
        except BaseExceptionGroup as group:
            raise _sole(group) from None

    try:
        with exporting_traces():
            run_async(run, serving=True)
    finally:
        if listener is not None:
            listener.close()


def _inbox_url(host: str, listener: socket.socket | None) -> str | None:
    """Where the inbox is served, for the links of webhook messages (None over stdio)."""
    if listener is None:
        return None
    import socket

    shown = f"[{host}]" if listener.family == socket.AF_INET6 else host
    return f"http://{shown}:{listener.getsockname()[1]}/inbox"


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error a task group wrapped (the signal watcher never fails), so `run_async` sees it as raised."""
    if len(group.exceptions) == 1 and not isinstance(group.exceptions[0], BaseExceptionGroup):
        return group.exceptions[0]
    return group


def _host_names(given: list[str]) -> list[str]:
    from bastion.config import host_name

    try:
        return [host_name(name) for name in given]
    except ValueError as exc:
        raise Exit(f"error: --allowed-host {exc}", 2) from exc


def _listen(host: str, port: int) -> socket.socket:
    from bastion.server.http import bind_listener, listener_problem

    try:
        return bind_listener(host, port)
    except (OSError, OverflowError) as exc:
        raise Exit(f"error: {listener_problem(host, port, exc)}", 2) from exc


def _print_connect_help(
    config: Config, base_url: str, gateway: Gateway, *, tokens: bool, allowed_hosts: list[str]
) -> None:
    """The banner: what is served so far and how to connect. It prints as soon as the port listens, often before
    the connectors have listed: those still starting are named, and a line follows once they have."""
    from bastion.config import config_hint, is_loopback

    url = f"{base_url}/mcp"
    where = str(config.directory) if config.directory else "the embedded default (demo notes connector)"
    tools = len(gateway.tools)
    err.print(f"Bastion {__version__} serving {tools} tools from {where}", markup=False, highlight=False)
    starting = [s.source_id for s in gateway.statuses() if s.state == "starting"]
    if starting:
        err.print(
            f"  still starting: {', '.join(starting)} (hosts are told with tools/list_changed as their tools come)",
            markup=False,
            highlight=False,
        )
        _report_when_started(gateway)
    err.print(f"  listening on {base_url}", markup=False, highlight=False)
    if not is_loopback(urlsplit(base_url).hostname or ""):
        names = ", ".join(allowed_hosts) or "none"
        err.print(
            f"  hosts may reach it by any IP address; by name only as [server] allowed_hosts lists ({names})",
            markup=False,
            highlight=False,
        )
    err.print(
        f"  MCP (streamable HTTP): {url}   legacy SSE: {base_url}/sse   health: {base_url}/healthz", highlight=False
    )
    err.print(
        f"  approvers: inbox {base_url}/inbox   events {base_url}/api/events   MCP {base_url}/approver/mcp",
        highlight=False,
    )
    err.print(f"  ledger: {config.ledger_display}", markup=False, highlight=False)
    header = ' --header "Authorization: Bearer $BASTION_AGENT_TOKEN"' if tokens else ""
    if tokens:
        err.print(
            "  tokens are configured: hosts need an agent token "
            f"({bastion_command()} tokens create NAME --role agent{config_hint(config)})",
            markup=False,
            highlight=False,
        )
    err.print("Connect Claude Code:", highlight=False)
    err.print(f"  claude mcp add --transport http bastion {url}{header}", markup=False, highlight=False)
    err.print("Connect Codex (add to ~/.codex/config.toml):", highlight=False)
    err.print(f'  [mcp_servers.bastion]\n  url = "{url}"', markup=False, highlight=False)
    if tokens:
        err.print('  bearer_token_env_var = "BASTION_AGENT_TOKEN"', markup=False, highlight=False)
    err.print("Press Ctrl-C to stop.", highlight=False)


def _report_when_started(gateway: Gateway) -> None:
    """Print one line once no connector is still starting: how many tools are served, and which connectors
    are down."""
    reported = False

    async def report() -> None:
        nonlocal reported
        statuses = gateway.statuses()
        if reported or any(s.state == "starting" for s in statuses):
            return
        reported = True
        down = [s.source_id for s in statuses if s.state == "down"]
        line = f"Bastion: every connector has started; serving {len(gateway.tools)} tools"
        if down:
            line += f" (down: {', '.join(down)}, as logged above)"
        err.print(line, markup=False, highlight=False)

    gateway.on_catalog_changed(report)
