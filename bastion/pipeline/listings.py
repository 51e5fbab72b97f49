"""What hosts list: the sources, their prepared actions, the merged catalog, and its rebuilds.

Every source runs in the gateway's task group and calls back when its listing changed; the change is prepared
(definitions, fingerprints), checked against the pins, and folded into a new catalog by one rebuild loop that
coalesces bursts (a start-up of many sources). Listeners hear each rebuild; the host server tells hosts which
listings changed. A name that is not callable now is explained: its source is disabled, down or still
starting (retriable), or nothing offers it.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal, NoReturn

import anyio
import mcp_types as types
from anyio.abc import TaskGroup

from bastion.actions import DriftListing
from bastion.config import Config
from bastion.errors import BindingRequired, ConfigError, ConnectorUnavailable, NotFound, SourceDisabled
from bastion.models import SourceStatus
from bastion.pipeline.catalog import Catalog, CatalogEntry, PreparedAction, listed_tool, prepare_actions
from bastion.pipeline.content import ContentRouter
from bastion.pipeline.pinning import Pins
from bastion.sources.seam import ActionSource, CompositeSource, ContentSource

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
"""The gateway's own tool: listed after the catalog, never gated, never recorded (it only reads the ledger)."""


class Listings:
    """The sources of one gateway and what hosts list of them: tools (`catalog`, `tools`) and content."""

    def __init__(self, config: Config, sources: Sequence[ActionSource], pins: Pins) -> None:
        """`sources` are every configured source; those disabled by policy are neither run nor listed."""
        self._config = config
        twice = sorted(sid for sid, n in Counter(s.source_id for s in sources).items() if n > 1)
        if twice:
            raise ConfigError(f"more than one source has the id {', '.join(map(repr, twice))}; give each its own id")
        disabled = frozenset(config.policy.sources.disabled)
        self.sources: Mapping[str, ActionSource] = {s.source_id: s for s in sources if s.source_id not in disabled}
        self._disabled = {s.source_id: s for s in sources if s.source_id in disabled}
        self.composites = [s for s in self.sources.values() if isinstance(s, CompositeSource)]
        """The sources whose actions call the others' (manifest actions): told when another source changes."""
        self._pins = pins
        self._prepared: dict[str, list[PreparedAction]] = {}
        self.catalog = Catalog()
        self.tools: list[types.Tool] = [INVOCATION_TOOL]
        """What `tools/list` answers: the visible catalog plus the gateway's own tool."""
        self.content = ContentRouter(
            {s.source_id: s for s in self.sources.values() if isinstance(s, ContentSource)},
            timeout=config.settings.limits.call_timeout_seconds,
        )
        """The merged resources, templates and prompts, and the routes back to their sources."""
        self._dirty: set[ListingKind] = set()
        self._changed = anyio.Event()
        self._last_seen: dict[str, str] = {}
        """Host name -> source, for every tool listed since its source was last ready."""
        self._listeners: list[Callable[[], Awaitable[None]]] = []
        self._listing_listeners: list[ListingsFn] = []
        self._started = anyio.Event()
        """Set once every source has listed or failed once (see `first_listings`)."""
        self._ready_by = -math.inf
        """Until when (`anyio.current_time()`) listings wait for sources still starting."""

    def statuses(self) -> list[SourceStatus]:
        """Every configured source's status, disabled ones included, sorted by id."""
        found = [s.status for s in self.sources.values()]
        found += [SourceStatus(source_id=sid, state="disabled") for sid in self._disabled]
        return sorted(found, key=lambda s: s.source_id)

    def on_catalog_changed(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Register a coroutine called after every catalog rebuild."""
        self._listeners.append(listener)

    def on_listings_changed(self, listener: ListingsFn) -> None:
        """Register a coroutine called after a rebuild that changed what hosts list (the server notifies them)."""
        self._listing_listeners.append(listener)

    def lookup(self, source_id: str, action_id: str) -> CatalogEntry | None:
        return self.catalog.by_action.get((source_id, action_id))

    def drift_listing(self, action: PreparedAction) -> DriftListing:
        """How a drifted action is listed: its source's choice, else `[approvals] drift_listing`."""
        return action.spec.pin.drift_listing or self._config.settings.approvals.drift_listing

    # -- running ---------------------------------------------------------------------------------------

    async def start(self, tg: TaskGroup, *, wait_for_sources: bool) -> None:
        """Start every source in `tg`; with `wait_for_sources`, return once each has listed or failed (bounded
        by the listing timeout). Then keep the catalog current until `tg` is cancelled."""
        for source in self.sources.values():
            tg.start_soon(source.run, self._source_changed, name=f"source:{source.source_id}")
        self._ready_by = anyio.current_time() + self._config.settings.server.startup_wait_seconds
        if wait_for_sources:
            with anyio.move_on_after(self._config.settings.limits.list_timeout_seconds + 1):
                while self._starting():
                    await self._changed.wait()
                    self._changed = anyio.Event()
            slow = self._starting()
            if slow:
                logger.warning("sources still listing after the timeout, omitted for now: %s", ", ".join(slow))
        starting = self._starting()
        self._rebuild()
        await self._keep_names()
        self._note_if_started(starting)
        tg.start_soon(self._rebuild_loop, name="catalog")
        tg.start_soon(self._follow_pins, name="pins")

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

    def refuse_unknown(self, name: str) -> NoReturn:
        """Why a name is not callable now: its source is disabled, or down or starting (retriable), or nothing
        offers it."""
        for source_id, source in self._disabled.items():
            if source.namespace and name.startswith(f"{source.namespace}__"):
                raise SourceDisabled(f"source {source_id!r} is disabled by policy; remove it from [sources] disabled")
        owner = self._last_seen.get(name) or next(
            (sid for sid, s in self.sources.items() if s.namespace and name.startswith(f"{s.namespace}__")), None
        )
        status = self.sources[owner].status if owner is not None else None
        if status is not None and status.state == "starting":
            raise ConnectorUnavailable(
                f"source {owner!r} is still starting and has not listed its tools yet; retry once the "
                "host hears tools/list_changed (or list the tools again)"
            )
        if status is not None and status.state != "ready":
            why = f": {status.last_error}" if status.last_error else ""
            if status.state == "unavailable":  # it waits for its configuration (a credential): no retry helps
                raise BindingRequired(f"{name} belongs to source {owner!r}, which is unavailable{why}")
            raise ConnectorUnavailable(
                f"{name} belongs to source {owner!r}, which is {status.state}{why}; retry once it is back "
                "(bastion connectors list shows its state)"
            )
        for composite in self.composites:
            refusal = composite.refusal(name)
            if refusal is not None:
                raise refusal
        raise NotFound(f"no tool named {name!r}; list the tools to see what this gateway offers")

    # -- rebuilding ------------------------------------------------------------------------------------

    async def _source_changed(self, source_id: str) -> None:
        """A source (re)listed or went away: prepare its actions and check them against their pins."""
        source = self.sources[source_id]
        prepared = prepare_actions(source_id, source.actions())
        before = self._prepared.get(source_id, [])
        if [a.upstream for a in before] != [a.upstream for a in prepared]:
            self._dirty.add("tools")
        self._prepared[source_id] = prepared
        if self.content.offers(source_id):
            self._dirty.update(self.content.observe(source_id, source.namespace))
        await self._pins.observe(source_id, prepared)
        for composite in self.composites:
            if composite.source_id != source_id:
                composite.observe(source_id)
        self._changed.set()

    def _rebuild(self) -> frozenset[ListingKind]:
        """Rebuild what hosts list; returns the kinds of listing that changed since the last rebuild."""
        actions = (action for actions in self._prepared.values() for action in actions)
        self.catalog = Catalog(actions, self._listed, self._pins.names)
        # Names stay known while their source is down, so a call of one is `connector_unavailable`, not `not_found`.
        ready = {sid for sid, source in self.sources.items() if source.status.state == "ready"}
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
            starting = self._starting()
            changed = self._rebuild()
            await self._keep_names()
            self._note_if_started(starting)
            for listener in self._listeners:
                await listener()
            if changed:
                for listing_listener in self._listing_listeners:
                    await listing_listener(changed)

    async def _keep_names(self) -> None:
        """Keep the names this rebuild gave in the ledger, so they stay with their actions; when another instance
        gave one of them to another action first, rebuild with its names."""
        given = {entry.name: key for key, entry in self.catalog.by_action.items()}
        if await self._pins.keep_names(given):
            self._dirty.add("tools")
            self._changed.set()

    def _starting(self) -> list[str]:
        """The sources still in their first start (neither listed nor failed yet)."""
        return [s.source_id for s in self.sources.values() if s.status.state == "starting"]

    def _note_if_started(self, starting: Sequence[str]) -> None:
        """Listings stop waiting (`first_listings`) once a catalog was built while no source was `starting` (read
        when it was built): a source that lists while the names of a rebuild are kept waits for the next one."""
        if not self._started.is_set() and not starting:
            self._started.set()

    def _listed(self, action: PreparedAction) -> types.Tool | None:
        """What hosts list of an action: a drifted one as `drift_listing` says, until an approver accepts it."""
        return listed_tool(
            action,
            drifted=self._pins.drift(action.source_id, action.action_id) is not None,
            listing=self.drift_listing(action),
            trusted=self._pins.pinned_definition(action.source_id, action.action_id),
        )

    async def _follow_pins(self) -> None:
        """Notice drift accepted anywhere (the CLI, the API, another instance): hosts are then listed the accepted
        definition, and told with `list_changed`, within PIN_POLL_SECONDS."""
        while True:
            await anyio.sleep(PIN_POLL_SECONDS)
            if await self._pins.refresh():
                self._dirty.add("tools")
                self._changed.set()
