"""The gateway's step runner (`bastion.sources.seam.StepRunner`): the steps of composite actions (manifest
actions), each run through the gateway's pipeline as an invocation of its own, recorded as a child of the
composite's invocation.

It also composes a composite's mode from its steps' (`compose`), so the gateway's `mode_of` stays one pipeline
for every action: a composite never looks safer than its steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import mcp_types as types

from bastion.errors import ConnectorUnavailable, NotFound
from bastion.models import CallContext, Invocation, ModeDecision
from bastion.pipeline.catalog import CatalogEntry
from bastion.pipeline.seams import InvocationStore
from bastion.policies import compose_mode
from bastion.sources.seam import ActionSource, Relay


class ModeOf(Protocol):
    """The gateway's `mode_of`."""

    def __call__(
        self,
        entry: CatalogEntry,
        context: CallContext,
        *,
        drifted: bool | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> ModeDecision: ...


Lookup = Callable[[str, str], CatalogEntry | None]
DriftFn = Callable[[str, str], list[str] | None]


class StepCall(Protocol):
    """The gateway's pipeline for one step (`Gateway.call_step`): the stages of a host's call, as the composite's
    caller."""

    async def __call__(
        self, parent: Invocation, step_id: str, entry: CatalogEntry, arguments: dict[str, Any], relay: Relay | None
    ) -> tuple[str, types.CallToolResult]: ...


class GatewaySteps:
    """Finds the steps of composites in the gateway's catalog, composes their modes, and runs each through the
    gateway's pipeline (`call_step`)."""

    def __init__(
        self,
        *,
        sources: Mapping[str, ActionSource],
        lookup: Lookup,
        mode_of: ModeOf,
        drift: DriftFn,
        invocations: InvocationStore,
        call_step: StepCall,
    ) -> None:
        self._sources = sources
        self._lookup = lookup
        self._mode_of = mode_of
        self._drift = drift
        self._invocations = invocations
        self._call_step = call_step

    def source(self, source_id: str) -> ActionSource | None:
        return self._sources.get(source_id)

    def compose(self, entry: CatalogEntry, context: CallContext, own: ModeDecision) -> ModeDecision:
        """The mode of `entry` given its own resolved mode: for a composite, tightened by its steps (see
        `compose_mode`); any other action's is `own`."""
        spec = entry.action.spec
        if not spec.steps and not spec.approval_required:
            return own
        steps = []
        held: list[str] = []
        for source_id, action_id in spec.steps:
            step = self._lookup(source_id, action_id)
            if step is None:
                continue  # not offered now: the composite is unavailable, and refused if called
            drifted = self._drift(source_id, action_id) is not None
            steps.append((step.key, self._mode_of(step, context, drifted=drifted), drifted))
            if step.action.spec.approval_required:
                held.append(step.key)
        return compose_mode(own, approval_required=spec.approval_required, steps=steps, held_steps=held)

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
        """See `bastion.sources.seam.StepRunner.run_step`."""
        parent = await self._invocations.get(parent_id)
        if parent is None:
            raise NotFound(f"no invocation {parent_id} to run step {step_id!r} for")
        entry = self._entry(step_id, source_id, action_id)
        return await self._call_step(parent, step_id, entry, arguments, relay)

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
