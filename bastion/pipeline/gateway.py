"""The call pipeline and the Gateway that owns catalog, policy and ledger (DESIGN.md §2, §6).

Every call: resolve the tool, validate its arguments, apply the session's rate limit, resolve the
mode (tightened by drift), record the intent, then run it, hold it for an approver, or refuse it,
and record the outcome.

Beside tools, the gateway relays its sources' resources, resource templates and prompts through
`content` (a `ContentRelay`, see `bastion.pipeline.content`). Those are not actions: policy gates tools
only, and reading a resource, getting a prompt or completing an argument is never recorded in the ledger.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any, Literal, NoReturn

import anyio
import mcp_types as types

from bastion.actions import DriftListing
from bastion.config import Config, config_hint
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
from bastion.pipeline.approvals import ApprovalDesk, PendingFn, Progress
from bastion.pipeline.catalog import Catalog, CatalogEntry, PreparedAction, listed_tool, prepare_actions
from bastion.pipeline.content import ContentRelay
from bastion.pipeline.instances import Instance
from bastion.pipeline.pinning import PinBook
from bastion.pipeline.seams import ActionSource, ContentSource, Ledger, ProgressFn, Relay
from bastion.policies import RateLimiter, guard_drift, resolve_mode

logger = logging.getLogger(__name__)

ListingKind = Literal["tools", "resources", "prompts"]
"""What a host re-lists after a change notification (resource templates go with resources)."""

ListingsFn = Callable[[frozenset[ListingKind]], Awaitable[None]]
"""Called after a rebuild with the kinds of listing that changed."""

PIN_POLL_SECONDS = 1.0
"""How often the pins of drifted actions are re-read: an acceptance reaches what hosts list within this."""


INVOCATION_TOOL = types.Tool(
    name="bastion__invocation",
    title="Look up an invocation",
    description=(
        "Return the status and (redacted) result of an earlier call made through Bastion, by its invocation id. "
        "Use it after a call returned approval_pending or was interrupted while it waited for approval, or to "
        "check on a pending one."
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
        instance_id: str | None = None,
    ) -> None:
        """`sources` are every configured source; those disabled by policy are neither run nor listed."""
        self.config = config
        self.ledger = ledger
        self.invocations = ledger.invocations
        self.instance = Instance(ledger.instances, instance_id)
        self.instance_id = self.instance.id
        disabled = frozenset(config.policy.sources.disabled)
        self._sources = {s.source_id: s for s in sources if s.source_id not in disabled}
        self._disabled = {s.source_id: s for s in sources if s.source_id in disabled}
        self._prepared: dict[str, list[PreparedAction]] = {}
        self.catalog = Catalog()
        self.tools: list[types.Tool] = [INVOCATION_TOOL]
        """What `tools/list` answers: the visible catalog plus the gateway's own tool."""
        self.pins = PinBook(ledger.pins)
        self.desk = ApprovalDesk(
            ledger.invocations,
            ledger.changes,
            runner=self._run_counted,
            lookup=self._lookup,
            owner=self.instance_id,
            liveness=self.instance.liveness,
            heartbeat_seconds=config.settings.approvals.heartbeat_seconds,
            wait_without_progress_seconds=config.settings.approvals.wait_without_progress_seconds,
            config_option=config_hint(config),
        )
        self._rate = RateLimiter(config.settings.limits.invocations_per_minute)
        self._listeners: list[Callable[[], Awaitable[None]]] = []
        self._changed = anyio.Event()
        self.content = ContentRelay(
            {s.source_id: s for s in self._sources.values() if isinstance(s, ContentSource)},
            timeout=config.settings.limits.call_timeout_seconds,
        )
        """The merged resources, templates and prompts, and the routes back to their sources."""
        self._dirty: set[ListingKind] = set()
        self._listing_listeners: list[ListingsFn] = []
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
        found += [SourceStatus(source_id=sid, state="disabled") for sid in self._disabled]
        return sorted(found, key=lambda s: s.source_id)

    def on_catalog_changed(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Register a coroutine called after every catalog rebuild."""
        self._listeners.append(listener)

    def on_listings_changed(self, listener: ListingsFn) -> None:
        """Register a coroutine called after a rebuild that changed what hosts list (the server notifies them)."""
        self._listing_listeners.append(listener)

    def hash_args(self, arguments: Any) -> str:
        """The keyed hash of raw arguments the ledger records (binds an answer to the call it answers)."""
        return self.invocations.hash_args(arguments)

    def _lookup(self, source_id: str, action_id: str) -> CatalogEntry | None:
        return self.catalog.by_action.get((source_id, action_id))

    async def _source_changed(self, source_id: str) -> None:
        """A source (re)listed or went away: prepare its actions and check them against their pins."""
        source = self._sources[source_id]
        prepared = prepare_actions(source_id, source.actions())
        before = self._prepared.get(source_id, [])
        if [a.upstream for a in before] != [a.upstream for a in prepared]:
            self._dirty.add("tools")
        self._prepared[source_id] = prepared
        if self.content.offers(source_id):
            self._dirty.update(self.content.observe(source_id, source.namespace))
        await self.pins.observe(source_id, prepared)
        self._changed.set()

    def _rebuild(self) -> frozenset[ListingKind]:
        """Rebuild what hosts list; returns the kinds of listing that changed since the last rebuild."""
        self.catalog = Catalog((action for actions in self._prepared.values() for action in actions), self._listed)
        self.tools = [*self.catalog.tools, INVOCATION_TOOL]
        self.content.rebuild()
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

    def _listed(self, action: PreparedAction) -> types.Tool | None:
        """What hosts list of an action: a drifted one as `drift_listing` says, until an approver accepts it."""
        return listed_tool(
            action,
            drifted=self.pins.drift(action.source_id, action.action_id) is not None,
            listing=self._drift_listing(action),
            trusted=self.pins.pinned_definition(action.source_id, action.action_id),
        )

    def _drift_listing(self, action: PreparedAction) -> DriftListing:
        return action.spec.pin.drift_listing or self.config.settings.approvals.drift_listing

    async def _follow_pins(self) -> None:
        """Notice drift accepted anywhere (the CLI, the API, another instance): hosts are then listed the accepted
        definition, and told with `list_changed`, within PIN_POLL_SECONDS."""
        while True:
            await anyio.sleep(PIN_POLL_SECONDS)
            if await self.pins.refresh():
                self._dirty.add("tools")
                self._changed.set()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Take this instance's lease, recover the ledger, start every source, wait (bounded) for their first
        listing, serve, stop."""
        await self.instance.register()
        report = await self.invocations.recover(await self.instance.liveness())
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
            tg.start_soon(self._follow_pins, name="pins")
            await tg.start(self.ledger.changes.run, name="ledger-changes")
            await tg.start(self.instance.run, name="instance-lease")
            await tg.start(self.desk.run, name="approvals")
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    # -- policy ----------------------------------------------------------------------------------

    def decide(self, entry: CatalogEntry, context: CallContext, *, drifted: bool | None = None) -> ModeDecision:
        """The mode of one action for one session (DESIGN.md §4); a drifted one is judged by §5."""
        if drifted is None:
            drifted = self.pins.drift(entry.source_id, entry.action_id) is not None
        current = self._resolve(entry, entry.action.risk, context)
        if not drifted:
            return current
        if self._drift_listing(entry.action) == "hide":
            return ModeDecision(mode="deny", source="drift")
        trusted = self.pins.pinned_definition(entry.source_id, entry.action_id)
        if trusted is None:
            return guard_drift(current, None)
        pinned_risk = self._sources[entry.source_id].risk_of(entry.action_id, trusted)
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
                reason = f"policy ({decision.source}) denies {entry.key}"
                if drift is not None and self._drift_listing(entry.action) == "hide":
                    reason = f"{entry.key} changed since it was trusted; it is withheld until an approver accepts it"
                await self._refuse(invocation, PolicyDenied, reason)
            if decision.mode == "require_approval":
                return await self._hold(entry, invocation, arguments, on_progress, on_pending, defer)
            await self.invocations.record(invocation, ("planned", "approved", "executing"))
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
        for source_id, source in self._disabled.items():
            if source.namespace and name.startswith(f"{source.namespace}__"):
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
            args_hash=self.invocations.hash_args(arguments),
            owner=self.instance_id,
            drift=drift,
            created_at=now,
            updated_at=now,
        )

    async def _refuse(self, invocation: Invocation, error: type[BastionError], reason: str) -> NoReturn:
        refused = invocation.model_copy(
            update={"status": "denied", "error_class": error.error_class, "error_message": reason, "owner": None}
        )
        await self.invocations.record(refused, ("planned", "denied"), {"reason": reason})
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
        now = utcnow()
        held = invocation.model_copy(
            update={"status": "pending", "expires_at": now + timedelta(seconds=approvals.expiry_seconds)}
        )
        logger.info("invocation %s (%s) waits for approval", held.id, entry.key)
        holding = self.desk.hold(
            held,
            entry,
            arguments,
            on_progress,
            limit=approvals.max_pending_per_session,
            on_pending=on_pending,
            defer=defer,
        )
        try:
            return await self._wait_unless_stopping(held.id, holding)
        except PendingLimit as refused:
            await self._refuse(invocation, PendingLimit, refused.message)

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
        finished = await self.invocations.finish(
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
        invocation = await self.invocations.get(invocation_id)
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
        elif invocation.status == "pending":
            summary += f": it {self.desk.waiting_for(invocation.id)}"
        text = summary + "\n" + json.dumps(view.get("result"), ensure_ascii=False)[:4000]
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=view)


def new_invocation_id() -> str:
    """A short id that sorts by creation time: 12 hex digits of milliseconds, then 12 random ones."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def _error_text(result: types.CallToolResult) -> str:
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return " ".join(texts)[:500] or "the tool reported an error"
