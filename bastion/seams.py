"""The seams of the pipeline (DESIGN.md §2): what a source and a ledger must offer the gateway.

They are `typing.Protocol`s owned by the pipeline; connectors/ and ledger/ satisfy them structurally
without importing this module.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import mcp_types as types

from bastion.models import (
    EventKind,
    Invocation,
    InvocationEvent,
    Pin,
    Principal,
    RecoveryReport,
    Role,
    SourceStatus,
    Status,
    TokenInfo,
)

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
"""Called with (progress, total, message) for each progress notification of a downstream call."""

ChangeFn = Callable[[str], Awaitable[None]]
"""Called with a source_id whenever that source's listing changed (tools, resources or prompts came,
went or changed)."""

UpdatedFn = Callable[[str], Awaitable[None]]
"""Called with a resource URI whenever a subscribed downstream says that resource was updated."""


class Relay(Protocol):
    """The host request a downstream call is made for (DESIGN.md §3).

    While the call runs, the downstream's log messages and its own requests (sampling, elicitation)
    go back to that request. Implemented by the front door over the host's connection; sources
    satisfy nothing here, they only call it.
    """

    @property
    def log_level(self) -> types.LoggingLevel | None:
        """The lowest level of log message the host wants for this request; None for none at all."""
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
    """A place actions come from: a downstream MCP connector, a provider, a manifest set."""

    @property
    def source_id(self) -> str: ...

    @property
    def status(self) -> SourceStatus: ...

    def tools(self) -> Sequence[types.Tool]:
        """The current listing exactly as the upstream sent it; empty while the source is down."""
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


class Ledger(Protocol):
    """The durable invocation store. Implementations redact and truncate args and results themselves."""

    async def record(
        self, invocation: Invocation, events: Sequence[EventKind], detail: Mapping[str, Any] | None = None
    ) -> None:
        """Insert a new invocation and its first events in one transaction (durable on return)."""
        ...

    async def finish(
        self,
        invocation_id: str,
        to: Status,
        *,
        result: Any = None,
        error_class: str | None = None,
        error_message: str | None = None,
    ) -> bool:
        """executing -> `to` with the call's result and error, and the event; False when it was no longer
        executing."""
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

    async def get(self, invocation_id: str) -> Invocation | None: ...

    async def list(
        self,
        *,
        status: Status | None = None,
        source_id: str | None = None,
        session_id: str | None = None,
        principal: str | None = None,
        limit: int = 100,
    ) -> list[Invocation]:
        """Newest first; each filter given narrows the list."""
        ...

    async def ids_starting_with(
        self, prefix: str, *, principal: str | None = None, limit: int = 10
    ) -> builtins.list[str]:
        """The ids that start with `prefix` (of `principal`'s invocations only, when given), sorted, at most
        `limit`; the id equal to `prefix`, if any, comes first."""
        ...

    async def events(self, invocation_id: str) -> builtins.list[InvocationEvent]: ...

    async def count(self, status: Status | None = None, *, session_id: str | None = None) -> int: ...

    async def decide(
        self, invocation_id: str, *, approve: bool, principal: str | None, note: str | None, now: datetime
    ) -> Invocation:
        """An approver's decision on a pending invocation: `approved` or `denied` (the note is the reason).
        Raises NotFound, ApprovalExpired (pending but past expires_at: it is marked expired), or Conflict
        (no longer pending; the message names its status)."""
        ...

    async def expire_due(self, now: datetime) -> builtins.list[Invocation]:
        """Mark every pending invocation whose expires_at <= now as expired; return them."""
        ...

    async def next_expiry(self) -> datetime | None:
        """The earliest expires_at among pending invocations."""
        ...

    @property
    def commits_seen(self) -> int:
        """How many commits this process has seen (its own, and while `watch` runs, others')."""
        ...

    async def wait_for_change(self, after: int | None = None) -> None:
        """Return after the next commit to the ledger, by this process or (while `watch` runs) any other;
        at once if `after` (a `commits_seen` read earlier) is already behind."""
        ...

    async def watch(self, interval: float = 0.05) -> None:
        """Until cancelled, notice commits made by other processes (and wake `wait_for_change`)."""
        ...

    async def recover(self, instance_alive: Callable[[str], bool]) -> RecoveryReport:
        """At start-up: `executing` invocations whose owner is not alive become `unknown`; report the
        approved ones of dead owners (never started) and how many are pending."""
        ...

    async def claim(self, invocation_id: str, *, owner: str) -> Invocation | None:
        """approved -> executing for exactly one claimer (None for the others)."""
        ...

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

    async def pins(self, source_id: str | None = None) -> builtins.list[Pin]: ...

    async def save_pin(self, pin: Pin) -> None:
        """Insert or replace the pin of (source_id, action_id), drift included."""
        ...

    async def accept_drift(self, *, source_id: str, action_id: str | None, principal: str | None) -> builtins.list[Pin]:
        """Re-pin drifted actions (one, or every drifted one of a source) to their drifted definition."""
        ...
