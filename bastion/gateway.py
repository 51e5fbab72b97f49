"""The call pipeline and the Gateway that owns catalog, policy and ledger (DESIGN.md §2, §6).

Every call: resolve the tool, validate its arguments, apply the session's rate limit, resolve the
mode (tightened by drift), record the intent, then run it, hold it for an approver, or refuse it,
and record the outcome.

Beside tools, the gateway relays its sources' resources, resource templates and prompts (see
`bastion.resources` for naming and routing). Those are not actions: policy gates tools only, and
reading a resource, getting a prompt or completing an argument is never recorded in the ledger.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any, Literal, NoReturn, TypeVar

import anyio
import mcp_types as types

from bastion.approvals import ApprovalDesk, PendingFn, Progress, args_hash, owner_alive, process_identity
from bastion.catalog import Catalog, CatalogEntry, PreparedAction, prepare_source, risk_of
from bastion.config import Config, ConnectorConfig
from bastion.errors import (
    BastionError,
    CallTimeout,
    ConnectorUnavailable,
    InvalidArguments,
    NotFound,
    PendingLimit,
    PolicyDenied,
    RateLimited,
    SourceDisabled,
    UnknownOutcome,
    UpstreamError,
)
from bastion.models import CallContext, Invocation, ModeDecision, Risk, SourceStatus, Status, utcnow
from bastion.pinning import PinBook
from bastion.policies import RateLimiter, guard_drift, resolve_mode
from bastion.resources import ContentCatalog, PromptEntry, SourceContent
from bastion.seams import ActionSource, ContentSource, Ledger, ProgressFn, Relay, UpdatedFn

logger = logging.getLogger(__name__)

ListingKind = Literal["tools", "resources", "prompts"]
"""What a host re-lists after a change notification (resource templates go with resources)."""

ListingsFn = Callable[[frozenset[ListingKind]], Awaitable[None]]
"""Called after a rebuild with the kinds of listing that changed."""

_T = TypeVar("_T")

INVOCATION_TOOL = types.Tool(
    name="bastion__invocation",
    title="Look up an invocation",
    description=(
        "Return the status and (redacted) result of an earlier call made through Bastion, by its invocation id. "
        "Use it after a call that waited for approval was interrupted, or to check on a pending one."
    ),
    input_schema={
        "type": "object",
        "properties": {"invocation_id": {"type": "string", "description": "The id from the earlier call."}},
        "required": ["invocation_id"],
        "additionalProperties": False,
    },
    annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True),
)
"""The gateway's own tool: never gated, never recorded (it only reads the ledger)."""


class Gateway:
    """Owns the sources, the catalog, the policy and the ledger, and runs every call through one pipeline."""

    def __init__(
        self,
        config: Config,
        ledger: Ledger,
        sources: Sequence[ActionSource],
        *,
        connectors: Mapping[str, ConnectorConfig] | None = None,
        instance_id: str | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.instance_id = instance_id or process_identity()
        self._sources = {s.source_id: s for s in sources}
        self._connectors = dict(connectors) if connectors is not None else {c.id: c for c in config.connectors}
        self._disabled = frozenset(config.policy.sources.disabled)
        self._prepared: dict[str, list[PreparedAction]] = {}
        self.catalog = Catalog()
        self.tools: list[types.Tool] = [INVOCATION_TOOL]
        """What `tools/list` answers: the visible catalog plus the gateway's own tool."""
        self.pins = PinBook(ledger, self._connectors)
        self.desk = ApprovalDesk(
            ledger,
            runner=self._run_counted,
            lookup=self._lookup,
            owner=self.instance_id,
            heartbeat_seconds=config.settings.approvals.heartbeat_seconds,
        )
        self._rate = RateLimiter(config.settings.limits.invocations_per_minute)
        self._listeners: list[Callable[[], Awaitable[None]]] = []
        self._changed = anyio.Event()
        self._content_sources = {
            s.source_id: s for s in sources if isinstance(s, ContentSource) and s.source_id not in self._disabled
        }
        self._content: dict[str, SourceContent] = {}
        self.content = ContentCatalog()
        """The merged resources, templates and prompts, and the routes back to their sources."""
        self._dirty: set[ListingKind] = set()
        self._listing_listeners: list[ListingsFn] = []
        self._update_listeners: list[UpdatedFn] = []
        self._subscriptions: dict[str, tuple[str, int]] = {}
        """Subscribed URI -> (the source subscribed to, how many host subscriptions share it)."""
        self._subscribing = anyio.Lock()
        self._relays: dict[str, Relay] = {}
        """Invocation id -> the host request its downstream messages go to, while its call() runs."""
        self._draining = False
        self._running: set[anyio.CancelScope] = set()
        self._waiting: set[anyio.CancelScope] = set()
        self._call_ended = anyio.Event()

    # -- catalog ---------------------------------------------------------------------------------

    def statuses(self) -> list[SourceStatus]:
        """Every configured source's status, disabled ones included, sorted by id."""
        found = [s.status for s in self._sources.values()]
        found += [SourceStatus(source_id=sid, state="disabled") for sid in self._disabled if sid in self._connectors]
        return sorted(found, key=lambda s: s.source_id)

    def on_catalog_changed(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Register a coroutine called after every catalog rebuild."""
        self._listeners.append(listener)

    def on_listings_changed(self, listener: ListingsFn) -> None:
        """Register a coroutine called after a rebuild that changed what hosts list (the server notifies them)."""
        self._listing_listeners.append(listener)

    def on_resource_updated(self, listener: UpdatedFn) -> None:
        """Register a coroutine called with the URI of every update of a subscribed resource."""
        self._update_listeners.append(listener)

    def _lookup(self, source_id: str, action_id: str) -> CatalogEntry | None:
        return self.catalog.by_action.get((source_id, action_id))

    async def _source_changed(self, source_id: str) -> None:
        """A source (re)listed or went away: prepare its actions and check them against their pins."""
        source = self._sources[source_id]
        config = self._connectors[source_id]
        prepared = prepare_source(config, source.tools())
        before = self._prepared.get(source_id, [])
        if [a.upstream for a in before] != [a.upstream for a in prepared]:
            self._dirty.add("tools")
        self._prepared[source_id] = prepared
        content_source = self._content_sources.get(source_id)
        if content_source is not None:
            self._observe_content(content_source, config.effective_namespace)
        await self.pins.observe(source_id, prepared)
        self._changed.set()

    def _observe_content(self, source: ContentSource, namespace: str) -> None:
        content = SourceContent(
            source_id=source.source_id,
            namespace=namespace,
            resources=tuple(source.resources()),
            templates=tuple(source.resource_templates()),
            prompts=tuple(source.prompts()),
        )
        before = self._content.get(source.source_id, SourceContent(source.source_id, namespace))
        if (before.resources, before.templates) != (content.resources, content.templates):
            self._dirty.add("resources")
        if before.prompts != content.prompts:
            self._dirty.add("prompts")
        self._content[source.source_id] = content

    def _rebuild(self) -> frozenset[ListingKind]:
        """Rebuild what hosts list; returns the kinds of listing that changed since the last rebuild."""
        self.catalog = Catalog(action for actions in self._prepared.values() for action in actions)
        self.tools = [*self.catalog.tools, INVOCATION_TOOL]
        self.content = ContentCatalog(self._content.values())
        changed, self._dirty = frozenset(self._dirty), set()
        return changed

    async def _rebuild_loop(self) -> None:
        """Coalesce change bursts (a start-up of many sources) into few rebuilds and host notifications."""
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            changed = self._rebuild()
            for listener in self._listeners:
                await listener()
            if changed:
                for listing_listener in self._listing_listeners:
                    await listing_listener(changed)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Recover the ledger, start every source, wait (bounded) for their first listing, serve, stop."""
        report = await self.ledger.recover(owner_alive)
        if report.unknown or report.approved:
            logger.warning(
                "recovered the ledger: %d interrupted invocation(s) marked unknown, %d approved one(s) to run",
                len(report.unknown),
                len(report.approved),
            )
        await self.pins.load()
        async with anyio.create_task_group() as tg:
            for source in self._sources.values():
                tg.start_soon(source.run, self._source_changed, name=f"source:{source.source_id}")
            with anyio.move_on_after(self.config.settings.limits.list_timeout_seconds + 1):
                while any(s.status.state == "starting" for s in self._sources.values()):
                    await self._changed.wait()
                    self._changed = anyio.Event()
            slow = [s.source_id for s in self._sources.values() if s.status.state == "starting"]
            if slow:
                logger.warning("sources still listing after the timeout, omitted for now: %s", ", ".join(slow))
            self._rebuild()
            tg.start_soon(self._rebuild_loop, name="catalog")
            tg.start_soon(self.ledger.watch, name="ledger-watch")
            await tg.start(self.desk.run, name="approvals")
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    # -- resources, prompts, completion (relayed, never gated or recorded) -------------------------

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        """Read a resource from the source that lists it (or whose template matches it)."""
        source = self._content_source(self.content.route_uri(uri), f"no resource or resource template matches {uri!r}")
        return await self._bounded(f"resources/read {uri}", lambda: source.read_resource(uri))

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
        """Get a prompt by its host name from its source, under the source's own name for it."""
        entry, source = self._prompt(name)
        return await self._bounded(f"prompts/get {name}", lambda: source.get_prompt(entry.upstream_name, arguments))

    async def complete(
        self,
        ref: types.PromptReference | types.ResourceTemplateReference,
        argument: types.CompletionArgument,
        context: types.CompletionContext | None,
    ) -> types.CompleteResult:
        """Route a completion by the prompt's host name (sent upstream under its own) or the template's URI."""
        if isinstance(ref, types.PromptReference):
            entry, source = self._prompt(ref.name)
            ref = ref.model_copy(update={"name": entry.upstream_name})
        else:
            routed = self.content.route_reference(ref.uri)
            source = self._content_source(routed, f"no resource or resource template matches {ref.uri!r}")
        upstream_ref = ref
        return await self._bounded("completion/complete", lambda: source.complete(upstream_ref, argument, context))

    async def subscribe_resource(self, uri: str) -> None:
        """One more host subscription to `uri`; the first one subscribes its source."""
        async with self._subscribing:
            held = self._subscriptions.get(uri)
            if held is not None:
                self._subscriptions[uri] = (held[0], held[1] + 1)
                return
            source_id = self.content.route_uri(uri)
            source = self._content_source(source_id, f"no resource or resource template matches {uri!r}")
            await self._bounded(f"resources/subscribe {uri}", lambda: source.subscribe(uri, self._resource_updated))
            self._subscriptions[uri] = (source.source_id, 1)

    async def unsubscribe_resource(self, uri: str) -> None:
        """One host subscription to `uri` fewer; the last one unsubscribes its source."""
        async with self._subscribing:
            held = self._subscriptions.get(uri)
            if held is None:
                return
            source_id, count = held
            if count > 1:
                self._subscriptions[uri] = (source_id, count - 1)
                return
            del self._subscriptions[uri]
            source = self._content_sources.get(source_id)
            if source is None:
                return
            try:
                await self._bounded(f"resources/unsubscribe {uri}", lambda: source.unsubscribe(uri))
            except BastionError as exc:
                logger.info("unsubscribing %s from %s failed: %s", source_id, uri, exc.message)

    async def _resource_updated(self, uri: str) -> None:
        for listener in self._update_listeners:
            await listener(uri)

    def _prompt(self, name: str) -> tuple[PromptEntry, ContentSource]:
        entry = self.content.prompt(name)
        missing = f"no prompt named {name!r}"
        if entry is None:
            raise NotFound(f"{missing}; list prompts to see what this gateway offers")
        return entry, self._content_source(entry.source_id, missing)

    def _content_source(self, source_id: str | None, missing: str) -> ContentSource:
        source = self._content_sources.get(source_id) if source_id is not None else None
        if source is None:
            raise NotFound(f"{missing}; list resources, templates and prompts to see what this gateway offers")
        return source

    async def _bounded(self, what: str, request: Callable[[], Awaitable[_T]]) -> _T:
        """A request to a source, bounded by the call timeout."""
        timeout = self.config.settings.limits.call_timeout_seconds
        try:
            with anyio.fail_after(timeout):
                return await request()
        except TimeoutError as exc:
            raise CallTimeout(f"{what} did not answer within {timeout:g}s") from exc

    # -- policy ----------------------------------------------------------------------------------

    def decide(self, entry: CatalogEntry, context: CallContext, *, drifted: bool | None = None) -> ModeDecision:
        """The mode of one action for one session (DESIGN.md §4); a drifted one is judged by §5."""
        if drifted is None:
            drifted = self.pins.drift(entry.source_id, entry.action_id) is not None
        current = self._resolve(entry, entry.action.risk, context)
        if not drifted:
            return current
        trusted = self.pins.pinned_definition(entry.source_id, entry.action_id)
        if trusted is None:
            return guard_drift(current, None)
        pinned_risk = risk_of(self._connectors[entry.source_id], entry.action_id, trusted)
        return guard_drift(current, self._resolve(entry, pinned_risk, context))

    def _resolve(self, entry: CatalogEntry, risk: Risk, context: CallContext) -> ModeDecision:
        policy = self.config.policy
        profile = policy.profiles.get(context.profile) if context.profile else None
        return resolve_mode(
            source_id=entry.source_id,
            action_id=entry.action_id,
            risk=risk,
            profile_modes=profile.modes if profile else None,
            org_modes=policy.modes,
        )

    # -- the call pipeline -------------------------------------------------------------------------

    async def call(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        context: CallContext,
        *,
        on_progress: ProgressFn | None = None,
        on_pending: PendingFn | None = None,
        defer: bool = False,
        relay: Relay | None = None,
    ) -> types.CallToolResult:
        """Resolve, validate, decide, record, run and record again. Refusals raise a BastionError.

        For a call that needs approval, `on_pending` runs beside the wait (inline approval on a
        2025-era connection), and `defer` raises AwaitingInput instead of waiting (2026-07-28).
        `relay` receives what the downstream logs or asks while the call runs, as long as this
        call() is waiting for it (a call resumed later by `resume` runs without one).
        """
        arguments = arguments or {}
        if name == INVOCATION_TOOL.name:
            return await self._invocation_status(arguments, context)
        if self._draining:
            raise ConnectorUnavailable("Bastion is shutting down and takes no new calls; retry once it is back")
        entry = self.catalog.get(name)
        if entry is None or entry.action.hidden:
            self._refuse_unknown(name)
        assert entry is not None
        entry.validate_arguments(arguments)
        drift = await self.pins.current_drift(entry.source_id, entry.action_id)
        decision = self.decide(entry, context, drifted=drift is not None)
        invocation = self._new_invocation(entry, arguments, decision, context, drift)
        with self._relaying(invocation.id, relay):
            if not self._rate.admit(context.session_id, time.monotonic()):
                wait = self._rate.retry_after(context.session_id, time.monotonic())
                limit = self.config.settings.limits.invocations_per_minute
                await self._refuse(
                    invocation,
                    RateLimited,
                    f"session over its limit of {limit} invocations per minute; retry in {wait:.0f} s",
                )
            if decision.mode == "deny":
                await self._refuse(invocation, PolicyDenied, f"policy ({decision.source}) denies {entry.key}")
            if decision.mode == "require_approval":
                return await self._hold(entry, invocation, arguments, on_progress, on_pending, defer)
            await self.ledger.record(invocation, ("planned", "approved", "executing"))
            return await self._run_counted(entry, invocation, arguments, Progress(on_progress) if on_progress else None)

    @contextmanager
    def _relaying(self, invocation_id: str, relay: Relay | None) -> Iterator[None]:
        """Keep the call's relay where `_run` finds it, also when the approval desk runs the call."""
        if relay is None:
            yield
            return
        self._relays[invocation_id] = relay
        try:
            yield
        finally:
            self._relays.pop(invocation_id, None)

    def _refuse_unknown(self, name: str) -> NoReturn:
        for source_id in self._disabled:
            namespace = self._connectors[source_id].effective_namespace if source_id in self._connectors else source_id
            if namespace and name.startswith(f"{namespace}__"):
                raise SourceDisabled(f"source {source_id!r} is disabled by policy; remove it from [sources] disabled")
        raise NotFound(f"no tool named {name!r}; list the tools to see what this gateway offers")

    def _new_invocation(
        self,
        entry: CatalogEntry,
        arguments: dict[str, Any],
        decision: ModeDecision,
        context: CallContext,
        drift: list[str] | None,
    ) -> Invocation:
        now = utcnow()
        return Invocation(
            id=new_invocation_id(),
            status="executing",
            policy_key=entry.key,
            tool=entry.name,
            source_id=entry.source_id,
            action_id=entry.action_id,
            risk=entry.action.risk,
            mode=decision.mode,
            mode_source=decision.source,
            fingerprint=entry.action.fingerprints.full,
            session_id=context.session_id,
            profile=context.profile,
            principal=context.principal,
            args=arguments,
            args_hash=args_hash(arguments),
            owner=self.instance_id,
            drift=drift,
            created_at=now,
            updated_at=now,
        )

    async def _refuse(self, invocation: Invocation, error: type[BastionError], reason: str) -> NoReturn:
        refused = invocation.model_copy(
            update={"status": "denied", "error_class": error.error_class, "error_message": reason, "owner": None}
        )
        await self.ledger.record(refused, ("planned", "denied"), {"reason": reason})
        raise error(reason, invocation_id=invocation.id)

    async def _hold(
        self,
        entry: CatalogEntry,
        invocation: Invocation,
        arguments: dict[str, Any],
        on_progress: ProgressFn | None,
        on_pending: PendingFn | None,
        defer: bool,
    ) -> types.CallToolResult:
        """require_approval: pending in the ledger, and the host's call blocks until it is decided."""
        approvals = self.config.settings.approvals
        pending = await self.ledger.count("pending", session_id=invocation.session_id)
        if pending >= approvals.max_pending_per_session:
            await self._refuse(
                invocation,
                PendingLimit,
                f"session already has {pending} invocations waiting for approval (limit "
                f"{approvals.max_pending_per_session}); wait for decisions before asking for more",
            )
        now = utcnow()
        held = invocation.model_copy(
            update={"status": "pending", "expires_at": now + timedelta(seconds=approvals.expiry_seconds)}
        )
        logger.info("invocation %s (%s) waits for approval", held.id, entry.key)
        holding = self.desk.hold(held, entry, arguments, on_progress, on_pending=on_pending, defer=defer)
        return await self._wait_unless_stopping(held.id, holding)

    async def resume(self, invocation_id: str, *, on_progress: ProgressFn | None = None) -> types.CallToolResult:
        """Wait for a held call again (the host answered an inline approval in a new request)."""
        return await self._wait_unless_stopping(invocation_id, self.desk.resume(invocation_id, on_progress))

    def drain(self) -> None:
        """Stop admitting calls (shutdown): from now on `call` refuses with a retriable `connector_unavailable`."""
        self._draining = True

    async def settle(self, grace: float) -> int:
        """Let the running calls end within `grace` seconds, then cancel the rest (each is recorded `unknown` and
        its host answered `unknown_outcome`); returns how many were cancelled. Hosts waiting for an approver are
        answered `unknown_outcome` too: their invocations stay pending."""
        with anyio.move_on_after(grace):
            while self._running:
                await self._call_ended.wait()
        cancelled = len(self._running)
        for scope in [*self._running, *self._waiting]:
            scope.cancel()
        with anyio.move_on_after(5):  # each records its outcome: a ledger write
            while self._running:
                await self._call_ended.wait()
        return cancelled

    async def _run_counted(
        self, entry: CatalogEntry, invocation: Invocation, arguments: dict[str, Any], progress: Progress | None
    ) -> types.CallToolResult:
        """`_run`, known while it runs so a shutdown can wait for it and cancel it (`settle`)."""
        with anyio.CancelScope() as scope:
            self._running.add(scope)
            try:
                return await self._run(entry, invocation, arguments, progress)
            finally:
                self._running.discard(scope)
                self._call_ended.set()
                self._call_ended = anyio.Event()
        raise UnknownOutcome("Bastion stopped while the call ran; its outcome is unknown", invocation_id=invocation.id)

    async def _wait_unless_stopping(
        self, invocation_id: str, waiting: Awaitable[types.CallToolResult]
    ) -> types.CallToolResult:
        """A host's wait for an approver, ended by `settle` (the invocation stays pending, still decidable)."""
        with anyio.CancelScope() as scope:
            self._waiting.add(scope)
            try:
                return await waiting
            finally:
                self._waiting.discard(scope)
        raise UnknownOutcome(
            f"Bastion stopped while invocation {invocation_id} waited for approval; it stays pending: an approver "
            "can still decide it, and bastion__invocation tells its outcome once Bastion is back",
            invocation_id=invocation_id,
        )

    async def _run(
        self, entry: CatalogEntry, invocation: Invocation, arguments: dict[str, Any], progress: Progress | None
    ) -> types.CallToolResult:
        """Run an `executing` invocation and record its outcome (durably `planned` before this is reached)."""
        source = self._sources.get(entry.source_id)
        try:
            if source is None:
                raise ConnectorUnavailable(f"source {entry.source_id!r} is not running")
            result = await source.call(
                entry.action_id,
                arguments,
                correlation_id=invocation.id,
                timeout=self.config.settings.limits.call_timeout_seconds,
                on_progress=progress.relay if progress else None,
                relay=self._relays.get(invocation.id),
            )
        except (CallTimeout, UnknownOutcome) as exc:
            await self._finish(invocation.id, "unknown", error=exc)
            exc.invocation_id = invocation.id
            raise
        except (ConnectorUnavailable, UpstreamError) as exc:
            await self._finish(invocation.id, "failed", error=exc)
            exc.invocation_id = invocation.id
            raise
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._finish(invocation.id, "unknown", error=UnknownOutcome("the call was interrupted"))
            raise
        wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        if result.is_error:
            await self._finish(invocation.id, "failed", result=wire, error=UpstreamError(_error_text(result)))
        else:
            await self._finish(invocation.id, "completed", result=wire)
        return result

    async def _finish(
        self, invocation_id: str, status: Status, *, result: Any = None, error: BastionError | None = None
    ) -> None:
        finished = await self.ledger.finish(
            invocation_id,
            status,
            result=result,
            error_class=error.error_class if error is not None else None,
            error_message=error.message if error is not None else None,
        )
        if not finished:
            logger.warning("invocation %s was no longer executing when its outcome (%s) came", invocation_id, status)

    async def _invocation_status(self, arguments: dict[str, Any], context: CallContext) -> types.CallToolResult:
        """`bastion__invocation`: an invocation's status and redacted result, for the agent that made it."""
        invocation_id = arguments.get("invocation_id")
        if not isinstance(invocation_id, str) or set(arguments) != {"invocation_id"}:
            raise InvalidArguments("bastion__invocation takes exactly one argument: invocation_id (a string)")
        invocation = await self.ledger.get(invocation_id)
        if invocation is None or (context.principal is not None and invocation.principal != context.principal):
            raise NotFound(f"no invocation {invocation_id!r} visible to this session")
        view = invocation.model_dump(
            mode="json",
            include={
                "id", "status", "tool", "policy_key", "mode", "mode_source", "error_class", "error_message",
                "result", "created_at", "updated_at", "expires_at",
            },
        )  # fmt: skip
        summary = f"invocation {invocation.id} ({invocation.tool}) is {invocation.status}"
        if invocation.error_message:
            summary += f": {invocation.error_message}"
        text = summary + "\n" + json.dumps(view.get("result"), ensure_ascii=False)[:4000]
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=view)


def new_invocation_id() -> str:
    """A short id that sorts by creation time: 12 hex digits of milliseconds, then 12 random ones."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def _error_text(result: types.CallToolResult) -> str:
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return " ".join(texts)[:500] or "the tool reported an error"
