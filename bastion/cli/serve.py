"""`bastion serve`: the gateway for agent hosts over stdio or HTTP.

SIGTERM and SIGINT stop it gracefully (`Shutdown`): new calls are refused (retriable), calls already
running get `[server] shutdown_grace_seconds` to finish, then serving stops, what still runs is
cancelled (recorded `unknown`), every connector process is terminated, then killed, and the exit
status is 0. A signal during start-up, or a second one, stops at once.
"""

from __future__ import annotations

import gc
import logging
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

import anyio
import httpx2
import typer

from bastion import __version__
from bastion.cli.app import ConfigOption, Exit, app, err, load, open_gateway, open_ledger, run_async
from bastion.config import Config, config_hint, host_name, validate_profile
from bastion.errors import ConfigError
from bastion.pipeline.gateway import Gateway
from bastion.pipeline.notify import Notifier
from bastion.server.express_stdio import serve_stdio
from bastion.server.http import (
    bind_listener,
    is_loopback,
    listener_problem,
    require_tokens_beyond_loopback,
    serve_http,
)
from bastion.server.mcp import FrontDoor
from bastion.server.tracing import exporting_traces

logger = logging.getLogger(__name__)

ANSWER_TIMEOUT: Final = 5.0
"""Seconds, once the calls have ended, for their answers to reach the hosts before serving stops."""


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
            help="A name hosts reach Bastion by over HTTP (besides \\[server] allowed_hosts); repeatable. "
            "Other names are refused (421) against DNS rebinding; beyond loopback any IP address is served.",
        ),
    ] = None,
) -> None:
    """Serve the gateway to agent hosts over stdio (default) or HTTP.

    It serves at once, while the connectors start: for \\[server] startup_wait_seconds (default 5) a
    host's listings wait for connectors still starting; one that comes up later is announced to the
    hosts with tools/list_changed.

    SIGTERM or Ctrl-C stops it gracefully: new calls are refused, running ones get
    \\[server] shutdown_grace_seconds (default 10) to finish, then every connector is stopped. A second
    signal stops at once.

    With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, a span of every call and
    downstream call is sent there over OTLP/HTTP (OTEL_SDK_DISABLED=true turns it off).
    """
    config = load(config_dir)
    if profile is not None:
        try:
            validate_profile(config, profile)
        except ConfigError as exc:
            raise Exit(f"error: {exc.message}", 2) from exc
    allowed_hosts = [*config.settings.server.allowed_hosts, *_host_names(allowed_host or [])]
    # Bound before the ledger is recovered or any connector starts: a port problem stops nothing half-started.
    listener = _listen(host, port) if transport == "http" else None

    async def run() -> None:
        if transport == "http" and not is_loopback(host):
            async with open_ledger(config) as ledger:  # refused before any connector starts
                await require_tokens_beyond_loopback(host, ledger.tokens, config_hint(config))
        shutdown = Shutdown(config.settings.server.shutdown_grace_seconds)
        try:
            async with anyio.create_task_group() as everything:
                everything.start_soon(shutdown.watch, everything.cancel_scope)
                async with (
                    open_gateway(config, wait_for_sources=False) as gateway,
                    notifying(config, gateway, _inbox_url(host, listener)),
                ):
                    freeze_startup_heap(gateway)
                    if transport == "stdio":
                        # One host per stdio process: its session is this process's own, not shared with the
                        # other stdio servers on the same ledger (their limits are counted per session).
                        session_id = f"stdio-{secrets.token_hex(4)}"
                        front = shutdown.serving(FrontDoor(gateway, profile=profile, session_id=session_id))
                        await shutdown.run_until_stopped(serve_stdio(front))
                    else:
                        tokens = await gateway.ledger.tokens.has_tokens()

                        def ready(base_url: str) -> None:
                            _print_connect_help(config, base_url, gateway, tokens=tokens, allowed_hosts=allowed_hosts)

                        front = shutdown.serving(FrontDoor(gateway, profile=profile))
                        await serve_http(
                            front,
                            host=host,
                            port=port,
                            on_ready=ready,
                            extra_hosts=allowed_hosts,
                            listener=listener,
                            stop=shutdown.stop,
                        )
                everything.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise _sole(group) from None

    try:
        with exporting_traces():
            run_async(run, serving=True)
    finally:
        if listener is not None:
            listener.close()


class Shutdown:
    """Stops `serve` on SIGTERM or SIGINT: refuse new calls, let running ones finish within `grace` seconds, then
    set `stop` (the transport stops serving). A signal before the gateway serves, or a second one, stops at once."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.stop = anyio.Event()
        self._front: FrontDoor | None = None
        self._draining = False

    def serving(self, front: FrontDoor) -> FrontDoor:
        """From now on a signal stops `front` gracefully."""
        self._front = front
        return front

    async def watch(self, everything: anyio.CancelScope) -> None:
        """Wait for signals until cancelled; `everything` is cancelled to stop at once."""
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as draining:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    front = self._front
                    if front is None or self._draining:
                        logger.warning("%s: stopping now", name)
                        everything.cancel()
                        return
                    self._draining = True
                    draining.start_soon(self._drain, front, name)

    async def _drain(self, front: FrontDoor, name: str) -> None:
        gateway = front.gateway
        gateway.drain()
        logger.warning("%s: stopping; new calls are refused, running ones get up to %gs to finish", name, self.grace)
        cancelled = await gateway.settle(self.grace)
        if cancelled:
            logger.warning("cancelled %d call(s) still running after %gs (recorded unknown)", cancelled, self.grace)
        await front.calls_answered(ANSWER_TIMEOUT)
        self.stop.set()

    async def run_until_stopped(self, serving: Coroutine[Any, Any, None]) -> None:
        """Run `serving` until it returns or `stop` is set (then it is cancelled)."""
        async with anyio.create_task_group() as tg:

            async def cancel_when_stopped() -> None:
                await self.stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(cancel_when_stopped)
            await serving
            tg.cancel_scope.cancel()


@asynccontextmanager
async def notifying(config: Config, gateway: Gateway, inbox_url: str | None) -> AsyncIterator[None]:
    """Deliver `[[notify.webhook]]` messages while serving (bastion.pipeline.notify); nothing without webhooks."""
    webhooks = config.settings.notify.webhook
    if not webhooks:
        yield
        return
    link = config.settings.notify.inbox_url or inbox_url
    async with httpx2.AsyncClient() as http, anyio.create_task_group() as tg:
        await tg.start(Notifier(gateway.ledger, webhooks, http=http, inbox_url=link).run)
        yield
        tg.cancel_scope.cancel()


def _inbox_url(host: str, listener: socket.socket | None) -> str | None:
    """Where the inbox is served, for the links of webhook messages (None over stdio)."""
    if listener is None:
        return None
    shown = f"[{host}]" if listener.family == socket.AF_INET6 else host
    return f"http://{shown}:{listener.getsockname()[1]}/inbox"


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error a task group wrapped (the signal watcher never fails), so `run_async` sees it as raised."""
    if len(group.exceptions) == 1 and not isinstance(group.exceptions[0], BaseExceptionGroup):
        return group.exceptions[0]
    return group


def _host_names(given: list[str]) -> list[str]:
    try:
        return [host_name(name) for name in given]
    except ValueError as exc:
        raise Exit(f"error: --allowed-host {exc}", 2) from exc


def _listen(host: str, port: int) -> socket.socket:
    try:
        return bind_listener(host, port)
    except (OSError, OverflowError) as exc:
        raise Exit(f"error: {listener_problem(host, port, exc)}", 2) from exc


def _print_connect_help(
    config: Config, base_url: str, gateway: Gateway, *, tokens: bool, allowed_hosts: list[str]
) -> None:
    """The banner: what is served so far and how to connect. It prints as soon as the port listens, often before
    the connectors have listed: those still starting are named, and a line follows once they have."""
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
            f"(bastion tokens create NAME --role agent{config_hint(config)})",
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


def freeze_startup_heap(gateway: Gateway) -> None:
    """Take what start-up built (modules, the configuration, the SDK's models, the catalog) out of the garbage
    collector's sight, now and once more when every connector has started. Otherwise every collection of the
    oldest generation walks all of it again: about 150,000 objects, a pause of 50-115 ms for every session, every few
    thousand calls under load (~1 ms once frozen). What is frozen is only ever freed by reference counting: at
    most the start-up's own cycles are kept, once."""
    gc.freeze()
    frozen_again = False

    async def when_started() -> None:
        nonlocal frozen_again
        if not frozen_again and all(status.state != "starting" for status in gateway.statuses()):
            frozen_again = True
            gc.freeze()

    gateway.on_catalog_changed(when_started)


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
