"""Pins and drift: which actions' definitions changed behind our back.

Pins live in the ledger, keyed by source and upstream tool name, beside the host name each action was given.
Every listing of a source is compared with them: a first sighting is pinned (trust on first use) unless the
action's pin policy asks new actions of a known source to be approved, or pins it explicitly; a changed definition
is recorded as drift, with the diff an approver sees.
Only an approver clears drift (`bastion pins accept`); it is re-checked at call time, so an
acceptance made by another process counts at once, and `refresh` re-reads the drifted pins so that what
hosts list follows an acceptance made anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from bastion.actions import ExplicitPin
from bastion.models import Pin, PinObservation, utcnow
from bastion.pipeline.catalog import PreparedAction
from bastion.pipeline.seams import PinStore
from bastion.policies import Fingerprints, diff_definitions, is_drifted

logger = logging.getLogger(__name__)

FIRST_USE = "first-use"
UNPINNED = PinObservation(fingerprint="", structural="", definition={})
"""The `pinned` side of a new tool that `pin_new_tools = "approve"` holds back until accepted."""


class Pins:
    """The pins of every source, and the diff of each action that currently differs from its pin."""

    def __init__(self, store: PinStore) -> None:
        self._store = store
        self._pins: dict[tuple[str, str], Pin] = {}
        self._drift: dict[tuple[str, str], list[str]] = {}
        self._explicit: set[tuple[str, str]] = set()
        """Actions pinned in configuration: their drift clears only when the configuration changes."""
        self._cleared = False
        """Whether some drift was accepted since the last `refresh` (hosts must be shown the new definition)."""
        self.names: dict[str, tuple[str, str]] = {}
        """Host name -> the action (source_id, action_id) it was given to, as the ledger keeps them."""
        self.on_drift: list[Callable[[str, str], Awaitable[None]]] = []
        """Awaited with (source_id, action_id) when an action newly drifts (its grants are revoked)."""

    async def load(self) -> None:
        self._pins = {(p.source_id, p.action_id): p for p in await self._store.pins()}
        self.names = await self._store.tool_names()

    async def keep_names(self, given: Mapping[str, tuple[str, str]]) -> bool:
        """Remember the host names given now that no action kept yet (see `bastion.policies.assign_tool_names`);
        True when another instance kept one of them for another action first (the names are then re-read)."""
        new = {name: key for name, key in given.items() if name not in self.names}
        if not new:
            return False
        await self._store.keep_tool_names(new, now=utcnow())
        self.names = await self._store.tool_names()
        return any(self.names.get(name) != key for name, key in new.items())

    def pinned_definition(self, source_id: str, action_id: str) -> dict[str, Any] | None:
        """The trusted definition of a drifted action, or None when there is none to go by (a new action held for
        approval; one pinned by fingerprint in configuration)."""
        pin = self._pins.get((source_id, action_id))
        if (
            pin is None
            or pin.pinned is UNPINNED
            or not pin.pinned.definition
            or (source_id, action_id) in self._explicit
        ):
            return None
        return pin.pinned.definition

    def drift(self, source_id: str, action_id: str) -> list[str] | None:
        """The diff (pinned -> current) when the action has drifted, else None."""
        return self._drift.get((source_id, action_id))

    async def current_drift(self, source_id: str, action_id: str) -> list[str] | None:
        """Like `drift`, but re-reads a drifted pin first: an approver may have accepted it since."""
        key = (source_id, action_id)
        if key not in self._drift or key in self._explicit:
            return self._drift.get(key)
        stored = next((p for p in await self._store.pins(source_id) if p.action_id == action_id), None)
        if stored is not None and stored.drift is None:
            self._accepted(stored)
            return None
        return self._drift.get(key)

    async def refresh(self) -> bool:
        """Re-read the pins of drifted actions (an approver may have accepted some, in any process); True when
        drift was accepted since the last refresh, found now or at call time: what hosts list changed. Reads
        nothing while no action is drifted."""
        for source_id in sorted({key[0] for key in self._drift}):
            for stored in await self._store.pins(source_id):
                key = (source_id, stored.action_id)
                if stored.drift is None and key in self._drift and key not in self._explicit:
                    self._accepted(stored)
        cleared, self._cleared = self._cleared, False
        return cleared

    def _accepted(self, pin: Pin) -> None:
        self._pins[(pin.source_id, pin.action_id)] = pin
        self._drift.pop((pin.source_id, pin.action_id), None)
        self._cleared = True

    async def observe(self, source_id: str, actions: Sequence[PreparedAction]) -> None:
        """Compare a fresh listing of one source with its pins; pin, record drift, or clear it."""
        known_source = any(key[0] == source_id for key in self._pins)
        for action in actions:
            key = (source_id, action.action_id)
            self._drift.pop(key, None)
            policy = action.spec.pin
            self._explicit.discard(key)
            if policy.explicit is not None:
                self._explicit.add(key)
                if _differs_from(policy.explicit, action.fingerprints):
                    self._drift[key] = _explicit_pin_diff(policy.explicit, action.fingerprints)
                continue
            current = PinObservation(
                fingerprint=action.fingerprints.full,
                structural=action.fingerprints.structural,
                definition=action.definition,
            )
            pin = self._pins.get(key)
            if pin is None:
                if policy.new_actions == "approve" and known_source:
                    pin = Pin(source_id=source_id, action_id=action.action_id, pinned=UNPINNED, drift=current)
                    logger.warning("new tool %s:%s is held for approval until pinned", source_id, action.action_id)
                else:
                    pin = Pin(source_id=source_id, action_id=action.action_id, pinned=current, pinned_by=FIRST_USE)
                await self._save(pin)
            elif is_drifted(_fingerprints(pin.pinned), action.fingerprints):
                if pin.drift is None or pin.drift.fingerprint != current.fingerprint:
                    logger.warning("tool %s:%s drifted from its pinned definition", source_id, action.action_id)
                    pin = pin.model_copy(update={"drift": current})
                    await self._save(pin)
                    for listener in self.on_drift:
                        await listener(source_id, action.action_id)
            elif pin.drift is not None:
                pin = pin.model_copy(update={"drift": None})  # back to the trusted definition
                await self._save(pin)
            if pin.drift is not None:
                self._drift[key] = diff_definitions(pin.pinned.definition, pin.drift.definition)

    async def _save(self, pin: Pin) -> None:
        await self._store.save_pin(pin)
        self._pins[(pin.source_id, pin.action_id)] = pin


def _fingerprints(observation: PinObservation) -> Fingerprints:
    return Fingerprints(full=observation.fingerprint, structural=observation.structural)


def _differs_from(pin: ExplicitPin, current: Fingerprints) -> bool:
    return pin.fingerprint != current.full or (pin.structural is not None and pin.structural != current.structural)


def _explicit_pin_diff(pin: ExplicitPin, current: Fingerprints) -> list[str]:
    return [
        f"the definition no longer matches the pin in {pin.origin}",
        f"- fingerprint {pin.fingerprint}",
        f"+ fingerprint {current.full}",
        f"+ structural  {current.structural}",
        f"update the pin in {pin.origin} once the new definition is trusted",
    ]
