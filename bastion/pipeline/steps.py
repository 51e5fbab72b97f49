"""The gateway's step runner (`bastion.sources.seam.StepRunner`): the steps of composite actions (manifest
actions), each run through the gateway's pipeline as an invocation of its own, recorded as a child of the
composite's invocation.

A composite's mode is composed from its steps' by `bastion.pipeline.modes.Modes.compose`: a composite never looks
safer than its steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import mcp_types as types

from bastion.errors import ConnectorUnavailable, NotFound
from bastion.models import Invocation, ModeDecision
from bastion.pipeline.catalog import CatalogEntry
from bastion.pipeline.seams import InvocationStore
from bastion.sources.seam import ActionSource, HostRequest

Lookup = Callable[[str, str], CatalogEntry | None]


class StepCall(Protocol):
    """The gateway's pipeline for one step (`Gateway.call_step`): the stages of a host's call, as the composite's
    caller."""

    async def __call__(
        self,
        parent: Invocation,
        step_id: str,
        entry: CatalogEntry,
        arguments: dict[str, Any],
        relay: HostRequest | None,
    ) -> tuple[str, types.CallToolResult]: ...


class StepMode(Protocol):
    """The mode the gateway's pipeline would give one step (`CallPath.step_mode`), recording nothing."""

    async def __call__(self, parent: Invocation, entry: CatalogEntry, arguments: dict[str, Any]) -> ModeDecision: ...


class GatewaySteps:
    """Finds the steps of composites in the gateway's catalog and runs each through the gateway's pipeline
    (`call_step`)."""

    def __init__(
        self,
        *,
        sources: Mapping[str, ActionSource],
        lookup: Lookup,
        invocations: InvocationStore,
        call_step: StepCall,
        step_mode: StepMode,
    ) -> None:
        self._sources = sources
        self._step_mode = step_mode
        self._lookup = lookup
        self._invocations = invocations
        self._call_step = call_step

    def source(self, source_id: str) -> ActionSource | None:
        return self._sources.get(source_id)

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
        """See `bastion.sources.seam.StepRunner.run_step`."""
        parent = await self._invocations.get(parent_id)
        if parent is None:
            raise NotFound(f"no invocation {parent_id} to run step {step_id!r} for")
        entry = self._entry(step_id, source_id, action_id)
        return await self._call_step(parent, step_id, entry, arguments, relay)

    async def step_mode(
        self, parent: Invocation, *, step_id: str, source_id: str, action_id: str, arguments: dict[str, Any]
    ) -> str:
        """See `bastion.sources.seam.StepRunner.step_mode`."""
        entry = self._entry(step_id, source_id, action_id)
        decision = await self._step_mode(parent, entry, arguments)
        if decision.mode == "deny":
            return f"deny ({decision.source}): the composite stops at this step"
        if decision.mode == "require_approval" or entry.action.spec.approval_required:
            return f"require_approval ({decision.source}): runs under this approval"
        return f"allow ({decision.source})"

    def _entry(self, step_id: str, source_id: str, action_id: str) -> CatalogEntry:
        """The step's action as hosts may call it; ConnectorUnavailable or NotFound (nothing recorded) when it is not
        offered now."""
        entry = self._lookup(source_id, action_id)
        if entry is not None and not entry.action.hidden:
            return entry
        source = self._sources.get(source_id)
        if source is None:
            raise NotFound(f"step {step_id!r}: no source {source_id!r} is configured and enabled")
        if source.status.state != "ready":
            raise ConnectorUnavailable(f"step {step_id!r}: source {source_id!r} is {source.status.state}")
        raise NotFound(f"step {step_id!r}: source {source_id!r} offers hosts no action {action_id!r}")
