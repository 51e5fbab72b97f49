"""Risk of an action: a default hint for mode inference, never enforcement by itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ModelWrapValidatorHandler, PrivateAttr, model_validator

from bastion.models import RISK_ALIASES, RISKS, TIERS, Risk, RiskDecision, Tier

_ACCEPTED = ", ".join([*RISKS, *RISK_ALIASES])


def normalize_risk(value: str) -> Risk:
    """Read a configured risk: `read`, `write`, `danger` or the risk tiers `R0`..`R4`, in any case."""
    for risk in RISKS:
        if value.lower() == risk:
            return risk
    tier = tier_of(value)
    if tier is None:
        raise ValueError(f"unknown risk {value!r}: expected one of {_ACCEPTED}")
    return RISK_ALIASES[tier]


def tier_of(value: object) -> Tier | None:
    """The risk tier a configured risk names (`R4`, `r3`), if it names one. A tier maps to one of the three risks
    everywhere risk is used, and is kept beside it for policy to match (`[approvers]`): R3 and R4 are both
    `danger`, yet a policy may ask two approvers of R4 only."""
    if not isinstance(value, str):
        return None
    return next((tier for tier in TIERS if tier == value.upper()), None)


def derive_risk(
    *,
    override: Risk | None,
    read_only_hint: bool | None,
    destructive_hint: bool | None,
    default_risk: Risk | None,
) -> RiskDecision:
    """Risk of a connector tool and where it came from, first match wins: override, destructive hint, read-only
    hint, the connector's default, `write` (sources `override`, `destructiveHint`, `readOnlyHint`, `default_risk`,
    `default`).

    `destructiveHint` is checked before `readOnlyHint` so a contradictory tool is treated as the riskier one.
    """
    if override is not None:
        return RiskDecision(risk=override, source="override")
    if destructive_hint is True:
        return RiskDecision(risk="danger", source="destructiveHint")
    if read_only_hint is True:
        return RiskDecision(risk="read", source="readOnlyHint")
    if default_risk is not None:
        return RiskDecision(risk=default_risk, source="default_risk")
    return RiskDecision(risk="write", source="default")


def declared_risk(definition: Mapping[str, Any]) -> Risk:
    """The risk an action Bastion defines itself (a manifest or plugin action) had with this wire-form definition,
    e.g. its pinned one: its annotations carry it (`destructiveHint` for danger, `readOnlyHint` for read, neither
    for write). So a declared risk is part of what a pin covers: lowering it is drift, judged by the pinned risk."""
    annotations = definition.get("annotations") or {}
    if annotations.get("destructiveHint") is True or not annotations:
        return "danger"
    return "read" if annotations.get("readOnlyHint") is True else "write"


def _configured_risk(value: Any) -> Any:
    """A risk or one of the risk tiers `R0`..`R4`, in any case; anything else is left for pydantic to refuse."""
    try:
        return normalize_risk(value) if isinstance(value, str) else value
    except ValueError:
        return value


RiskSetting = Annotated[Risk, BeforeValidator(_configured_risk)]
"""A risk as configuration and action files write it: `read`, `write`, `danger` or `R0`..`R4`, in any case."""


class KeepsTiers(BaseModel):
    """A model whose risks may be written as tiers (R0-R4): each field in `_TIERED` keeps the tier it was written as
    (`tier(field)`), beside the risk it stands for, so that policy can tell R3 from R4."""

    _TIERED: ClassVar[tuple[str, ...]] = ()
    _tiers: dict[str, Tier] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_tiers(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        model = handler(data)
        if isinstance(data, dict):
            model._tiers = {name: tier for name in cls._TIERED if (tier := tier_of(data.get(name))) is not None}
        return model

    def tier(self, field_name: str) -> Tier | None:
        return self._tiers.get(field_name)
