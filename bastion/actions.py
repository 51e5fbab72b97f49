"""What a source declares about each of its actions (DESIGN.md §3-§5): the `ActionSpec`.

Every source (a downstream MCP connector, a provider, a manifest set) computes its specs from its own
configuration; the pipeline names, prices (risk), pins and gates actions from the specs alone, so a new
kind of source plugs in without touching the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import mcp_types as types

from bastion.models import Risk

NewActionPolicy = Literal["trust", "approve"]
"""What a source's action seen for the first time gets: pinned on first use, or held as drifted until accepted."""

DriftListing = Literal["pinned", "current", "hide"]
"""What hosts list of a drifted action until an approver accepts its new definition (DESIGN.md §5): its pinned
(trusted) definition, its current one, or nothing."""

Reconciliation = Literal["manual", "lookup"]
"""How an `unknown` outcome can be settled: only by a person who checks (`manual`), or by asking the source
(`lookup`: it can find the call by its idempotency key or correlation marker)."""

LookedUpOutcome = Literal["completed", "failed"]


@dataclass(frozen=True, slots=True)
class WireResult:
    """A tool result as the JSON object its downstream sent, already checked (its protocol version's shape, the
    tool's output schema) and without the downstream's protocol-internal `_meta` keys: the express lane forwards
    it to the host without modelling it again (issue 17)."""

    data: dict[str, Any]
    checked_at: str | None = None
    """The protocol version whose result shape `data` was checked against (None: a model's dump, valid at all)."""

    @property
    def is_error(self) -> bool:
        return self.data.get("isError") is True


@dataclass(frozen=True, slots=True)
class Found:
    """What a source found when asked what came of one of its calls (an action with `reconcile = "lookup"`).

    `completed`: what the call made was found; `failed`: the source is certain the call never acted (only a
    source whose look-up is authoritative says so; the others answer None, "not found", and the call stays
    unknown)."""

    outcome: LookedUpOutcome
    where: str
    """Where it was found (a URL, an id), or why the source is certain it does not exist."""
    result: Any = None
    """What the call would have returned, read back from what was found (None when it failed)."""


@dataclass(frozen=True, slots=True)
class ExplicitPin:
    """A definition pinned in configuration rather than on first use: drift is any difference from it."""

    fingerprint: str
    structural: str | None = None
    origin: str = "the configuration"
    """Where the pin is written, named in the drift diff so an approver knows what to update."""


@dataclass(frozen=True, slots=True)
class PinPolicy:
    """How the pipeline pins an action's definition (DESIGN.md §5)."""

    new_actions: NewActionPolicy = "trust"
    explicit: ExplicitPin | None = None
    drift_listing: DriftListing | None = None
    """What hosts list while the action is drifted; None: the gateway's default (`[approvals] drift_listing`)."""


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One action of a source, as the source declares it to the pipeline."""

    tool: types.Tool
    """The tool as hosts see it, under the action's own name (the catalog gives it its host name)."""
    risk: Risk
    """Declared by the source (providers, manifests) or derived from the tool's annotations and overrides."""
    namespace: str
    """The prefix of its host name (`<namespace>__<action>`); "" mounts it unprefixed."""
    risk_source: str = "declared"
    """Where `risk` came from (see `bastion.models.RiskDecision`): `declared` unless the source derived it."""
    hidden: bool = False
    """Not listed and not callable by hosts (still pinned)."""
    pin: PinPolicy = PinPolicy()
    idempotency_key: bool = False
    """Whether the action takes the invocation's correlation id as an idempotency key (a retry is then safe)."""
    reconcile: Reconciliation = "manual"
    steps: tuple[tuple[str, str], ...] = ()
    """For a composite action (a manifest action): the (source_id, action_id) of each action it runs. A step that
    policy denies denies it, and a drifted one holds it for an approver; its approval covers the others."""
    approval_required: bool = False
    """The action waits for an approver even where policy would allow it (a manifest's `[approval] required`, a plugin
    action of tier R3/R4). A floor the policy cannot lower: `mode_of` honours it for every action, drifted or not,
    and a composite with such a step is held too."""

    admit: Callable[[Mapping[str, Any]], str | None] | None = None
    """A check of a call's arguments made before anything is recorded or held (a plugin's argument scope): why the
    call is refused (it is recorded `denied`, `policy_denied`), or None to go on."""

    @property
    def action_id(self) -> str:
        return self.tool.name
