"""The call pipeline and the Gateway that owns catalog, policy and ledger (DESIGN.md §2, §6).

The seams `ActionSource` and `Ledger` are defined here, beside their consumer; connectors/ and
ledger/ satisfy them structurally without importing this module.
"""

from __future__ import annotations

import builtins
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn, Protocol

import anyio
import mcp_types as types

from bastion.catalog import Catalog, CatalogEntry, PreparedAction, prepare_source
from bastion.config import Config, ConnectorConfig
from bastion.errors import (
    BastionError,
    CallTimeout,
    ConnectorUnavailable,
    NotFound,
    PolicyDenied,
    SourceDisabled,
    UnknownOutcome,
    UpstreamError,
)
from bastion.models import (
    CallContext,
    EventKind,
    Invocation,
    InvocationEvent,
    ModeDecision,
    SourceStatus,
    Status,
    utcnow,
)
from bastion.policies import canonical_json, resolve_mode

logger = logging.getLogger(__name__)

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

    async def events(self, invocation_id: str) -> builtins.list[InvocationEvent]: ...


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
        self.instance_id = instance_id or secrets.token_hex(8)
        self._sources = {s.source_id: s for s in sources}
        self._connectors = dict(connectors) if connectors is not None else {c.id: c for c in config.connectors}
        self._disabled = frozenset(config.policy.sources.disabled)
        self._prepared: dict[str, list[PreparedAction]] = {}
        self.catalog = Catalog()
        self._listeners: list[Callable[[], Awaitable[None]]] = []
        self._changed = anyio.Event()

    # -- catalog ---------------------------------------------------------------------------------

    @property
    def sources(self) -> Mapping[str, ActionSource]:
        return self._sources

    def statuses(self) -> list[SourceStatus]:
        """Every configured source's status, disabled ones included, sorted by id."""
        found = [s.status for s in self._sources.values()]
        found += [SourceStatus(source_id=sid, state="disabled") for sid in self._disabled if sid in self._connectors]
        return sorted(found, key=lambda s: s.source_id)

    def on_catalog_changed(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Register a coroutine called after every catalog rebuild (the server notifies hosts)."""
        self._listeners.append(listener)

    async def _source_changed(self, source_id: str) -> None:
        source = self._sources[source_id]
        config = self._connectors[source_id]
        self._prepared[source_id] = prepare_source(config, source.tools())
        self._changed.set()

    def _rebuild(self) -> None:
        self.catalog = Catalog(action for actions in self._prepared.values() for action in actions)

    async def _rebuild_loop(self) -> None:
        """Coalesce change bursts (a start-up of many sources) into few rebuilds and host notifications."""
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            self._rebuild()
            for listener in self._listeners:
                await listener()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Start every source, wait (bounded by the listing timeout) for their first listing, serve, stop."""
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
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    # -- the call pipeline -------------------------------------------------------------------------

    async def call(
        self,
        name: str,
        arguments: dict[str, Any] | None,
        context: CallContext,
        *,
        on_progress: ProgressFn | None = None,
    ) -> types.CallToolResult:
        """Resolve, validate, decide, record, run and record again. Refusals raise a BastionError."""
        arguments = arguments or {}
        entry = self.catalog.get(name)
        if entry is None or entry.action.hidden:
            self._refuse_unknown(name)
        assert entry is not None
        entry.validate_arguments(arguments)
        decision = self.decide(entry, context)
        invocation = self._new_invocation(entry, arguments, decision, context)
        if decision.mode == "deny":
            reason = f"policy {decision.source} denies {entry.key}"
            await self._refuse(invocation, PolicyDenied, reason)
        if decision.mode == "require_approval":
            reason = (
                f"{entry.key} requires approval ({decision.source}), and this Bastion cannot collect approvals yet; "
                f"set its mode to allow in a policy file if it is safe to run unattended"
            )
            await self._refuse(invocation, PolicyDenied, reason)
        return await self._execute(entry, invocation, arguments, on_progress)

    def decide(self, entry: CatalogEntry, context: CallContext) -> ModeDecision:
        """The mode of one action for one session (DESIGN.md §4)."""
        policy = self.config.policy
        profile = policy.profiles.get(context.profile) if context.profile else None
        return resolve_mode(
            source_id=entry.source_id,
            action_id=entry.action_id,
            risk=entry.action.risk,
            profile_modes=profile.modes if profile else None,
            org_modes=policy.modes,
        )

    def _refuse_unknown(self, name: str) -> NoReturn:
        for source_id in self._disabled:
            namespace = self._connectors[source_id].effective_namespace if source_id in self._connectors else source_id
            if namespace and name.startswith(f"{namespace}__"):
                raise SourceDisabled(f"source {source_id!r} is disabled by policy; remove it from [sources] disabled")
        raise NotFound(f"no tool named {name!r}; list the tools to see what this gateway offers")

    def _new_invocation(
        self, entry: CatalogEntry, arguments: dict[str, Any], decision: ModeDecision, context: CallContext
    ) -> Invocation:
        now = utcnow()
        return Invocation(
            id=new_invocation_id(),
            status="planned_placeholder" if False else "executing",
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
            args_hash=hashlib.sha256(canonical_json(arguments)).hexdigest(),
            owner=self.instance_id,
            created_at=now,
            updated_at=now,
        )

    async def _refuse(self, invocation: Invocation, error: type[BastionError], reason: str) -> NoReturn:
        refused = invocation.model_copy(
            update={"status": "denied", "error_class": error.error_class, "error_message": reason, "owner": None}
        )
        await self.ledger.record(refused, ("planned", "denied"), {"reason": reason})
        raise error(reason, invocation_id=invocation.id)

    async def _execute(
        self,
        entry: CatalogEntry,
        invocation: Invocation,
        arguments: dict[str, Any],
        on_progress: ProgressFn | None,
    ) -> types.CallToolResult:
        """The allow path: durable `planned` before anything leaves, then run and record the outcome."""
        await self.ledger.record(invocation, ("planned", "approved", "executing"))
        source = self._sources[entry.source_id]
        try:
            result = await source.call(
                entry.action_id,
                arguments,
                correlation_id=invocation.id,
                timeout=self.config.settings.limits.call_timeout_seconds,
                on_progress=on_progress,
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
        fields: dict[str, Any] = {"result": result}
        executing: tuple[Status, ...] = ("executing",)
        if error is not None:
            fields |= {"error_class": error.error_class, "error_message": error.message}
        await self.ledger.transition(invocation_id, from_statuses=executing, to=status, fields=fields)


def new_invocation_id() -> str:
    """A short id that sorts by creation time: 12 hex digits of milliseconds, then 12 random ones."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def _error_text(result: types.CallToolResult) -> str:
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    return " ".join(texts)[:500] or "the tool reported an error"
