"""Pure, synchronous policy: tool names, risk, modes and drift. No I/O, no clock."""

from bastion.policies.drift import (
    FINGERPRINT_FIELDS,
    Fingerprints,
    NestingTooDeep,
    canonical_json,
    diff_definitions,
    fingerprint,
    fingerprints,
    guard,
    guard_drift,
    is_drifted,
    structural_fingerprint,
)
from bastion.policies.modes import (
    GRANT_LIFTS,
    MODE_STRICTNESS,
    compose_mode,
    is_mode,
    resolve_mode,
    stricter,
    strictness,
)
from bastion.policies.naming import (
    MAX_TOOL_NAME,
    NameAssignment,
    NameRequest,
    assign_tool_names,
    sanitize,
    tool_name,
)
from bastion.policies.risk import RiskSetting, derive_risk, normalize_risk

__all__ = [
    "FINGERPRINT_FIELDS",
    "GRANT_LIFTS",
    "MAX_TOOL_NAME",
    "MODE_STRICTNESS",
    "Fingerprints",
    "NameAssignment",
    "NameRequest",
    "NestingTooDeep",
    "RiskSetting",
    "assign_tool_names",
    "canonical_json",
    "compose_mode",
    "derive_risk",
    "diff_definitions",
    "fingerprint",
    "fingerprints",
    "guard",
    "guard_drift",
    "is_drifted",
    "is_mode",
    "normalize_risk",
    "resolve_mode",
    "sanitize",
    "stricter",
    "strictness",
    "structural_fingerprint",
    "tool_name",
]
