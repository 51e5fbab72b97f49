"""The composition root: configuration -> ledger -> sources -> gateway -> servers, in one place.

`bastion serve`, every command, the tests and the benches assemble Bastion here; the CLI parses arguments and
prints. Nothing in `bastion` but the CLI imports this module.

`serve` stops gracefully on SIGTERM and SIGINT (`Shutdown`): new calls are refused (retriable), calls already
running get `[server] shutdown_grace_seconds` to finish, then serving stops, what still runs is cancelled
(recorded `unknown`), every connector process is terminated, then killed. A signal during start-up, or a second
one, stops at once.
"""

from __future__ import annotations

import gc
import logging
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager, nullcontext
from typing import Any, Final, Literal

import anyio
import httpx2

from bastion.config import Config, config_hint, is_loopback
from bastion.errors import ConfigError
from bastion.ledger import OpenLedger, Redactor
from bastion.ledger import open_ledger as ledger_at
from bastion.ledger.anchors import Anchoring, load_or_create_signing_key, signing_key_path_for
from bastion.pipeline.gateway import Gateway
from bastion.pipeline.notify import AnchorWebhook, Notifier, shown_url
from bastion.server.express_stdio import serve_stdio
from bastion.server.http import require_tokens_beyond_loopback, serve_http
from bastion.server.mcp import HostServer
from bastion.sources.mcp import McpConnector
from bastion.sources.registry import Sources, load_sources

logger = logging.getLogger(__name__)

ANCHOR_AT_STOP_SECONDS: Final = 5.0
"""How long the stop waits to anchor the chain's head a last time."""
ANSWER_TIMEOUT: Final = 5.0
"""Seconds, once the calls have ended, for their answers to reach the hosts before serving stops."""

Starting = Callable[[Sequence[McpConnector]], AbstractContextManager[None]]
"""Wraps the start of the connectors (the CLI's spinner)."""


def redactor_of(config: Config) -> Redactor:
    """The redactor `[ledger]` asks for: what is stored, and what logs show, is scrubbed by it."""
    settings = config.settings.ledger
    return Redactor(extra_secret_keys=settings.extra_secret_keys, max_bytes=settings.max_result_bytes)


@asynccontextmanager
async def open_ledger(config: Config, redactor: Redactor | None = None) -> AsyncIterator[OpenLedger]:
    """The configured ledger, closed on exit."""
    scrub = redactor if redactor is not None else redactor_of(config)
    async with await ledger_at(config.ledger_url, redactor=scrub, key_path=config.ledger_key) as ledger:
        yield ledger


@asynccontextmanager
async def open_gateway(
    config: Config,
    *,
    loaded: Callable[[Sources], None] | None = None,
    wait_for_sources: bool = True,
    redactor: Redactor | None = None,
    starting: Starting | None = None,
    anchored: bool = False,
) -> AsyncIterator[Gateway]:
    """A running gateway over the ledger and the configured sources (the disabled ones are not started). The
    sources are built once the ledger is open (`load_sources`), so the providers mark what their calls make with
    the ledger's marker key; `loaded` is told them first (the CLI prints their problems). Without
    `wait_for_sources` (`serve`) it is yielded at once, while the sources start (`Gateway.running`); `starting`
    wraps the start of the connectors. `anchored` (`serve`): the audit chain's head is anchored while it runs, and
    once more after its sources stopped (`anchoring`)."""
    async with open_ledger(config, redactor) as ledger, AsyncExitStack() as running:
        if anchored:
            await running.enter_async_context(anchoring(config, ledger))
        sources = load_sources(config, marker_key=ledger.marker_key)
        if loaded is not None:
            loaded(sources)
        gateway = Gateway(config, ledger, sources.all)
        disabled = set(config.policy.sources.disabled)
        connectors = [s for s in sources.all if isinstance(s, McpConnector) and s.source_id not in disabled]
        with starting(connectors) if starting is not None else nullcontext():
            await running.enter_async_context(gateway.running(wait_for_sources=wait_for_sources))
        yield gateway


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


def anchor_secret_of(config: Config, url: str) -> str:
    """The secret that signs what is POSTed to `url` (`[ledger] anchor_secret`); ConfigError naming the fix when it
    is not set (the configuration refuses `anchor_url` without it: this is for a URL given on the command line)."""
    secret = config.settings.ledger.anchor_secret
    if secret is None or not secret.get_secret_value():
        raise ConfigError(
            f'anchors cannot be sent to {shown_url(url)} unsigned: add anchor_secret = "${{env:NAME}}" to [ledger] in '
            "bastion.toml (the receiver checks X-Bastion-Signature with it)"
        )
    return secret.get_secret_value()


@asynccontextmanager
async def anchor_webhook(config: Config, ledger: OpenLedger, url: str) -> AsyncIterator[AnchorWebhook]:
    """The webhook anchors are POSTed to at `url` (bastion.pipeline.notify), with its HTTP client."""
    secret = anchor_secret_of(config, url)
    async with httpx2.AsyncClient() as http:
        yield AnchorWebhook(ledger.outbox, url, secret, http=http)


@asynccontextmanager
async def anchoring(config: Config, ledger: OpenLedger) -> AsyncIterator[None]:
    """Anchor the audit chain's head in `[ledger] anchor_file` and to `anchor_url` while serving, and once more at
    the stop (bastion.ledger.anchors); nothing when neither is set."""
    path = config.anchor_file
    if path is None and config.settings.ledger.anchor_url is None:
        yield
        return
    key = await anyio.to_thread.run_sync(load_or_create_signing_key, signing_key_path_for(ledger.key_path))
    url = config.settings.ledger.anchor_url
    async with AsyncExitStack() as senders, anyio.create_task_group() as tg:
        sender = await senders.enter_async_context(anchor_webhook(config, ledger, url)) if url is not None else None
        anchors = Anchoring(ledger.audit, key, path, sender)
        tg.start_soon(anchors.every, config.settings.ledger.anchor_every_seconds)
        try:
            yield
        finally:
            tg.cancel_scope.cancel()
            with anyio.move_on_after(ANCHOR_AT_STOP_SECONDS, shield=True):
                await anchors.once()


async def serve(
    config: Config,
    *,
    transport: Literal["stdio", "http"],
    host: str = "127.0.0.1",
    port: int = 0,
    profile: str | None = None,
    allowed_hosts: Sequence[str] = (),
    listener: socket.socket | None = None,
    inbox_url: str | None = None,
    redactor: Redactor | None = None,
    on_ready: Callable[[Gateway, str, bool], None] | None = None,
) -> None:
    """Serve the gateway to hosts over `transport` until a signal stops it (see `Shutdown`). Over HTTP beyond
    loopback it is refused before anything starts while the ledger holds no token. `on_ready` (HTTP) is told the
    gateway, the base URL and whether tokens exist, once it listens."""
    if transport == "http" and not is_loopback(host):
        async with open_ledger(config, redactor) as ledger:  # refused before any connector starts
            await require_tokens_beyond_loopback(host, ledger.tokens, config_hint(config))
    shutdown = Shutdown(config.settings.server.shutdown_grace_seconds)
    async with anyio.create_task_group() as everything:
        everything.start_soon(shutdown.watch, everything.cancel_scope)
        async with (
            open_gateway(config, wait_for_sources=False, redactor=redactor, anchored=True) as gateway,
            notifying(config, gateway, inbox_url),
        ):
            freeze_startup_heap(gateway)
            if transport == "stdio":
                # One host per stdio process: its session is this process's own, not shared with the other stdio
                # servers on the same ledger (their limits are counted per session).
                session_id = f"stdio-{secrets.token_hex(4)}"
                front = shutdown.serving(HostServer(gateway, profile=profile, session_id=session_id))
                await shutdown.run_until_stopped(serve_stdio(front))
            else:
                tokens = await gateway.ledger.tokens.has_tokens()
                front = shutdown.serving(HostServer(gateway, profile=profile))
                await serve_http(
                    front,
                    host=host,
                    port=port,
                    on_ready=(lambda url: on_ready(gateway, url, tokens)) if on_ready is not None else None,
                    extra_hosts=list(allowed_hosts),
                    listener=listener,
                    stop=shutdown.stop,
                )
        everything.cancel_scope.cancel()


class Shutdown:
    """Stops `serve` on SIGTERM or SIGINT: refuse new calls, let running ones finish within `grace` seconds, then
    set `stop` (the transport stops serving). A signal before the gateway serves, or a second one, stops at once."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.stop = anyio.Event()
        self._front: HostServer | None = None
        self._draining = False

    def serving(self, front: HostServer) -> HostServer:
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

    async def _drain(self, front: HostServer, name: str) -> None:
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
