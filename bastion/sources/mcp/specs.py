"""A connector's tools as action specs: the connector file's overrides applied.

Risk of a connector tool, first match wins: the per-tool `risk` in the connector file, the annotations
(`destructiveHint` gives danger, else `readOnlyHint` gives read), the connector's `default_risk`, `write`.
Hidden tools, explicit pins, `pin_new_tools` and `drift_listing` come from the same file, and so do previews
(`previews.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mcp_types as types

from bastion.actions import ActionSpec, ExplicitPin, PinPolicy, PreviewFn
from bastion.config import ConnectorConfig
from bastion.models import Risk, RiskDecision, Tier
from bastion.policies import derive_risk


def action_specs(
    config: ConnectorConfig, tools: Sequence[types.Tool], previews: Mapping[str, PreviewFn] | None = None
) -> list[ActionSpec]:
    """One spec per listed tool, in listing order; `previews`: the preview of each tool that has one."""
    specs = []
    for tool in tools:
        override = config.tools.get(tool.name)
        explicit = override.pin if override is not None else None
        annotations = tool.annotations
        risk = _risk(
            config,
            tool.name,
            read_only_hint=annotations.read_only_hint if annotations else None,
            destructive_hint=annotations.destructive_hint if annotations else None,
        )
        specs.append(
            ActionSpec(
                tool=tool,
                risk=risk.risk,
                risk_source=risk.source,
                tier=_tier(config, tool.name, risk.source),
                namespace=config.effective_namespace,
                hidden=bool(override and override.hidden),
                preview=(previews or {}).get(tool.name),
                pin=PinPolicy(
                    new_actions=config.pin_new_tools,
                    drift_listing=config.drift_listing,
                    explicit=None
                    if explicit is None
                    else ExplicitPin(
                        fingerprint=explicit.fingerprint,
                        structural=explicit.structural,
                        origin=f"connectors/{config.id}.toml",
                    ),
                ),
            )
        )
    return specs


def risk_of(config: ConnectorConfig, action_id: str, definition: Mapping[str, Any]) -> Risk:
    """The risk of `action_id` had it this wire-form (camelCase) definition, e.g. its pinned one."""
    annotations = definition.get("annotations") or {}
    return _risk(
        config,
        action_id,
        read_only_hint=annotations.get("readOnlyHint"),
        destructive_hint=annotations.get("destructiveHint"),
    ).risk


def _tier(config: ConnectorConfig, action_id: str, risk_source: str) -> Tier | None:
    """The tier the risk was configured as, when it came from the connector file (a per-tool `risk`, its
    `default_risk`) and was written as one."""
    override = config.tools.get(action_id)
    if risk_source == "override" and override is not None:
        return override.tier("risk")
    return config.tier("default_risk") if risk_source == "default_risk" else None


def _risk(
    config: ConnectorConfig, action_id: str, *, read_only_hint: bool | None, destructive_hint: bool | None
) -> RiskDecision:
    override = config.tools.get(action_id)
    return derive_risk(
        override=override.risk if override else None,
        read_only_hint=read_only_hint,
        destructive_hint=destructive_hint,
        default_risk=config.default_risk,
    )
