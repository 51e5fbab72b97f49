"""The call path: the stages every call passes, a host's, a composite's step, or an approved one `HeldCalls` runs.

Every call: resolve the tool, validate its arguments, resolve the mode (tightened by drift, lifted by a grant where
its scope allows), admit it (the session's rate limit, the action's own check, a deny), record the intent, then
run it, hold it for an approver, or refuse it, and record the outcome, in a span of its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, cast

import anyio
import mcp_types as types

from bastion import tracing
from bastion.actions import Unshapeable, WireResult
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
    UnknownOutcome,
    UpstreamError,
)
from bastion.ledger.limits import ProcessLimits
from bastion.models import Admission, CallContext, Invocation, ModeDecision, RetryWindow, utcnow
from bastion.pipeline.approvals import AwaitingInput, HeldCalls, PendingFn, Progress
from bastion.pipeline.catalog import Catalog, CatalogEntry
from bastion.pipeline.instances import Instance
from bastion.pipeline.listings import INVOCATION_TOOL, Listings
from bastion.pipeline.modes import Modes
from bastion.pipeline.observer import Observers
from bastion.pipeline.outcomes import Outcomes
from bastion.pipeline.pinning import Pins
from bastion.pipeline.previews import preview_call
from bastion.pipeline.seams import Deliver, Ledger, RateLimits
from bastion.pipeline.traces import CallTraces
from bastion.policies import covers_held_steps
from bastion.sources.seam import ActionSource, HostRequest, ProgressFn, WireSource

logger = logging.getLogger(__name__)


class NotExpress(Exception):
    """An express call that needs what only the SDK's host server gives (it is held for an approver): nothing was
    recorded or sent, and the caller serves the request the usual way."""


class CallPath:
    """The one sequence of stages every call passes: a host's (`call`, `call_express`), a composite's step
    (`call_step`) and an approved call `HeldCalls` runs (`run_modelled`): resolve and validate, the mode
    (with drift and grants), admission, then hold, refuse or run, the outcome recorded, the call traced."""

    def __init__(
        self,
        config: Config,
        ledger: Ledger,
        listings: Listings,
        pins: Pins,
        modes: Modes,
        instance: Instance,
        observers: Observers,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.invocations = ledger.invocations
        self.listings = listings
        self.pins = pins
        self.modes = modes
        self.instance_id = instance.id
        self._traces = CallTraces()
        observers.add(self._traces)
        self.outcomes = Outcomes(ledger.invocations, observers)
        self._session_limits = ProcessLimits()
        """The rate limit of the sessions only this process serves (`CallContext.local_session`)."""
        self.held = HeldCalls(
            ledger.invocations,
            ledger.changes,
            runner=self.run_modelled,
            lookup=listings.lookup,
            owner=instance.id,
            gone_of=instance.gone,
            heartbeat_seconds=config.settings.approvals.heartbeat_seconds,
            observers=observers,
            wait_without_progress_seconds=config.settings.approvals.wait_without_progress_seconds,
            config_option=config_hint(config),
        )
        """Holds the calls that wait for an approver, and runs them once approved."""
        self._relays: dict[str, HostRequest] = {}
        """Invocation id -> the host request its downstream messages go to, while its call() runs."""
        self._callers: dict[str, CallContext] = {}
        """Invocation id -> who made the call, while its call() runs (a composite's steps are counted as theirs)."""
        self._draining = False
        self._running: set[anyio.CancelScope] = set()
        self._waiting: set[anyio.CancelScope] = set()
        self._call_ended = anyio.Event()

    @property
    def catalog(self) -> Catalog:
        return self.listings.catalog

    async def call(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        context: CallContext,
        *,
        on_progress: ProgressFn | None = None,
        on_pending: PendingFn | None = None,
        defer: bool = False,
        relay: HostRequest | None = None,
    ) -> types.CallToolResult:
        """Resolve, validate, decide, record, run and record again. Refusals raise a BastionError.

        For a call that needs approval, `on_pending` runs beside the wait (inline approval on a
        2025-era connection), and `defer` raises AwaitingInput instead of waiting (2026-07-28).
        `relay` receives what the downstream logs or asks while the call runs, as long as this
        call() is waiting for it (a call resumed later by `resume` runs without one).
        One span covers the call (`bastion.call <tool>`), a child of the host's trace context, if it sent one.
        """
        with tracing.span(f"bastion.call {name}", not_failures=(AwaitingInput,)) as span:
            result = await self._call(name, arguments, context, span, on_progress, on_pending, defer, relay)
        assert isinstance(result, types.CallToolResult)
        return result

    async def call_express(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        context: CallContext,
        deliver: Deliver,
        *,
        relay: HostRequest | None = None,
        on_progress: ProgressFn | None = None,
    ) -> WireResult:
        """`call` for the express lane: the same pipeline, checks and records, but the result is its JSON,
        forwarded as the downstream sent it where the source can (`WireSource`; a call relaying progress goes the
        usual way). The result of a call that ran is handed to `deliver` (the host's answer) before its outcome is
        recorded, so the recording is not on the host's wait, and comes back too. A call that would
        wait for an approver raises NotExpress before anything is recorded; refusals raise a BastionError, as from
        `call`, and failures after the call was sent are recorded first."""
        with tracing.span(f"bastion.call {name}", not_failures=(NotExpress,)) as span:
            result = await self._call(name, arguments, context, span, on_progress, None, False, relay, deliver=deliver)
        assert isinstance(result, WireResult)
        return result

    async def _call(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        context: CallContext,
        span: tracing.Span,
        on_progress: ProgressFn | None,
        on_pending: PendingFn | None,
        defer: bool,
        relay: HostRequest | None,
        *,
        deliver: Deliver | None = None,
    ) -> types.CallToolResult | WireResult:
        arguments = arguments or {}
        if name == INVOCATION_TOOL.name:
            return await self._invocation_status(arguments, context)
        if self._draining:
            raise ConnectorUnavailable("Bastion is shutting down and takes no new calls; retry once it is back")
        entry = self.catalog.get(name)
        if entry is None or entry.action.hidden:
            self.listings.refuse_unknown(name)
        assert entry is not None
        entry.validate_arguments(arguments)
        hashed = self.invocations.hash_args(arguments)  # refuses what can be neither stored nor sent
        drift = await self.pins.current_drift(entry.source_id, entry.action_id)
        decision = self.modes.of(entry, context, drifted=drift is not None, arguments=arguments)
        decision = await self.modes.granted(entry, context, decision, drifted=drift is not None, arguments=arguments)
        if deliver is not None and decision.mode == "require_approval":
            raise NotExpress(f"{entry.key} waits for an approver")
        invocation = entry.new_invocation(arguments, hashed, decision, context, owner=self.instance_id, drift=drift)
        with self._relaying(invocation.id, relay), self._traces.following(invocation, span):
            self._callers[invocation.id] = context
            try:
                if await self.admit(entry, invocation, arguments, context, runs=decision.mode == "allow"):
                    progress = Progress(on_progress) if on_progress else None
                    return await self._run_counted(entry, invocation, arguments, progress, deliver=deliver)
                return await self._hold(
                    entry, invocation, arguments, on_progress, on_pending, defer, approvers=decision.approvers
                )
            finally:
                del self._callers[invocation.id]

    async def call_step(
        self,
        parent: Invocation,
        step_id: str,
        entry: CatalogEntry,
        arguments: dict[str, Any],
        relay: HostRequest | None,
    ) -> tuple[str, types.CallToolResult]:
        """One step of the composite invocation `parent` (see `bastion.sources.seam.StepRunner.run_step`), through
        the stages of a host's call, as the composite's caller: it counts against the session's rate limit and
        passes the same admission. A step that policy holds for an approver runs only under a composite that was
        held and approved, or that an operator's own entry allows (`covers_held_steps`); a step declared
        `approval_required` only under an approved one. Its span is a child of the composite's."""
        if self._draining:
            raise ConnectorUnavailable(
                f"Bastion is shutting down: step {step_id!r} of invocation {parent.id} was not started"
            )
        entry.validate_arguments(arguments)
        try:
            hashed = self.invocations.hash_args(arguments)
        except InvalidArguments as exc:
            raise InvalidArguments(f"step {step_id!r} ({entry.key}): {exc.message}") from exc
        drift = await self.pins.current_drift(entry.source_id, entry.action_id)
        context = self._callers.get(parent.id) or CallContext(
            session_id=parent.session_id, profile=parent.profile, principal=parent.principal
        )
        decision = self.modes.of(entry, context, drifted=drift is not None, arguments=arguments)
        invocation = entry.new_invocation(
            arguments, hashed, decision, context, owner=self.instance_id, drift=drift, parent_id=parent.id
        )
        detail: dict[str, Any] = {"step": step_id, "parent_id": parent.id}
        with (
            tracing.span(f"bastion.step {entry.key}") as span,
            self._relaying(invocation.id, relay),
            self._traces.following(invocation, span),
        ):
            if decision.mode == "deny":
                reason = f"policy ({decision.source}) denies {entry.key} (step {step_id!r} of invocation {parent.id})"
                await self.outcomes.refuse(invocation, PolicyDenied(reason), detail)
            approved = parent.mode == "require_approval"
            if entry.action.spec.approval_required and not approved:
                reason = (
                    f"{entry.key} never runs without an approver's decision, and invocation {parent.id} was not "
                    f"held for one (step {step_id!r})"
                )
                await self.outcomes.refuse(invocation, PolicyDenied(reason), detail)
            if decision.mode == "require_approval":
                if not (approved or covers_held_steps(ModeDecision(mode=parent.mode, source=parent.mode_source))):
                    reason = (
                        f"{entry.key} waits for an approver ({decision.source}), and invocation {parent.id} was "
                        f"neither approved nor allowed by an operator's entry for it (step {step_id!r})"
                    )
                    await self.outcomes.refuse(invocation, PolicyDenied(reason), detail)
                detail["approval"] = f"covered by invocation {parent.id} ({parent.mode}, {parent.mode_source})"
            await self.admit(entry, invocation, arguments, context, runs=True, detail=detail)
            return invocation.id, await self.run_modelled(entry, invocation, arguments, None)

    async def step_mode(self, parent: Invocation, entry: CatalogEntry, arguments: dict[str, Any]) -> ModeDecision:
        """The mode a step of the composite invocation `parent` would get, as `call_step` resolves it (drift
        included), for the composite's preview: nothing is recorded."""
        drift = await self.pins.current_drift(entry.source_id, entry.action_id)
        context = self._callers.get(parent.id) or CallContext(
            session_id=parent.session_id, profile=parent.profile, principal=parent.principal
        )
        return self.modes.of(entry, context, drifted=drift is not None, arguments=arguments)

    async def admit(
        self,
        entry: CatalogEntry,
        invocation: Invocation,
        arguments: dict[str, Any],
        context: CallContext,
        *,
        runs: bool,
        detail: dict[str, Any] | None = None,
    ) -> bool:
        """The admission every call passes once its mode is resolved, a host's or a composite's step: the session's
        rate limit, the action's own check (`ActionSpec.admit`) and a deny. A call that `runs` now is recorded
        started (`detail` on its event), in the same transaction as its admission where the ledger counts it, and
        True comes back; a held one records nothing yet (False). Refusals are recorded, then raised."""
        # A session other instances may serve is counted in the ledger, against its one budget; one only this
        # process serves is counted here, and writes no count.
        per_minute = self.config.settings.limits.invocations_per_minute
        admission = Admission(context.session_id, per_minute, invocation.created_at)
        in_ledger = None if context.local_session else admission
        admit = entry.action.spec.admit
        refusal = admit(arguments) if admit is not None else None
        if in_ledger is None:
            await self._admit(self._session_limits, invocation, admission, detail)
        if runs and refusal is None:
            # The common call: admitted (in the ledger) and recorded in one transaction, shared with the intents and
            # outcomes of the calls in flight, if any (one commit for many).
            wait = await self.outcomes.start(invocation, detail, admission=in_ledger, may_share=bool(self._running))
            if wait is not None:
                await self.outcomes.refuse(invocation, RateLimited.session_over(admission.per_minute, wait), detail)
            return True
        if in_ledger is not None:
            await self._admit(self.ledger.limits, invocation, admission, detail)
        if invocation.mode == "deny":
            reason = f"policy ({invocation.mode_source}) denies {entry.key}"
            if invocation.drift is not None and self.listings.drift_listing(entry.action) == "hide":
                reason = f"{entry.key} changed since it was trusted; it is withheld until an approver accepts it"
            await self.outcomes.refuse(invocation, PolicyDenied(reason), detail)
        if refusal is not None:
            error = PolicyDenied(f"{entry.key} refused before it ran: {refusal}")
            await self.outcomes.refuse(invocation, error, detail)
        return False

    async def _admit(
        self, limits: RateLimits, invocation: Invocation, admission: Admission, detail: dict[str, Any] | None
    ) -> None:
        """Count the call against its session's rate limit in `limits`; over it, record it refused and raise."""
        wait = await limits.admit(admission.key, per_minute=admission.per_minute, now=admission.now)
        if wait is not None:
            await self.outcomes.refuse(invocation, RateLimited.session_over(admission.per_minute, wait), detail)

    @contextmanager
    def _relaying(self, invocation_id: str, relay: HostRequest | None) -> Iterator[None]:
        """Keep the call's relay where `_run` finds it, also when `HeldCalls` runs the call."""
        if relay is None:
            yield
            return
        self._relays[invocation_id] = relay
        try:
            yield
        finally:
            self._relays.pop(invocation_id, None)

    async def _hold(
        self,
        entry: CatalogEntry,
        invocation: Invocation,
        arguments: dict[str, Any],
        on_progress: ProgressFn | None,
        on_pending: PendingFn | None,
        defer: bool,
        *,
        approvers: int,
    ) -> types.CallToolResult:
        """require_approval: pending in the ledger (needing `approvers` distinct approvers), and the host's call
        blocks until it is decided. A call that retries an earlier held one (its twin) is not recorded: it waits for,
        or gets, what the twin gets."""
        approvals = self.config.settings.approvals
        now = utcnow()
        held = invocation.model_copy(
            update={"status": "pending", "expires_at": now + timedelta(seconds=approvals.expiry_seconds)}
        )
        retries = RetryWindow.before(
            now,
            window_seconds=approvals.retry_window_seconds,
            longest_held_seconds=approvals.expiry_seconds + self.config.settings.limits.call_timeout_seconds,
        )
        logger.info("invocation %s (%s) waits for approval", held.id, entry.key)
        # What the approver sees beside the arguments; bounded, so it can only delay the hold, never prevent it.
        preview = await preview_call(
            entry.action.spec,
            held,
            arguments,
            timeout=approvals.preview_timeout_seconds,
            max_bytes=min(approvals.preview_max_bytes, self.config.settings.ledger.max_result_bytes // 2),
        )
        holding = self.held.hold(
            held,
            entry,
            arguments,
            on_progress,
            limit=approvals.max_pending_per_session,
            on_pending=on_pending,
            defer=defer,
            approvers=approvers,
            preview=preview,
            retries=retries,
        )
        try:
            return await self._wait_unless_stopping(held.id, holding)
        except PendingLimit as refused:
            await self.outcomes.refuse(invocation, PendingLimit(refused.message))

    async def resume(self, invocation_id: str, *, on_progress: ProgressFn | None = None) -> types.CallToolResult:
        """Wait for a held call again (the host answered an inline approval in a new request)."""
        return await self._wait_unless_stopping(invocation_id, self.held.resume(invocation_id, on_progress))

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
        self,
        entry: CatalogEntry,
        invocation: Invocation,
        arguments: dict[str, Any],
        progress: Progress | None,
        *,
        deliver: Deliver | None = None,
    ) -> types.CallToolResult | WireResult:
        """`_run`, known while it runs so a shutdown can wait for it and cancel it (`settle`); in the trace of the
        call that made the invocation, also when `HeldCalls` runs it."""
        with anyio.CancelScope() as scope, self._traces.within(invocation.id):
            self._running.add(scope)
            try:
                return await self._run(entry, invocation, arguments, progress, deliver=deliver)
            finally:
                self._running.discard(scope)
                if self._call_ended.statistics().tasks_waiting:  # `settle` waits: tell it, and start afresh
                    self._call_ended.set()
                    self._call_ended = anyio.Event()
        raise UnknownOutcome("Bastion stopped while the call ran; its outcome is unknown", invocation_id=invocation.id)

    async def run_modelled(
        self, entry: CatalogEntry, invocation: Invocation, arguments: dict[str, Any], progress: Progress | None
    ) -> types.CallToolResult:
        """`_run_counted` for `HeldCalls` and the step runner, which take results as models."""
        result = await self._run_counted(entry, invocation, arguments, progress)
        assert isinstance(result, types.CallToolResult)
        return result

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
        self,
        entry: CatalogEntry,
        invocation: Invocation,
        arguments: dict[str, Any],
        progress: Progress | None,
        *,
        deliver: Deliver | None = None,
    ) -> types.CallToolResult | WireResult:
        """Run an `executing` invocation and record its outcome (durably `planned` before this is reached).

        Whatever happens once the call may have been sent ends recorded as `completed`, `failed` or `unknown`,
        and the host gets the result or a Bastion error class, never an internal error. With `deliver` (the express
        lane) the result is JSON, the source's own where it can (`WireSource`), and it is delivered before its
        outcome is recorded; the outcome is recorded even when delivering fails or is cancelled.
        """
        source = self.listings.sources.get(entry.source_id)
        timeout = self.config.settings.limits.call_timeout_seconds
        relay = self._relays.get(invocation.id)
        try:
            if source is None:
                raise ConnectorUnavailable(f"source {entry.source_id!r} is not running")
            with tracing.span(f"bastion.downstream {entry.key}", kind=tracing.SpanKind.CLIENT) as span:
                if span.is_recording():
                    span.set_attributes(tracing.downstream_attributes(invocation))
                result: types.CallToolResult | WireResult | None = None
                if deliver is not None and progress is None and _answers_wire(source):
                    result = await cast(WireSource, source).call_wire(
                        entry.action_id, arguments, correlation_id=invocation.id, timeout=timeout, relay=relay
                    )
                if result is None:
                    result = await source.call(
                        entry.action_id,
                        arguments,
                        correlation_id=invocation.id,
                        timeout=timeout,
                        on_progress=progress.relay if progress else None,
                        relay=relay,
                    )
                if result.is_error:
                    tracing.fail(span, UpstreamError.error_class)
        except (CallTimeout, UnknownOutcome) as exc:
            await self.outcomes.finish(invocation, "unknown", error=exc)
            exc.invocation_id = invocation.id
            raise
        except BastionError as exc:  # the source refused or failed it (a manifest action: one of its steps)
            await self.outcomes.finish(invocation, "failed", error=exc)
            exc.invocation_id = invocation.id
            raise
        except Exception as exc:  # a bug of a source, after the call may have left: its outcome is unknown
            logger.exception("%s failed unexpectedly while running invocation %s", entry.key, invocation.id)
            unknown = UnknownOutcome(
                f"{entry.key} failed inside Bastion while it ran ({type(exc).__name__}); its outcome is unknown: "
                "check the downstream before retrying",
                invocation_id=invocation.id,
            )
            await self.outcomes.finish(invocation, "unknown", error=unknown)
            raise unknown from exc
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.outcomes.finish(invocation, "unknown", error=UnknownOutcome("the call was interrupted"))
            raise
        error = UpstreamError(_error_text(result)) if result.is_error else None
        answer = await self._answer(entry, invocation, result, relay)
        if deliver is None:
            await self.outcomes.finish(invocation, "failed" if error else "completed", result=result, error=error)
            return result
        delivered = answer or _as_wire(result)
        try:
            await deliver(delivered)
        finally:
            # Answered: with other calls running (this one's own scope is among them), the outcome is recorded off
            # this task, in the next call's commit; alone, at the loop's next turn, here.
            others_run = len(self._running) > 1
            with anyio.CancelScope(shield=True):
                await self.outcomes.finish(
                    invocation, "failed" if error else "completed", result=result, error=error, may_defer=others_run
                )  # the result as its source sent it (the host's copy may be shaped for its version)
        return delivered

    async def _answer(
        self,
        entry: CatalogEntry,
        invocation: Invocation,
        result: types.CallToolResult | WireResult,
        relay: HostRequest | None,
    ) -> WireResult | None:
        """The result shaped for the host that waits for it (its relay's protocol version); None when no host waits
        (a composite's step answers its composite, not a host). A result the host cannot receive is withheld: the call
        is recorded `failed` with the reason, and the host is told the downstream acted."""
        if relay is None or invocation.parent_id is not None:
            return None
        version = relay.protocol_version
        try:
            return _as_wire(result).for_host(version)
        except Unshapeable as exc:
            withheld = UpstreamError(
                f"{entry.key} ran (the downstream acted), but its result cannot be passed on to a host speaking MCP "
                f"{version}: {exc}. The result is withheld (the ledger keeps it); the call is not safe to repeat "
                "blindly",
                invocation_id=invocation.id,
            )
            await self.outcomes.finish(invocation, "failed", result=result, error=withheld)
            raise withheld from exc

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
            summary += f": it {self.held.waiting_for(invocation.id)}"
        text = summary + "\n" + json.dumps(view.get("result"), ensure_ascii=False)[:4000]
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=view)


_WIRE_TYPES: dict[type, bool] = {}
"""Whether a source type is a `WireSource` (a protocol check inspects every member: once per type, not per call)."""


def _answers_wire(source: ActionSource) -> bool:
    kind = type(source)
    known = _WIRE_TYPES.get(kind)
    if known is None:
        known = _WIRE_TYPES[kind] = isinstance(source, WireSource)
    return known


def _as_wire(result: types.CallToolResult | WireResult) -> WireResult:
    if isinstance(result, WireResult):
        return result
    return WireResult(result.model_dump(by_alias=True, mode="json", exclude_none=True))


def _error_text(result: types.CallToolResult | WireResult) -> str:
    if isinstance(result, WireResult):
        content = result.data.get("content")
        texts = [str(c.get("text")) for c in content or () if isinstance(c, dict) and c.get("type") == "text"]
    else:
        texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return " ".join(texts)[:500] or "the tool reported an error"
