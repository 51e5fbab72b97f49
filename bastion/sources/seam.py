"""What the pipeline needs of a source of actions, declared once, beneath every kind of source: the protocols a
source satisfies (`ActionSource`, and where it can `WireSource`, `LookupSource`, `ContentSource`,
`CompositeSource`), the step runner a composite is given, and the callbacks a source calls. Kinds satisfy them
structurally, and import the callback types from here rather than restating them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import mcp_types as types

from bastion.actions import ActionSpec, Found, WireResult
from bastion.errors import BastionError
from bastion.models import Invocation, Risk, SourceStatus

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
"""Called with (progress, total, message) for each progress notification of a downstream call."""

ChangeFn = Callable[[str], Awaitable[None]]
"""Called with a source_id whenever that source's listing changed (tools, resources or prompts came,
went or changed)."""

UpdatedFn = Callable[[str], Awaitable[None]]
"""Called with a resource URI whenever a subscribed downstream says that resource was updated."""


class HostRequest(Protocol):
    """The host request a downstream call is made for.

    While the call runs, the downstream's log messages and its own requests (sampling, elicitation)
    go back to that request. Implemented by the host server over the host's connection; sources
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
        relay: HostRequest | None = None,
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
        relay: HostRequest | None = None,
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
        relay: HostRequest | None = None,
    ) -> tuple[str, types.CallToolResult]:
        """Run one step for the invocation `parent_id`: its own invocation id and result. Raises as the gateway's
        call does (NotFound, InvalidArguments and ConnectorUnavailable before anything is recorded; PolicyDenied
        recorded `denied`; the errors of `ActionSource.call` recorded as its outcome), with the step's id."""
        ...

    async def step_mode(
        self, parent: Invocation, *, step_id: str, source_id: str, action_id: str, arguments: dict[str, Any]
    ) -> str:
        """How one step of the composite invocation `parent` (held, not yet recorded) would be treated, in a phrase:
        its mode, the rule it came from, and what that means for the composite (a composite's preview). Records
        nothing; NotFound or ConnectorUnavailable when the step's action is not offered now."""
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
