"""One supervised downstream MCP server: connect, list, watch, reconnect, call, relay.

`McpConnector` satisfies the pipeline's `ActionSource` and `ContentSource` protocols structurally.
`run()` keeps one `mcp.Client` connected: it lists every page of tools (and of resources, resource
templates and prompts when the downstream offers them), re-lists what the downstream says changed,
notices the connection dying, withdraws the listings and reconnects with exponential backoff.
While a call runs, what the downstream logs or asks (sampling, elicitation) goes to the call's
relay (see `inflight.py`); resource subscriptions are kept across reconnects (`subscriptions.py`).

How a dead downstream is noticed depends on the protocol era the connection negotiated:

- 2026-07-28: an open `subscriptions/listen` stream ends (`SubscriptionLost`) as soon as the
  transport does (stdio EOF, a broken HTTP response stream); it also carries `tools/list_changed`.
  It also carries `resources/list_changed` and `prompts/list_changed`. A modern server that does not
  serve `subscriptions/listen` is probed with `server/discover`.
- 2025 and earlier (handshake era): nothing fails until a request is sent, so a `ping` goes out
  every `probe_interval` seconds. Over streamable HTTP a request to a dead server makes the
  transport's task group fail, which cancels the connection and exits the `Client` with an
  `ExceptionGroup`.
- In both eras a call that fails with CONNECTION_CLOSED marks the connection lost at once.

An attempt that has not connected and listed within `list_timeout` is abandoned. After a loss or a
failed attempt the connector waits `backoff_initial` seconds, doubling up to `backoff_cap` while
attempts keep failing; a connection that became ready resets the delay.

A stdio downstream runs as a child process (`process.py`): when it exits by itself, its exit status and
the last lines of its stderr are the reason the connector is down. A failure is logged once, with the
stderr of the attempt that failed; the same failure on later attempts only updates the status, until it
changes or the connector recovers.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Final, TypeAlias, TypeVar, cast

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from anyio.abc import TaskStatus
from mcp import Client, InputRequiredRoundsExceededError, MCPError, StdioServerParameters
from mcp.client import Transport
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import SubscriptionLost
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import CONNECTION_CLOSED, LOG_LEVEL_META_KEY, REQUEST_TIMEOUT
from pydantic import ValidationError

from bastion.actions import ActionSpec, WireResult
from bastion.config import ConnectorConfig
from bastion.errors import BastionError, CallTimeout, ConnectorUnavailable, UnknownOutcome, UpstreamError
from bastion.models import Risk, SourceStatus, utcnow
from bastion.sources.mcp.failures import describe, first_line, is_expected
from bastion.sources.mcp.forwarding import CORRELATION_META_KEY, Forwarding
from bastion.sources.mcp.inflight import InFlightCalls
from bastion.sources.mcp.link import Link
from bastion.sources.mcp.listing import Listing, list_prompts, list_resources, list_tools
from bastion.sources.mcp.previews import preview_settings, previews
from bastion.sources.mcp.process import Child, child_process
from bastion.sources.mcp.specs import action_specs, risk_of
from bastion.sources.mcp.subscriptions import ResourceWatch
from bastion.sources.mcp.wire import ResultChecks, strip_protocol_meta
from bastion.sources.seam import ChangeFn, HostRequest, ProgressFn, UpdatedFn

__all__ = ["CORRELATION_META_KEY", "ClientTarget", "McpConnector", "strip_protocol_meta"]

logger = logging.getLogger(__name__)

DOWNSTREAM_LOG_LEVEL: Final = "debug"
"""What a 2025-era downstream that offers logging is asked for once: everything (each host's own
level is applied when a message is relayed)."""

HTTP_TIMEOUT: Final = httpx2.Timeout(30.0, read=300.0)
"""Connect/write budget for HTTP downstreams; reads wait longer for slow tools and quiet streams."""

ClientTarget: TypeAlias = Any
"""Whatever `mcp.Client` connects to: a `Transport`, `StdioServerParameters`, a streamable-HTTP URL, or
(in tests) an in-process `Server`/`MCPServer`. Kept loose: naming the server types would import mcp.server."""

# The same shapes as `bastion.pipeline.gateway.ChangeFn`/`ProgressFn` (this layer cannot import the pipeline).

_Result = TypeVar("_Result", bound=types.Result)


class McpConnector:
    """A downstream MCP server kept connected, its listings current, its calls forwarded and relayed."""

    def __init__(
        self,
        config: ConnectorConfig,
        *,
        list_timeout: float = 15.0,
        target: Callable[[], ClientTarget] | None = None,
        backoff_initial: float = 0.5,
        backoff_cap: float = 60.0,
        probe_interval: float = 1.0,
    ) -> None:
        """`target` builds what to connect to on each attempt (default: from `config`); `probe_interval`
        is how often a connection without a `listen()` stream is probed for liveness."""
        self._config = config
        self._list_timeout = list_timeout
        self._target = target if target is not None else self._configured_target
        self._backoff_initial = backoff_initial
        self._backoff_cap = backoff_cap
        self._probe_interval = probe_interval
        self._listing = Listing()
        self._status = SourceStatus(source_id=config.id, state="starting")
        self._link: Link | None = None
        self._child: Child | None = None
        """The process of the current attempt, for a stdio downstream started from the configuration."""
        self._reported: str | None = None
        """The failure last logged, so a reconnect that fails the same way stays quiet."""
        self._calls = InFlightCalls(config.id)
        self._watch = ResourceWatch(config.id, timeout=list_timeout)
        self._checks = ResultChecks()

    @property
    def source_id(self) -> str:
        return self._config.id

    @property
    def status(self) -> SourceStatus:
        return self._status

    @property
    def namespace(self) -> str:
        return self._config.effective_namespace

    def tools(self) -> list[types.Tool]:
        """The current listing exactly as the downstream sent it (all pages); empty while down."""
        return list(self._listing.tools)

    def actions(self) -> list[ActionSpec]:
        """The listed tools as action specs, with the connector file's overrides applied, and the previews of the
        tools that have one (`previews.py`), made through this connector."""
        tools = self._listing.tools
        settings = preview_settings(self._config, tools, self._status.server_name)
        return action_specs(self._config, tools, previews(self.source_id, self.call, settings))

    def risk_of(self, action_id: str, definition: Mapping[str, Any]) -> Risk:
        """The risk this connector gives `action_id` with this wire-form definition (e.g. a pinned one)."""
        return risk_of(self._config, action_id, definition)

    def resources(self) -> list[types.Resource]:
        return list(self._listing.resources)

    def resource_templates(self) -> list[types.ResourceTemplate]:
        return list(self._listing.templates)

    def prompts(self) -> list[types.Prompt]:
        return list(self._listing.prompts)

    async def run(self, on_change: ChangeFn) -> None:
        """Keep the downstream connected until cancelled; `on_change(source_id)` follows every listing change."""
        delay = self._backoff_initial
        try:
            while True:
                link: Link | None = None
                try:
                    link = await self._connect_and_watch(on_change)
                    reason = link.reason or "the connection closed"
                except Exception as exc:  # supervisor: no failure of one connection may escape run()
                    reason = describe(exc)
                    if not is_expected(exc):
                        logger.exception("connector %s failed unexpectedly", self.source_id)
                finally:
                    self._link = None
                    self._watch.detach()
                if self._child is not None and self._child.ending is not None:
                    reason = self._child.ending
                await self._fail(reason, on_change)
                self._child = None
                if link is not None and link.ready:
                    delay = self._backoff_initial
                logger.info("connector %s: reconnecting in %.2gs", self.source_id, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, self._backoff_cap)
        finally:
            # Cancelled: nothing is connected any more (no on_change: the caller is shutting down).
            self._listing = Listing()
            self._status = SourceStatus(
                source_id=self.source_id, state="down", last_error="stopped", server_name=self._status.server_name
            )

    async def call(
        self,
        action_id: str,
        arguments: dict[str, Any],
        *,
        correlation_id: str,
        timeout: float,
        on_progress: ProgressFn | None = None,
        relay: HostRequest | None = None,
    ) -> types.CallToolResult:
        """Call one downstream tool; see `ActionSource.call` for the errors raised."""
        link = self._ready_link()
        # An open TypedDict (PEP 728 `extra_items`), which mypy does not model yet.
        meta = cast(types.RequestParamsMeta, {CORRELATION_META_KEY: correlation_id})
        if relay is not None and link.modern and relay.log_level is not None:
            # 2026-07-28 logging is opted into per request (2025-era downstreams were asked once at connect).
            meta[LOG_LEVEL_META_KEY] = relay.log_level  # type: ignore[literal-required]
        try:
            with self._calls.calling(relay):
                result = await link.client.call_tool(
                    action_id,
                    arguments,
                    read_timeout_seconds=timeout,
                    progress_callback=_forwarder(on_progress) if on_progress is not None else None,
                    meta=meta,
                )
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise CallTimeout(f"{self.source_id}:{action_id} did not answer within {timeout:g}s") from exc
            if exc.code == CONNECTION_CLOSED:
                link.lose(f"the connection closed during a call of {action_id}")
                raise UnknownOutcome(
                    f"the connection to {self.source_id} closed while {action_id} was running; its outcome is unknown"
                ) from exc
            raise UpstreamError(f"{self.source_id}:{action_id} failed with error {exc.code}: {exc.message}") from exc
        except (ValidationError, InputRequiredRoundsExceededError) as exc:
            raise UpstreamError(f"{self.source_id}:{action_id} returned an unusable result: {exc}") from exc
        except RuntimeError as exc:
            # Raised once the request is out (`_ready_link` checked the session first): the SDK found the
            # result's structured content off the tool's output schema, so the tool ran. Retrying could repeat it.
            raise UpstreamError(
                f"{self.source_id}:{action_id} ran, but its result breaks the tool's own output schema "
                f"({first_line(exc)}); the result is withheld, and the call is not safe to repeat blindly"
            ) from exc
        return strip_protocol_meta(result)

    async def _log(self, params: types.LoggingMessageNotificationParams) -> None:
        """The client's logging callback: relayed to the call in flight, and the express wire told (`heard_log`)."""
        try:
            await self._calls.log(params)
        finally:
            if self._child is not None:
                self._child.wire.heard_log()

    async def call_wire(
        self,
        action_id: str,
        arguments: dict[str, Any],
        *,
        correlation_id: str,
        timeout: float,
        relay: HostRequest | None = None,
    ) -> WireResult | None:
        """`call`, written to the downstream's process and answered as JSON (bastion.sources.mcp.forwarding), with the
        same checks and errors; None, having sent nothing, when this call cannot go that way: a downstream not run
        by Bastion over stdio, or a 2026-07-28 one while the host could answer its questions (the SDK's client then
        drives those rounds)."""
        link = self._ready_link()
        wire = self._child.wire if self._child is not None else None
        if wire is None or not wire.open or (link.modern and (wire.envelope is None or (relay and relay.answers))):
            return None
        forwarding = Forwarding(
            self.source_id, wire, link.client.protocol_version, link.modern, self._calls, self._checks, link.lose
        )
        return await forwarding.call(
            action_id,
            arguments,
            self._listing.tool(action_id),
            correlation_id=correlation_id,
            timeout=timeout,
            relay=relay,
        )

    # -- resources, prompts, completion ------------------------------------------------------------

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        link = self._ready_link()
        return await self._ask(link, f"resources/read {uri}", link.client.read_resource(uri))

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
        link = self._ready_link()
        return await self._ask(link, f"prompts/get {name}", link.client.get_prompt(name, arguments))

    async def complete(
        self,
        ref: types.PromptReference | types.ResourceTemplateReference,
        argument: types.CompletionArgument,
        context: types.CompletionContext | None,
    ) -> types.CompleteResult:
        link = self._ready_link()
        if link.client.server_capabilities.completions is None:
            return types.CompleteResult(completion=types.Completion(values=[]))
        request = types.CompleteRequest(params=types.CompleteRequestParams(ref=ref, argument=argument, context=context))
        sent = link.client.session.send_request(request, types.CompleteResult)
        return await self._ask(link, "completion/complete", sent)

    async def subscribe(self, uri: str, on_updated: UpdatedFn) -> None:
        """Watch `uri` on the downstream, now if connected and again after every reconnect."""
        try:
            await self._watch.subscribe(uri, on_updated)
        except MCPError as exc:
            raise self._translate(exc, f"resources/subscribe {uri}") from exc

    async def unsubscribe(self, uri: str) -> None:
        try:
            await self._watch.unsubscribe(uri)
        except MCPError as exc:
            raise self._translate(exc, f"resources/unsubscribe {uri}") from exc

    def _ready_link(self) -> Link:
        """The live link, or ConnectorUnavailable: the one check made before anything is sent.

        Its caller must send without awaiting anything else first, so the client cannot close in between;
        a RuntimeError from the SDK after this point means the request went out.
        """
        link = self._link
        if link is None or not link.ready or link.lost.is_set() or not _has_session(link.client):
            raise ConnectorUnavailable(
                f"connector {self.source_id} is not connected ({self._status.last_error or self._status.state})"
            )
        return link

    async def _ask(self, link: Link, what: str, request: Awaitable[_Result]) -> _Result:
        """Await one request to the downstream, translating its failures; the answer loses its protocol `_meta`."""
        try:
            with self._calls.calling(None):
                return strip_protocol_meta(await request)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                link.lose(f"the connection closed during {what}")
            raise self._translate(exc, what) from exc
        except (ValidationError, InputRequiredRoundsExceededError) as exc:
            raise UpstreamError(f"{self.source_id}: {what} returned an unusable result: {exc}") from exc
        except RuntimeError as exc:
            # After the send (the session was checked first): e.g. an input request where none may come.
            raise UpstreamError(f"{self.source_id}: {what} returned an unusable result: {first_line(exc)}") from exc

    def _translate(self, exc: MCPError, what: str) -> BastionError:
        if exc.code == CONNECTION_CLOSED:
            return ConnectorUnavailable(f"the connection to {self.source_id} closed during {what}")
        if exc.code == REQUEST_TIMEOUT:
            return CallTimeout(f"{self.source_id}: {what} timed out")
        # Its cause is the downstream's own error, which the host server passes on to the host as it is.
        return UpstreamError(f"{self.source_id}: {what} failed with error {exc.code}: {exc.message}")

    # -- the connection ------------------------------------------------------------------------------

    async def _connect_and_watch(self, on_change: ChangeFn) -> Link:
        """Run one connection until it is lost; returns its link (with the reason) or raises."""
        link = Link(self._watch.updated)
        link.client = client = Client(
            self._target(),
            mode="auto",
            cache=None,
            message_handler=link.on_message,
            sampling_callback=self._calls.sample,
            elicitation_callback=self._calls.elicit,
            logging_callback=self._log,
        )
        with anyio.CancelScope() as attempt:
            async with anyio.create_task_group() as guard:
                timer = anyio.CancelScope()
                guard.start_soon(self._give_up_connecting, link, timer, attempt, on_change)
                # Client first, then its task group: anyio cancel scopes must unwind in LIFO order, and a Client
                # entered in a way that makes it outlive a task group opened after it fails at shutdown with
                # "Attempted to exit a cancel scope that isn't the current task's current cancel scope".
                async with client, anyio.create_task_group() as tg:
                    if link.modern:
                        # Subscribe before listing, so no change between the two goes unnoticed.
                        await tg.start(self._watch_subscription, link)
                    if not link.lost.is_set():
                        await self._serve(link, tg, timer, on_change)
                    tg.cancel_scope.cancel()
                timer.cancel()
        return link

    async def _give_up_connecting(
        self, link: Link, timer: anyio.CancelScope, attempt: anyio.CancelScope, on_change: ChangeFn
    ) -> None:
        """Abandon an attempt that has not listed within `list_timeout` (connect included)."""
        with timer:
            await anyio.sleep(self._list_timeout)
            link.lose(f"no answer to connect and list tools within {self._list_timeout:g}s")
            attempt.cancel()
            # Announce now: a stuck stdio child takes seconds to shut down.
            with anyio.CancelScope(shield=True):
                await self._fail(link.reason or "timed out", on_change)

    async def _serve(self, link: Link, tg: anyio.abc.TaskGroup, timer: anyio.CancelScope, on_change: ChangeFn) -> None:
        """List, go ready, and wait for the connection to be lost; then withdraw the listings."""
        client = link.client
        tools = await list_tools(client, self.source_id)
        resources, templates = await list_resources(client, self.source_id)
        prompts = await list_prompts(client, self.source_id)
        if link.lost.is_set():
            return
        if not link.modern and client.server_capabilities.logging is not None:
            await self._ask_for_logs(client)
        await self._watch.attach(client, tg)
        timer.cancel()
        self._listing = Listing(tools=tools, resources=resources, templates=templates, prompts=prompts)
        self._status = SourceStatus(
            source_id=self.source_id,
            state="ready",
            tools=len(tools),
            protocol_version=client.protocol_version,
            server_name=client.server_info.name if client.server_info else None,
            server_version=client.server_info.version if client.server_info else None,
        )
        link.ready = True
        self._link = link
        self._reported = None
        if self._child is not None:
            await self._child.release()
        logger.info(
            "connector %s: connected (%s, protocol %s, %d tools, %d resources, %d templates, %d prompts)",
            self.source_id,
            self._status.server_name or "unnamed server",
            client.protocol_version,
            len(tools),
            len(resources),
            len(templates),
            len(prompts),
        )
        tg.start_soon(self._relist_on_request, link, on_change)
        if not link.modern:
            tg.start_soon(self._probe, link)
        await self._announce(on_change)
        await link.lost.wait()
        self._link = None
        self._watch.detach()
        # Withdraw the listings now rather than after the (possibly slow) transport shutdown; the failure is
        # reported once the transport has closed, when a child process's exit status is known.
        await self._go_down(link.reason or "the connection closed", on_change)

    async def _ask_for_logs(self, client: Client) -> None:
        """2025-era: ask once for every log message (sent as a plain request: the SDK helper is deprecated)."""
        request = types.SetLevelRequest(params=types.SetLevelRequestParams(level=DOWNSTREAM_LOG_LEVEL))
        try:
            await client.session.send_request(request, types.EmptyResult)
        except MCPError as exc:
            logger.info("connector %s: logging/setLevel refused (%s); relaying what it sends", self.source_id, exc)

    async def _relist_on_request(self, link: Link, on_change: ChangeFn) -> None:
        """Re-list what the downstream announced as changed (outside the message handler)."""
        while True:
            await link.relist_wanted.wait()
            link.relist_wanted = anyio.Event()
            kinds, link.relist = link.relist, set()
            listing = self._listing
            try:
                with anyio.fail_after(self._list_timeout):
                    if "tools" in kinds:
                        listing = replace(listing, tools=await list_tools(link.client, self.source_id))
                    if "resources" in kinds:
                        resources, templates = await list_resources(link.client, self.source_id)
                        listing = replace(listing, resources=resources, templates=templates)
                    if "prompts" in kinds:
                        listing = replace(listing, prompts=await list_prompts(link.client, self.source_id))
            except (MCPError, TimeoutError, UpstreamError) as exc:
                link.lose(f"re-listing {', '.join(sorted(kinds))} failed: {describe(exc)}")
                return
            self._listing = listing
            self._status = self._status.model_copy(update={"tools": len(listing.tools)})
            logger.info("connector %s: %s changed", self.source_id, ", ".join(sorted(kinds)))
            await self._announce(on_change)

    async def _watch_subscription(self, link: Link, *, task_status: TaskStatus[None]) -> None:
        """2026-07-28: hold a `listen()` stream open; its end is the connection's end.

        Started once the stream is acknowledged (or found unavailable). Its `*/list_changed` frames
        are teed to the message handler, which does the reacting; here events are only drained.
        """
        capabilities = link.client.server_capabilities
        started = False
        try:
            async with link.client.listen(
                tools_list_changed=True,
                resources_list_changed=capabilities.resources is not None,
                prompts_list_changed=capabilities.prompts is not None,
            ) as subscription:
                started = True
                task_status.started()
                async for _event in subscription:
                    pass
            link.lose("the downstream closed its subscription")
        except SubscriptionLost as exc:
            link.lose(f"the connection was lost ({describe(exc.__cause__ or exc)})")
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                link.lose(f"the connection was lost ({exc.message})")
            else:
                logger.info("connector %s: no subscriptions/listen (%s); probing instead", self.source_id, exc.message)
                if not started:
                    task_status.started()
                await self._probe(link)
                return
        if not started:
            task_status.started()

    async def _probe(self, link: Link) -> None:
        """Send a cheap request every `probe_interval` seconds; a failure means the connection is gone."""
        session = link.client.session
        while True:
            await anyio.sleep(self._probe_interval)
            try:
                with anyio.fail_after(self._list_timeout):
                    if link.modern:
                        await session.send_discover(link.client.protocol_version)
                    else:
                        await session.send_ping()
            except (MCPError, TimeoutError) as exc:
                link.lose(f"the downstream stopped answering ({describe(exc)})")
                return

    async def _fail(self, reason: str, on_change: ChangeFn) -> None:
        """Go down for `reason`. A failure not reported yet is logged, after the stderr the attempt's process
        wrote while connecting; the same failure again only updates the status."""
        if reason != self._reported:
            if self._child is not None:
                await self._child.release()
            logger.warning("connector %s is down: %s", self.source_id, reason)
            self._reported = reason
        else:
            logger.debug("connector %s: the attempt failed the same way again", self.source_id)
        await self._go_down(reason, on_change)

    async def _go_down(self, reason: str, on_change: ChangeFn) -> None:
        """Withdraw the listings and record why; announce it when the state or the listings changed."""
        changed = self._status.state != "down" or self._listing != Listing()
        self._listing = Listing()
        if self._status.state == "down":
            self._status = self._status.model_copy(update={"last_error": reason})
        else:
            self._status = SourceStatus(
                source_id=self.source_id,
                state="down",
                last_error=reason,
                since=utcnow(),
                server_name=self._status.server_name,
            )
        if changed:
            await self._announce(on_change)

    async def _announce(self, on_change: ChangeFn) -> None:
        try:
            await on_change(self.source_id)
        except Exception:  # supervisor: a faulty listener must not kill the connection
            logger.exception("connector %s: on_change callback failed", self.source_id)

    def _configured_target(self) -> ClientTarget:
        """What the connector file describes: a command over stdio, a streamable-HTTP or an SSE URL."""
        config = self._config
        if config.transport == "stdio":
            if not config.command:
                raise ConnectorUnavailable(f"connector {config.id}: transport 'stdio' needs a `command`")
            self._child = Child()
            parameters = StdioServerParameters(
                command=config.command, args=config.args, env=config.env or None, cwd=config.cwd
            )
            return child_process(parameters, self._child)
        if not config.url:
            raise ConnectorUnavailable(f"connector {config.id}: transport {config.transport!r} needs a `url`")
        if config.transport == "http":
            return _streamable_http(config.url, config.headers)
        return sse_client(config.url, headers=config.headers or None)


def _streamable_http(url: str, headers: dict[str, str]) -> Transport:
    """A streamable-HTTP transport over an `httpx2.AsyncClient` it owns (the SDK leaves a passed client open)."""

    @asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=HTTP_TIMEOUT) as http_client,
            streamable_http_client(url, http_client=http_client) as streams,
        ):
            yield streams

    return transport()


def _forwarder(on_progress: ProgressFn) -> ProgressFnT:
    """Adapt a positional progress callback to the SDK's keyword-capable `ProgressFnT`."""

    async def forward(progress: float, total: float | None, message: str | None) -> None:
        await on_progress(progress, total, message)

    return forward


def _has_session(client: Client) -> bool:
    """Whether the client is connected (its `session` raises RuntimeError before connecting and after closing)."""
    try:
        return client.session is not None
    except RuntimeError:
        return False
