"""The Gateway: the one object `server/` and `cli/` use. It owns the sources and what hosts list of them
(`listings`), the pins, the grants, the modes (`bastion.pipeline.modes`) and the call path
(`bastion.pipeline.calls`), and runs them all for the life of an instance (`running`).

Beside tools, the gateway relays its sources' resources, resource templates and prompts through
`content` (a `ContentRouter`, see `bastion.pipeline.content`). Those are not actions: policy gates tools
only, and reading a resource, getting a prompt or completing an argument is never recorded in the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types

from bastion.actions import WireResult
from bastion.config import Config
from bastion.models import CallContext, Grant, ModeDecision, SourceStatus, utcnow
from bastion.pipeline.approvals import PendingFn
from bastion.pipeline.calls import CallPath
from bastion.pipeline.catalog import Catalog, CatalogEntry
from bastion.pipeline.grants import Grants
from bastion.pipeline.instances import Instance
from bastion.pipeline.listings import Listings, ListingsFn
from bastion.pipeline.modes import Modes
from bastion.pipeline.observer import Observers
from bastion.pipeline.pinning import Pins
from bastion.pipeline.seams import Deliver, Ledger
from bastion.pipeline.steps import GatewaySteps
from bastion.sources.seam import ActionSource, HostRequest, ProgressFn

logger = logging.getLogger(__name__)


class Gateway:
    """Owns the sources, the catalog, the policy and the ledger, and runs every call through one call path."""

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
        self.pins = Pins(ledger.pins)
        self.grants = Grants.of(ledger.grants, config)
        """The approvals' standing grants (see bastion.pipeline.grants)."""
        self.pins.on_drift.append(self._revoke_grants)
        self.listings = Listings(config, sources, self.pins)
        """The sources and what hosts list of them (tools, resources, prompts)."""
        self.content = self.listings.content
        """The merged resources, templates and prompts, and the routes back to their sources."""
        self.observers = Observers()
        """Told what happens to every invocation (see bastion.pipeline.observer)."""
        self.modes = Modes(config, self.listings, self.pins, self.grants)
        """What mode each call gets (see bastion.pipeline.modes)."""
        self.calls = CallPath(config, ledger, self.listings, self.pins, self.modes, self.instance, self.observers)
        """The stages every call passes (see bastion.pipeline.calls)."""
        self.held = self.calls.held
        self.steps = GatewaySteps(
            sources=self.listings.sources,
            lookup=self.listings.lookup,
            invocations=self.invocations,
            call_step=self.calls.call_step,
            step_mode=self.calls.step_mode,
        )
        """Runs the steps of composite sources (manifest actions), which depend on the other sources' listings."""
        for composite in self.listings.composites:
            composite.bind(self.steps)

    # -- what hosts list (see bastion.pipeline.listings) -------------------------------------------

    @property
    def catalog(self) -> Catalog:
        return self.listings.catalog

    @property
    def tools(self) -> list[types.Tool]:
        """What `tools/list` answers: the visible catalog plus the gateway's own tool."""
        return self.listings.tools

    def statuses(self) -> list[SourceStatus]:
        """Every configured source's status, disabled ones included, sorted by id."""
        return self.listings.statuses()

    def on_catalog_changed(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Register a coroutine called after every catalog rebuild."""
        self.listings.on_catalog_changed(listener)

    def on_listings_changed(self, listener: ListingsFn) -> None:
        """Register a coroutine called after a rebuild that changed what hosts list (the server notifies them)."""
        self.listings.on_listings_changed(listener)

    async def first_listings(self) -> None:
        """During start-up, wait (bounded) for the sources still listing for the first time."""
        await self.listings.first_listings()

    def hash_args(self, arguments: Any) -> str:
        """The keyed hash of raw arguments the ledger records (binds an answer to the call it answers)."""
        return self.invocations.hash_args(arguments)

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
        await self.held.name_rollbacks(report.unknown)
        await self.pins.load()
        await self.grants.import_approved_file(self.config.directory, now=utcnow())
        async with anyio.create_task_group() as tg:
            await self.listings.start(tg, wait_for_sources=wait_for_sources)
            await tg.start(self.ledger.changes.run, name="ledger-changes")
            await tg.start(self.instance.run, name="instance-lease")
            await tg.start(self.held.run, name="approvals")
            tg.start_soon(self.calls.outcomes.run, name="late-outcomes")
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    # -- policy (see bastion.pipeline.modes) -----------------------------------------------------------

    def mode_of(
        self,
        entry: CatalogEntry,
        context: CallContext,
        *,
        drifted: bool | None = None,
        arguments: Mapping[str, Any] | None = None,
        grant: Grant | None = None,
    ) -> ModeDecision:
        """The mode of one action for one session (see `Modes.of`)."""
        return self.modes.of(entry, context, drifted=drifted, arguments=arguments, grant=grant)

    async def _revoke_grants(self, source_id: str, action_id: str) -> None:
        await self.grants.revoke_drifted(source_id, action_id, now=utcnow())

    # -- calls (see bastion.pipeline.calls) -------------------------------------------------------------

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
        """A host's call through every stage (see `CallPath.call`). Refusals raise a BastionError."""
        return await self.calls.call(
            name, arguments, context, on_progress=on_progress, on_pending=on_pending, defer=defer, relay=relay
        )

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
        """A host's call for the express lane (see `CallPath.call_express`)."""
        return await self.calls.call_express(name, arguments, context, deliver, relay=relay, on_progress=on_progress)

    async def resume(self, invocation_id: str, *, on_progress: ProgressFn | None = None) -> types.CallToolResult:
        """Wait for a held call again (the host answered an inline approval in a new request)."""
        return await self.calls.resume(invocation_id, on_progress=on_progress)

    def drain(self) -> None:
        """Stop admitting calls (shutdown): from now on `call` refuses with a retriable `connector_unavailable`."""
        self.calls.drain()

    async def settle(self, grace: float) -> int:
        """Let the running calls end within `grace` seconds, then cancel the rest (see `CallPath.settle`)."""
        return await self.calls.settle(grace)
