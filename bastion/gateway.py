"""The call pipeline and the Gateway that owns catalog, policy and ledger (DESIGN.md §2, §6).

SKELETON: the seams below are the contract connectors/ and ledger/ satisfy structurally.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

import mcp_types as types

from bastion.models import EventKind, Invocation, InvocationEvent, SourceStatus, Status

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
"""Called with (progress, total, message) for each progress notification of a downstream call."""

ChangeFn = Callable[[str], Awaitable[None]]
"""Called with a source_id whenever that source's listing changed (tools came, went or changed)."""


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
    ) -> types.CallToolResult:
        """Run one action. Raises ConnectorUnavailable (nothing was sent), CallTimeout or
        UnknownOutcome (sent, outcome unknown) or UpstreamError (the upstream answered with an error)."""
        ...


class Ledger(Protocol):
    """The durable invocation store. Implementations redact and truncate args and results themselves."""

    async def record(
        self, invocation: Invocation, events: Sequence[EventKind], detail: Mapping[str, Any] | None = None
    ) -> None:
        """Insert a new invocation and its first events in one transaction (durable on return)."""
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
        limit: int = 100,
    ) -> list[Invocation]:
        """Newest first."""
        ...

    async def events(self, invocation_id: str) -> list[InvocationEvent]: ...
