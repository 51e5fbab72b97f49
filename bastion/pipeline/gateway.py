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
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any, Literal, NoReturn

import anyio
import mcp_types as types

from bastion.config import Config
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
from bastion.pipeline.catalog import Catalog, CatalogEntry, PreparedAction, prepare_actions
from bastion.pipeline.content import ContentRelay
from bastion.pipeline.instances import Instance
from bastion.pipeline.observer import Observers
from bastion.pipeline.pinning import PinBook
from bastion.pipeline.seams import ActionSource, CompositeSource, ContentSource, Ledger, ProgressFn, Relay
from bastion.pipeline.steps import GatewaySteps
from bastion.policies import RateLimiter, guard_drift, resolve_mode

logger = logging.getLogger(__name__)

LATE_RECORD_SECONDS = 5.0
"""How often an outcome the ledger refused is offered to it again."""

ListingKind = Literal["tools", "resources", "prompts"]
"""What a host re-lists after a change notification (resource templates go with resources)."""

ListingsFn = Callable[[frozenset[ListingKind]], Awaitable[None]]
"""Called after a rebuild with the kinds of listing that changed."""


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
        self.observers = Observers()
        """Told what happens to every invocation (see bastion.pipeline.observer)."""
        self.desk = ApprovalDesk(
            ledger.invocations,
            ledger.changes,
            runner=self._run_counted,
            lookup=self._lookup,
            owner=self.instance_id,
            gone_of=self.instance.gone,
            heartbeat_seconds=config.settings.approvals.heartbeat_seconds,
            observers=self.observers,
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
        self._last_seen: dict[str, str] = {}
        """Host name -> source, for every tool listed since its source was last ready."""
        self._listing_listeners: list[ListingsFn] = []
        self._relays: dict[str, Relay] = {}
        """Invocation id -> the host request its downstream messages go to, while its call() runs."""
        self._unrecorded: dict[str, tuple[Invocation, dict[str, Any]]] = {}
        """Outcomes of calls that ran which the ledger refused; `_record_late` retries them."""
        self._late = anyio.Event()
        self._draining = False
        self._running: set[anyio.CancelScope] = set()
        self._waiting: set[anyio.CancelScope] = set()
        self._call_ended = anyio.Event()
        self._started = anyio.Event()
        """Set once every source has listed or failed once (see `first_listings`)."""
        self._ready_by = -math.inf
        """Until when (`anyio.current_time()`) listings wait for sources still starting."""
        self.steps = GatewaySteps(
            sources=self._sources,
            lookup=self._lookup,
            mode_of=self.mode_of,
            drift=self.pins.drift,
            current_drift=self.pins.current_drift,
            invocations=self.invocations,
            observers=self.observers,
            run=self._run_counted,
            relaying=self._relaying,
            new_id=new_invocation_id,
            owner=self.instance_id,
        )
        """Runs the steps of composite sources (manifest actions), which depend on the other sources' listings."""
        self._composites = [s for s in self._sources.values() if isinstance(s, CompositeSource)]
        for composite in self._composites:
            composite.bind(self.steps)

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
        for composite in self._composites:
            if composite.source_id != source_id:
                composite.observe(source_id)
        self._changed.set()

    def _rebuild(self) -> frozenset[ListingKind]:
        """Rebuild what hosts list; returns the kinds of listing that changed since the last rebuild."""
        self.catalog = Catalog(action for actions in self._prepared.values() for action in actions)
        # Names stay known while their source is down, so a call of one is `connector_unavailable`, not `not_found`.
        ready = {sid for sid, source in self._sources.items() if source.status.state == "ready"}
        self._last_seen = {name: sid for name, sid in self._last_seen.items() if sid not in ready}
        self._last_seen.update((name, entry.source_id) for name, entry in self.catalog.entries.items())
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
            self._note_if_started()
            for listener in self._listeners:
                await listener()
            if changed:
                for listing_listener in self._listing_listeners:
                    await listing_listener(changed)

    def _starting(self) -> list[str]:
        """The sources still in their first start (neither listed nor failed yet)."""
        return [s.source_id for s in self._sources.values() if s.status.state == "starting"]

    def _note_if_started(self) -> None:
        if not self._started.is_set() and not self._starting():
            self._started.set()

    async def first_listings(self) -> None:
        """Wait until every source has listed or failed once, but only during start-up: at most until
        `[server] startup_wait_seconds` after the gateway started, and not at all after that.

        Hosts list as soon as they connect (some only then: they never re-list on `list_changed`), so a
        listing asked in the first seconds waits for the sources that start quickly; a stuck one cannot hold
        it longer than the start-up wait, and its tools are announced with `list_changed` when they come.
        """
        if self._started.is_set():
            return
        remaining = self._ready_by - anyio.current_time()
        if remaining <= 0:
            return
        with anyio.move_on_after(remaining):
            await self._started.wait()

    @asynccontextmanager
    async def running(self, *, wait_for_sources: bool = True) -> AsyncIterator[Gateway]:
        """Take this instance's lease, recover the ledger, start every source, serve, stop.

        With `wait_for_sources` (commands that report on the sources) it yields once every source has listed
        or failed, bounded by the listing timeout. Without (`bastion serve`) it yields at once: hosts are
        served what is ready (see `first_listings`) and told with `list_changed` as the other sources come.
        """
        await self.instance.register()
        report = await self.invocations.recover(self.instance.gone)
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
            self._ready_by = anyio.current_time() + self.config.settings.server.startup_wait_seconds
            if wait_for_sources:
                with anyio.move_on_after(self.config.settings.limits.list_timeout_seconds + 1):
                    while self._starting():
                        await self._changed.wait()
                        self._changed = anyio.Event()
                slow = self._starting()
                if slow:
                    logger.warning("sources still listing after the timeout, omitted for now: %s", ", ".join(slow))
            self._rebuild()
            self._note_if_started()
            tg.start_soon(self._rebuild_loop, name="catalog")
            await tg.start(self.ledger.changes.run, name="ledger-changes")
            await tg.start(self.instance.run, name="instance-lease")
            await tg.start(self.desk.run, name="approvals")
            tg.start_soon(self._record_late, name="late-outcomes")
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    # -- policy ----------------------------------------------------------------------------------

    def mode_of(self, entry: CatalogEntry, context: CallContext, *, drifted: bool | None = None) -> ModeDecision:
        """The mode of one action for one session (DESIGN.md §4); a drifted one is judged by §5."""
        if drifted is None:
            drifted = self.pins.drift(entry.source_id, entry.action_id) is not None
        current = self.steps.compose(entry, context, self._resolve(entry, entry.action.risk, context))
        if not drifted:
            return current
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
        try:
            hashed = self.invocations.hash_args(arguments)
        except ValueError as exc:  # nested too deep to be hashed (and to be relayed): refused before any record
            raise InvalidArguments(f"invalid arguments for {name}: {exc}; send arguments nested less deeply") from exc
        drift = await self.pins.current_drift(entry.source_id, entry.action_id)
        decision = self.mode_of(entry, context, drifted=drift is not None)
        invocation = self._new_invocation(entry, arguments, hashed, decision, context, drift)
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
            await self.invocations.record(invocation, ("planned", "approved", "executing"))
            await self.observers.planned(invocation)
            await self.observers.decided(invocation)
            await self.observers.executing(invocation)
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
        """Why a name is not callable now: its source is disabled, or down (retriable), or nothing offers it."""
        for source_id, source in self._disabled.items():
            if source.namespace and name.startswith(f"{source.namespace}__"):
                raise SourceDisabled(f"source {source_id!r} is disabled by policy; remove it from [sources] disabled")
        owner = self._last_seen.get(name) or next(
            (sid for sid, s in self._sources.items() if s.namespace and name.startswith(f"{s.namespace}__")), None
        )
        status = self._sources[owner].status if owner is not None else None
        if status is not None and status.state == "starting":
            raise ConnectorUnavailable(
                f"source {owner!r} is still starting and has not listed its tools yet; retry once the "
                "host hears tools/list_changed (or list the tools again)"
            )
        if status is not None and status.state != "ready":
            why = f": {status.last_error}" if status.last_error else ""
            raise ConnectorUnavailable(
                f"{name} belongs to source {owner!r}, which is {status.state}{why}; retry once it is back "
                "(bastion connectors list shows its state)"
            )
        for composite in self._composites:
            refusal = composite.refusal(name)
            if refusal is not None:
                raise refusal
        raise NotFound(f"no tool named {name!r}; list the tools to see what this gateway offers")

    def _new_invocation(
        self,
        entry: CatalogEntry,
        arguments: dict[str, Any],
        args_hash: str,
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
            args_hash=args_hash,
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
        await self.observers.planned(refused)
        await self.observers.decided(refused)
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
        """Run an `executing` invocation and record its outcome (durably `planned` before this is reached).

        Whatever happens once the call may have been sent ends recorded as `completed`, `failed` or `unknown`,
        and the host gets the result or a Bastion error class, never an internal error.
        """
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
            await self._finish(invocation, "unknown", error=exc)
            exc.invocation_id = invocation.id
            raise
        except BastionError as exc:  # the source refused or failed it (a manifest action: one of its steps)
            await self._finish(invocation, "failed", error=exc)
            exc.invocation_id = invocation.id
            raise
        except Exception as exc:  # a bug of a source, after the call may have left: its outcome is unknown
            logger.exception("%s failed unexpectedly while running invocation %s", entry.key, invocation.id)
            unknown = UnknownOutcome(
                f"{entry.key} failed inside Bastion while it ran ({type(exc).__name__}); its outcome is unknown: "
                "check the downstream before retrying",
                invocation_id=invocation.id,
            )
            await self._finish(invocation, "unknown", error=unknown)
            raise unknown from exc
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._finish(invocation, "unknown", error=UnknownOutcome("the call was interrupted"))
            raise
        if result.is_error:
            await self._finish(invocation, "failed", result=result, error=UpstreamError(_error_text(result)))
        else:
            await self._finish(invocation, "completed", result=result)
        return result

    async def _finish(
        self,
        invocation: Invocation,
        status: Status,
        *,
        result: types.CallToolResult | None = None,
        error: BastionError | None = None,
    ) -> None:
        """Record the outcome of a call that was sent, and tell the observers. Never raises: the call already
        happened, so its host gets its answer even when the outcome cannot be written now. A result that cannot
        be stored is recorded without it; an outcome the ledger refuses is retried until it takes (`_record_late`)."""
        outcome = {
            "status": status,
            "result": None if result is None else result.model_dump(by_alias=True, mode="json", exclude_none=True),
            "error_class": error.error_class if error is not None else None,
            "error_message": error.message if error is not None else None,
        }
        try:
            finished = await self._record_outcome(invocation.id, outcome)
        except BastionError as exc:
            logger.error(
                "the outcome (%s) of invocation %s could not be recorded (%s); retrying",
                status,
                invocation.id,
                exc.message,
            )
            self._unrecorded[invocation.id] = (invocation, outcome)
            self._late.set()
            return
        if finished:
            await self.observers.finished(invocation.model_copy(update=outcome))

    async def _record_outcome(self, invocation_id: str, outcome: dict[str, Any]) -> bool:
        """executing -> the outcome; False (logged) when it was no longer executing. A result the ledger cannot
        take is left out, saying why, so the outcome itself is never lost."""
        status, error_class, error_message = outcome["status"], outcome["error_class"], outcome["error_message"]
        try:
            finished = await self.invocations.finish(
                invocation_id, status, result=outcome["result"], error_class=error_class, error_message=error_message
            )
        except BastionError:
            raise
        except Exception as exc:  # a result nothing can store (a bug of ours or a pathological value)
            logger.exception("the result of invocation %s cannot be stored; recording the outcome alone", invocation_id)
            outcome["result"] = {"_not_stored": f"the result could not be stored ({type(exc).__name__})"}
            finished = await self.invocations.finish(
                invocation_id, status, result=outcome["result"], error_class=error_class, error_message=error_message
            )
        if not finished:
            logger.warning("invocation %s was no longer executing when its outcome came", invocation_id)
        return finished

    async def _record_late(self) -> None:
        """Until cancelled: retry outcomes the ledger refused (a full disk, say), so no call that ran stays
        `executing`."""
        while True:
            await self._late.wait()
            self._late = anyio.Event()
            while self._unrecorded:
                await anyio.sleep(LATE_RECORD_SECONDS)
                for invocation_id, (invocation, outcome) in list(self._unrecorded.items()):
                    try:
                        finished = await self._record_outcome(invocation_id, outcome)
                    except BastionError:
                        continue
                    del self._unrecorded[invocation_id]
                    logger.warning("the outcome of invocation %s is recorded at last", invocation_id)
                    if finished:
                        await self.observers.finished(invocation.model_copy(update=outcome))

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
        text = summary + "\n" + json.dumps(view.get("result"), ensure_ascii=False)[:4000]
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=view)


def new_invocation_id() -> str:
    """A short id that sorts by creation time: 12 hex digits of milliseconds, then 12 random ones."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def _error_text(result: types.CallToolResult) -> str:
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return " ".join(texts)[:500] or "the tool reported an error"
