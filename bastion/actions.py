"""What a source declares about each of its actions: the `ActionSpec`.

Every source (a downstream MCP connector, a provider, a manifest set) computes its specs from its own
configuration; the pipeline names, prices (risk), pins and gates actions from the specs alone, so a new
kind of source plugs in without touching the pipeline.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import mcp_types as types
from mcp_types import methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from bastion.models import Invocation, Preview, Risk, Tier

NewActionPolicy = Literal["trust", "approve"]
"""What a source's action seen for the first time gets: pinned on first use, or held as drifted until accepted."""

DriftListing = Literal["pinned", "current", "hide"]
"""What hosts list of a drifted action until an approver accepts its new definition: its pinned
(trusted) definition, its current one, or nothing."""

Reconciliation = Literal["manual", "lookup"]
"""How an `unknown` outcome can be settled: only by a person who checks (`manual`), or by asking the source
(`lookup`: it can find the call by its idempotency key or correlation marker)."""

LookedUpOutcome = Literal["completed", "failed"]

PreviewFn = Callable[[Invocation, dict[str, Any]], Awaitable[Preview]]
"""Works out what a held call (its invocation, not yet recorded, and its raw arguments) would do, without doing it:
reads only. Raises a BastionError when it cannot (the approver is then shown `no preview: <why>`)."""


class Unshapeable(ValueError):
    """A tool result that a host of some protocol version cannot receive; the message says why."""


@dataclass(frozen=True, slots=True)
class WireResult:
    """A tool result as the JSON object its downstream sent, already checked (its protocol version's shape, the
    tool's output schema) and without the downstream's protocol-internal `_meta` keys: the express lane forwards
    it to the host without modelling it again."""

    data: dict[str, Any]
    checked_at: str | None = None
    """The protocol version whose result shape `data` was checked against (None: not checked at any)."""

    @property
    def is_error(self) -> bool:
        return self.data.get("isError") is True

    def for_host(self, version: str) -> WireResult:
        """This result as a host speaking `version` must receive it (`shaped_result`); itself when it was checked at
        that version already. Raises Unshapeable."""
        if self.checked_at == version:
            return self
        return WireResult(shaped_result(self.data, version), checked_at=version)


def shaped_result(data: Mapping[str, Any], version: str) -> dict[str, Any]:
    """A tool result of either protocol era (a downstream's, or one Bastion built) as a host speaking `version` must
    receive it: the one place a tool result is fitted to its host.

    Downstreams and hosts of both eras meet here. A 2025-era result has no `resultType`, which 2026-07-28 requires
    (its absence means `complete`), so it is added; then the result is sieved through the version's own result
    shape, as the SDK's server sieves a handler's result. What that shape cannot carry (a 2026-07-28
    `structuredContent` that is not an object, for a 2025-era host) raises Unshapeable, saying what: the result is
    then withheld, never sent broken."""
    if version in MODERN_PROTOCOL_VERSIONS:
        result_type = data.get("resultType")
        if result_type is None:
            data = {**data, "resultType": "complete"}
        elif result_type != "complete":
            raise Unshapeable(f"it is a {result_type!r} result, not a tool result")
    structured = data.get("structuredContent")
    if version not in MODERN_PROTOCOL_VERSIONS and structured is not None and not isinstance(structured, dict):
        raise Unshapeable(
            f"its structuredContent is a JSON {_json_type(structured)}, and MCP {version} carries only an object there"
        )
    try:
        shaped = methods.serialize_server_result("tools/call", version, data)
    except ValidationError as exc:
        raise Unshapeable(_problems(exc)) from None
    except (KeyError, ValueError) as exc:  # a version the SDK's shapes do not know
        raise Unshapeable(f"MCP {version} is a protocol version Bastion cannot shape results for ({exc})") from None
    if "content" not in shaped:  # at 2026-07-28, what is no tool result may pass as the union's input request
        raise Unshapeable("it has no valid content list, so it is not a tool result")
    return shaped


def _problems(exc: ValidationError) -> str:
    """What a result lacks for its shape, without echoing the result (it may hold what must not reach a log)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    # At 2026-07-28 the shape is a union of a tool result and an input request: only the tool result's problems count.
    ours = [error for error in errors if not (error["loc"] and error["loc"][0] == "InputRequiredResult")] or errors
    said = [f"{'.'.join(str(p) for p in error['loc'] if p != 'CallToolResult') or 'the result'}: {error['msg']}"
            for error in ours[:3]]  # fmt: skip
    more = f" (and {len(ours) - 3} more)" if len(ours) > 3 else ""
    return "; ".join(said) + more


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "number"


@dataclass(frozen=True, slots=True)
class Found:
    """What a source found when asked what came of one of its calls (an action with `reconcile = "lookup"`).

    `completed`: what the call made was found; `failed`: the source is certain the call never acted (only a
    source whose look-up is authoritative says so; the others answer None, "not found", and the call stays
    unknown). What was found settles the call only when it is `accepted`: a look-up that finds something carrying
    the call's mark which does not prove the call made it (the mark's key, its creator, its place or its time
    do not fit the call) reports it with the `reason`, and the call stays unknown."""

    outcome: LookedUpOutcome
    where: str
    """Where it was found (a URL, an id), or why the source is certain it does not exist."""
    result: Any = None
    """What the call would have returned, read back from what was found (None when it failed)."""
    creator: str | None = None
    """Who made what was found, as the downstream names them (None when it failed)."""
    created_at: str | None = None
    """When it was made, as the downstream says (None when it failed)."""
    reason: str | None = None
    """Why what was found is no proof that the call made it; None when it is (the call may be settled by it)."""

    @property
    def accepted(self) -> bool:
        return self.reason is None


@dataclass(frozen=True, slots=True)
class ExplicitPin:
    """A definition pinned in configuration rather than on first use: drift is any difference from it."""

    fingerprint: str
    structural: str | None = None
    origin: str = "the configuration"
    """Where the pin is written, named in the drift diff so an approver knows what to update."""


@dataclass(frozen=True, slots=True)
class PinPolicy:
    """How the pipeline pins an action's definition."""

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
    tier: Tier | None = None
    """The risk tier (R0-R4) the risk was configured or declared as, if it was one: for policy to match."""
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

    preview: PreviewFn | None = field(default=None, compare=False)
    """How a call held for an approver is previewed (a file's diff, the request a provider would send, a composite's
    steps, a plugin's dry run); None: the action offers no preview. Made when the call is held, within
    `[approvals] preview_timeout_seconds`."""

    @property
    def action_id(self) -> str:
        return self.tool.name
