"""The seams of the pipeline: what a source and a ledger must offer the gateway.

They are `typing.Protocol`s owned by the pipeline; connectors/ and ledger/ satisfy them structurally
without importing this module. The ledger is split by what each consumer needs: invocations (the call
pipeline and the approval desk), pins (the pin book), tokens (authentication), the change feed (whoever
waits for a decision), instance leases (recovery) and rate limits (the call pipeline).
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import anyio
import mcp_types as types
from anyio.abc import TaskStatus

from bastion.actions import ActionSpec, Found, WireResult
from bastion.errors import BastionError
from bastion.models import (
    Admission,
    AuditCheckpoint,
    AuditReport,
    ChainedEvent,
    Change,
    EventKind,
    Grant,
    Invocation,
    InvocationEvent,
    OutboxItem,
    Pin,
    Principal,
    PruneReport,
    RecoveryReport,
    Risk,
    Role,
    SourceStatus,
    Status,
    TokenInfo,
)

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
"""Called with (progress, total, message) for each progress notification of a downstream call."""

Deliver = Callable[[WireResult], Awaitable[None]]
"""Hands the result of an express call that ran to its host, before its outcome is recorded."""

ChangeFn = Callable[[str], Awaitable[None]]
"""Called with a source_id whenever that source's listing changed (tools, resources or prompts came,
went or changed)."""

UpdatedFn = Callable[[str], Awaitable[None]]
"""Called with a resource URI whenever a subscribed downstream says that resource was updated."""


class Relay(Protocol):
    """The host request a downstream call is made for.

    While the call runs, the downstream's log messages and its own requests (sampling, elicitation)
    go back to that request. Implemented by the front door over the host's connection; sources
    satisfy nothing here, they only call it.
    """

    @property
    def log_level(self) -> types.LoggingLevel | None:
        """The lowest level of log message the host wants for this request; None for none at all."""
        ...

    @property
    def answers(self) -> bool:
        """Whether the host may answer the downstream's questions (sampling, elicitation) during this call."""
        ...

    @property
    def protocol_version(self) -> str:
        """The MCP version the host speaks in this request: the call's result is shaped for it (and withheld,
        recorded `failed`, when it cannot be) before the call's outcome is recorded."""
        ...

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        """Relay one downstream log message (dropped when below `log_level`)."""
        ...

    async def sample(
        self, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        """Ask the host to sample its model; an ErrorData when it cannot or will not."""
        ...

    async def elicit(self, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        """Ask the host's user for input; an ErrorData when the host cannot ask."""
        ...


class ActionSource(Protocol):
    """A place actions come from: a downstream MCP connector, a provider, a manifest set.

    The source declares its actions (`actions()`), computed from its own configuration; the pipeline
    names, pins and gates them from those specs alone.
    """

    @property
    def source_id(self) -> str: ...

    @property
    def status(self) -> SourceStatus: ...

    @property
    def namespace(self) -> str:
        """The prefix of its tools' host names, also while it is down or disabled ("" = unprefixed)."""
        ...

    def actions(self) -> Sequence[ActionSpec]:
        """The current actions; empty while the source is down."""
        ...

    def risk_of(self, action_id: str, definition: Mapping[str, Any]) -> Risk:
        """The risk the source would give `action_id` had it this wire-form definition (drift is judged by the
        stricter of the pinned and the current definition)."""
        ...

    async def run(self, on_change: ChangeFn) -> None:
        """Connect, list, and keep the source alive until cancelled (reconnecting with backoff)."""
        ...

    async def call(
        self,
        action_id: str,
        arguments: dict[str, Any],
        *,
        correlation_id: str,
        timeout: float,
        on_progress: ProgressFn | None = None,
        relay: Relay | None = None,
    ) -> types.CallToolResult:
        """Run one action. Raises ConnectorUnavailable (nothing was sent), CallTimeout or
        UnknownOutcome (sent, outcome unknown) or UpstreamError (the upstream answered with an error).
        `relay` receives what the upstream asks or logs while it runs."""
        ...


@runtime_checkable
class WireSource(Protocol):
    """A source that can also answer a call with the result's JSON as its downstream sent it, checked but not
    modelled (the express lane)."""

    async def call_wire(
        self,
        action_id: str,
        arguments: dict[str, Any],
        *,
        correlation_id: str,
        timeout: float,
        relay: Relay | None = None,
    ) -> WireResult | None:
        """`ActionSource.call` answered as JSON, with the same errors; None, having sent nothing, when this call
        cannot go that way (the pipeline then uses `call`)."""
        ...


@runtime_checkable
class LookupSource(Protocol):
    """A source that can find out what came of one of its calls (`bastion invocations reconcile --check`):
    it looks in its downstream for the call's idempotency key or correlation marker. Only actions whose spec
    declares `reconcile = "lookup"` are asked."""

    async def look_up(self, action_id: str, invocation: Invocation) -> Found | None:
        """What came of `invocation` (a call of `action_id`): Found, or None when nothing was found and the source
        cannot be certain the call did not act (the call then stays unresolved). Reads only; raises the errors of
        `ActionSource.call` (ConnectorUnavailable, UpstreamError, RateLimited...) when it cannot ask."""
        ...


class StepRunner(Protocol):
    """What the gateway gives a composite source (manifest actions) to run its steps: other sources' actions.

    A step is recorded as a child invocation of the composite's invocation (`parent_id`), in its session and under
    its principal, and passes the stages of any call (the rate limit and admission included). Its mode is resolved
    as for any call: `deny` refuses it (recorded `denied`), while `require_approval` runs only when the composite was
    approved or an operator's own entry allowed it (`bastion.policies.covers_held_steps`), else it is refused.
    """

    def source(self, source_id: str) -> ActionSource | None:
        """A configured source that policy does not disable, else None."""
        ...

    async def run_step(
        self,
        parent_id: str,
        *,
        step_id: str,
        source_id: str,
        action_id: str,
        arguments: dict[str, Any],
        relay: Relay | None = None,
    ) -> tuple[str, types.CallToolResult]:
        """Run one step for the invocation `parent_id`: its own invocation id and result. Raises as the gateway's
        call does (NotFound, InvalidArguments and ConnectorUnavailable before anything is recorded; PolicyDenied
        recorded `denied`; the errors of `ActionSource.call` recorded as its outcome), with the step's id."""
        ...


@runtime_checkable
class CompositeSource(Protocol):
    """A source whose actions run other sources' actions (manifest actions): the gateway binds it a step runner and
    tells it whenever another source's listing changed, since its own actions depend on those."""

    @property
    def source_id(self) -> str: ...

    def bind(self, steps: StepRunner) -> None: ...

    def observe(self, source_id: str) -> None:
        """Another source listed, changed or went away."""
        ...

    def refusal(self, name: str) -> BastionError | None:
        """Why a host name of its own that is not listed cannot be called now (disabled, unavailable), if it is
        one of its actions."""
        ...


@runtime_checkable
class ContentSource(Protocol):
    """A source that also offers resources, resource templates and prompts (a downstream MCP server).

    Listings are exactly as the upstream sent them (all pages; empty while down). Results come back
    unchanged but for protocol-internal `_meta` keys. Errors as for `ActionSource.call`; an
    UpstreamError caused by the upstream's own MCP error keeps that error as its `__cause__`.
    """

    @property
    def source_id(self) -> str: ...

    def resources(self) -> Sequence[types.Resource]: ...

    def resource_templates(self) -> Sequence[types.ResourceTemplate]: ...

    def prompts(self) -> Sequence[types.Prompt]: ...

    async def read_resource(self, uri: str) -> types.ReadResourceResult: ...

    async def subscribe(self, uri: str, on_updated: UpdatedFn) -> None:
        """Ask the upstream for updates of `uri` (kept across reconnects until `unsubscribe`)."""
        ...

    async def unsubscribe(self, uri: str) -> None: ...

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult: ...

    async def complete(
        self,
        ref: types.PromptReference | types.ResourceTemplateReference,
        argument: types.CompletionArgument,
        context: types.CompletionContext | None,
    ) -> types.CompleteResult:
        """Argument completion; an empty completion when the upstream offers none."""
        ...


class InvocationStore(Protocol):
    """Invocations and their events. Whatever it is given is stored redacted and truncated."""

    def hash_args(self, arguments: Any) -> str:
        """The keyed hash of raw arguments an invocation is recorded with (never shown to anyone)."""
        ...

    def args_match(self, arguments: Any, stored: str) -> bool:
        """Whether `arguments` are the ones an invocation was recorded with (its `args_hash`)."""
        ...

    async def record(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Mapping[str, Any] | None = None,
        *,
        may_share: bool = False,
    ) -> None:
        """Insert a new invocation and its first events in one transaction (durable on return). `may_share`: other
        calls are in flight, and the write may wait a moment to share one commit with theirs."""
        ...

    async def record_admitted(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Mapping[str, Any] | None = None,
        *,
        admission: Admission,
        may_share: bool = False,
    ) -> float | None:
        """`record`, after admitting the call against its rate limit in the same transaction; when the limit refuses
        it nothing is recorded, and the seconds until one more fits come back (None: recorded)."""
        ...

    async def record_pending(
        self, invocation: Invocation, events: Sequence[EventKind], detail: Mapping[str, Any] | None, *, limit: int
    ) -> int | None:
        """Record a call that waits for approval only if its session has fewer than `limit` pending, counted
        atomically with the insert (across instances). None when recorded; else how many are pending."""
        ...

    async def finish(
        self,
        invocation_id: str,
        to: Status,
        *,
        result: Any = None,
        error_class: str | None = None,
        error_message: str | None = None,
        may_defer: bool = False,
    ) -> bool:
        """executing -> `to` with the call's result and error, and the event; False when it was no longer
        executing. `may_defer`: the call ended while others run, and the write may wait for the next one that
        commits (durable then, or at the latest a moment later; reads of this process see it at once)."""
        ...

    async def transition(
        self,
        invocation_id: str,
        *,
        from_statuses: Collection[Status],
        to: Status,
        event: EventKind | None = None,
        detail: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> Invocation | None:
        """Move an invocation to `to` only if its status is one of `from_statuses`, append the event
        (default: `to`) and set `fields` (result, error_class, error_message, owner, expires_at).
        Returns the updated invocation, or None when the condition did not hold (a conflict)."""
        ...

    async def decide(
        self,
        invocation_id: str,
        *,
        approve: bool,
        principal: str | None,
        note: str | None,
        now: datetime,
        grant: Grant | None = None,
    ) -> Invocation:
        """An approver's decision on a pending invocation: `approved` or `denied` (the note is the reason), and the
        standing `grant` an approval leaves, stored with it (or not at all). Raises NotFound, ApprovalExpired
        (pending but past expires_at: it is marked expired), or Conflict (no longer pending; the message names its
        status). Only `bastion.pipeline.authority` calls it."""
        ...

    async def expire_due(self, now: datetime) -> builtins.list[Invocation]:
        """Mark every pending invocation whose expires_at <= now as expired; return them."""
        ...

    async def next_expiry(self) -> datetime | None:
        """The earliest expires_at among pending invocations."""
        ...

    async def claim(self, invocation_id: str, *, owner: str) -> Invocation | None:
        """approved -> executing for exactly one claimer (None for the others)."""
        ...

    async def recover(self, gone_of: Callable[[Sequence[str]], Awaitable[Collection[str]]]) -> RecoveryReport:
        """`executing` invocations whose owner is gone become `unknown`; report the approved ones of owners that
        are gone (never started) and how many are pending. `gone_of` is asked, once, with the owners found after
        they are read, so an instance that recorded work is judged on a lease it already held."""
        ...

    async def get(self, invocation_id: str) -> Invocation | None: ...

    async def find(self, prefix: str, *, principal: str | None = None, limit: int = 2) -> builtins.list[str]:
        """Ids starting with `prefix` (of `principal`'s invocations only, when given), at most `limit`."""
        ...

    async def list(
        self,
        *,
        status: Status | None = None,
        source_id: str | None = None,
        session_id: str | None = None,
        principal: str | None = None,
        parent_id: str | None = None,
        limit: int = 100,
    ) -> builtins.list[Invocation]:
        """Newest first; each filter given narrows the list (`parent_id`: the steps of a manifest invocation)."""
        ...

    async def events(self, invocation_id: str) -> builtins.list[InvocationEvent]: ...

    async def count(self, status: Status | None = None, *, session_id: str | None = None) -> int: ...


class PinStore(Protocol):
    """The trusted definition of every action and its drift, stored verbatim."""

    async def pins(self, source_id: str | None = None) -> builtins.list[Pin]: ...

    async def save_pin(self, pin: Pin) -> None:
        """Insert or replace the pin of (source_id, action_id), drift included."""
        ...

    async def accept_drift(self, *, source_id: str, action_id: str | None, principal: str | None) -> builtins.list[Pin]:
        """Re-pin drifted actions (one, or every drifted one of a source) to their drifted definition. Only
        `bastion.pipeline.authority` calls it."""
        ...

    async def tool_names(self) -> dict[str, tuple[str, str]]:
        """Every host name given to an action: name -> (source_id, action_id)."""
        ...

    async def keep_tool_names(self, names: Mapping[str, tuple[str, str]], *, now: datetime) -> None:
        """Remember that each name was given to its action; a name already given to one stays with it."""
        ...


class GrantStore(Protocol):
    """Standing approvals (bastion.pipeline.grants): stored with the decision that makes them, never deleted."""

    async def add(self, grant: Grant) -> None:
        """Store a grant made without a decision (imported from an earlier Bastion's file)."""
        ...

    async def covering(
        self, key: str, *, session_id: str, principal: str | None, now: datetime
    ) -> builtins.list[Grant]:
        """The grants standing at `now` on `key` that cover a call in this session by this caller, oldest first."""
        ...

    async def grants(self, *, standing_at: datetime | None = None, limit: int = 200) -> builtins.list[Grant]:
        """Newest first: those standing at `standing_at`, or (None) the last `limit` made, ended or not."""
        ...

    async def revoke(self, grant_id: str, *, by: str, now: datetime) -> Grant:
        """End a standing grant; NotFound when none of that id stands."""
        ...

    async def revoke_key(self, key: str, *, by: str, now: datetime) -> builtins.list[Grant]:
        """End every grant standing on `key`; the grants it ended."""
        ...


class TokenStore(Protocol):
    """Bearer tokens, kept only as the SHA-256 of their secret."""

    async def create_token(self, name: str, *, role: Role, profile: str | None, now: datetime) -> str:
        """Store a new token (only its SHA-256) and return its secret, once. Conflict if the name is taken."""
        ...

    async def tokens(self) -> builtins.list[TokenInfo]: ...

    async def revoke_token(self, name: str, *, now: datetime) -> TokenInfo:
        """Revoke an active token; NotFound if there is no active token of that name."""
        ...

    async def authenticate(self, secret: str) -> Principal | None:
        """The principal of an active token with this secret, else None."""
        ...

    async def has_tokens(self) -> bool:
        """Whether any active token exists (then every HTTP caller must present one)."""
        ...

    async def has_approver_tokens(self) -> bool:
        """Whether an active owner or admin token exists (then local decisions need one too)."""
        ...


class ChangeFeed(Protocol):
    """Every event of the ledger, in id order, as it happens in any process sharing the ledger.

    A waiting call wakes on its own invocation's changes (not on every commit); a stream of events resumes
    from a cursor (an event id). A backend announces through whatever it has (SQLite: polling its file's
    data_version; PostgreSQL: LISTEN/NOTIFY).
    """

    @property
    def cursor(self) -> int:
        """The id of the newest change announced so far: take it before reading what you wait on."""
        ...

    async def next(self, after: int) -> Sequence[Change]:
        """The changes after id `after`, oldest first, waiting for the first. Raises ChangesLost when some are no
        longer kept, or when `after` is beyond every change of the ledger (re-read what you watch, then continue
        from `cursor`)."""
        ...

    async def since(self, after: int, *, limit: int = 1000) -> builtins.list[Change]:
        """At most `limit` changes after id `after`, read from storage (however old)."""
        ...

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled, notice what other processes commit (and do the backend's upkeep)."""
        ...


class InstanceRegistry(Protocol):
    """The Bastion instances sharing a ledger and their leases: one whose lease lapsed is gone."""

    async def renew(self, instance_id: str, *, now: datetime, until: datetime) -> None:
        """Register the instance, or extend its lease, up to `until`."""
        ...

    async def release(self, instance_id: str, *, now: datetime) -> None:
        """End the instance's lease now (it is stopping)."""
        ...

    async def leases(self) -> dict[str, datetime]:
        """Every registered instance and when its lease ends (or ended)."""
        ...


class RateLimits(Protocol):
    """The rate limit counted in the ledger, so every instance sharing it counts against one budget
    per key (a session)."""

    async def admit(self, key: str, *, per_minute: int, now: datetime) -> float | None:
        """Count one admission of `key` at `now`, unless it had `per_minute` in the last minute, atomically across
        instances. None when admitted; else the seconds until one more fits (nothing was counted)."""
        ...


class Outbox(Protocol):
    """Messages for webhooks, kept until delivered: a restart or a receiver that is down loses none.

    One item per (target, event id): enqueuing it again does nothing, so a notifier that re-reads the change feed
    after a restart adds no duplicates. Items are claimed for a while before being sent, so two instances sharing
    the ledger do not send the same one at once.
    """

    async def enqueue(self, target: str, event_id: int, body: str, *, now: datetime) -> bool:
        """Add the message of event `event_id` for `target`, due at once; False when it was there already."""
        ...

    async def last_event(self, target: str) -> int | None:
        """The newest event id enqueued for `target` (None: none ever was)."""
        ...

    async def claim(self, target: str, *, now: datetime, until: datetime, limit: int) -> builtins.list[OutboxItem]:
        """At most `limit` undelivered items of `target` due at `now`, oldest first, each claimed until `until` (due
        again then, unless `delivered` or `retry` says otherwise)."""
        ...

    async def delivered(self, item_id: int, *, now: datetime) -> None:
        """The receiver took it: never sent again."""
        ...

    async def retry(self, item_id: int, *, at: datetime | None, error: str) -> None:
        """A delivery failed with `error`: count the attempt and send it again at `at` (None: give up; it stays in
        the outbox, undelivered, with its last error)."""
        ...

    async def next_due(self, target: str) -> datetime | None:
        """When the earliest undelivered item of `target` is due (None: none is)."""
        ...


class AuditLog(Protocol):
    """The ledger's tamper-evident history (bastion.ledger.chain): each event carries the hash of the one before."""

    async def checkpoint(self) -> AuditCheckpoint | None:
        """Where the latest retention prune cut the chain; None when nothing was pruned."""
        ...

    async def chain(self, after: int, limit: int) -> builtins.list[ChainedEvent]:
        """At most `limit` events after chain position `after`, in chain order."""
        ...

    async def verify(self) -> AuditReport:
        """Check the chain from the checkpoint to its head; the report names the first break."""
        ...

    async def export(self, after: int, limit: int) -> builtins.list[tuple[ChainedEvent, Invocation]]:
        """At most `limit` events with an id above `after` (the change feed's cursor), in id order, each with its
        invocation as stored now (redacted as stored)."""
        ...

    async def prune(self, before: datetime, *, now: datetime) -> PruneReport:
        """Remove the oldest part of the history whose invocations all finished (completed, failed, denied,
        expired) before `before`, never the newest event, with a checkpoint that keeps the rest verifiable."""
        ...


class CommitTimes(Protocol):
    """How long the ledger's writes take to commit: whoever listens is told the seconds of each (`/metrics`)."""

    @property
    def backend(self) -> str:
        """`sqlite` or `postgresql`."""
        ...

    def listen(self, listener: Callable[[float], None]) -> None: ...


class Ledger(Protocol):
    """The durable store, as the stores each consumer takes what it needs from."""

    @property
    def invocations(self) -> InvocationStore: ...

    @property
    def pins(self) -> PinStore: ...

    @property
    def tokens(self) -> TokenStore: ...

    @property
    def grants(self) -> GrantStore: ...

    @property
    def changes(self) -> ChangeFeed: ...

    @property
    def instances(self) -> InstanceRegistry: ...

    @property
    def limits(self) -> RateLimits: ...

    @property
    def outbox(self) -> Outbox: ...

    @property
    def audit(self) -> AuditLog: ...

    @property
    def commits(self) -> CommitTimes: ...
