"""Drift guard: fingerprints of tool definitions, and tightening a mode when they change."""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from bastion.models import ModeDecision
from bastion.policies.modes import MODE_STRICTNESS

FINGERPRINT_FIELDS: Final = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
"""The wire-form (camelCase) fields of a tool definition that a pin covers."""

_DOC_KEYWORDS: Final = frozenset({"description", "default", "enum"})
"""Schema keywords `structural_fingerprint` strips before it hashes."""

# JSON Schema keywords (2020-12 and draft 4-7) whose value holds subschemas; everything else is data.
_SCHEMA_KEYWORDS: Final = frozenset(
    {
        "items",
        "additionalItems",
        "additionalProperties",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "contentSchema",
    }
)
_SCHEMA_LIST_KEYWORDS: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_MAP_KEYWORDS: Final = frozenset(
    {"properties", "$defs", "definitions", "patternProperties", "dependentSchemas", "dependencies"}
)


class NestingTooDeep(ValueError):
    """A value nests containers too deeply for `canonical_json`: the JSON encoder recurses once per level."""


class NotUnicode(ValueError):
    """A value holds a string that is not Unicode text (a lone UTF-16 surrogate), which `canonical_json(strict=True)`
    refuses: no UTF-8 can carry it, so it can be neither stored nor sent."""


_CANONICAL: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""`json.dumps` with these options builds an encoder on every call; this one is built once."""


def canonical_json(value: Any, *, strict: bool = False) -> bytes:
    """JSON with sorted keys, no whitespace, UTF-8: equal values always give equal bytes.

    Raises `NestingTooDeep` (a ValueError) for a value nested too deeply to encode (about 900 levels from a
    shallow stack, fewer from a deep one), and TypeError for a value that is not JSON, as `json.dumps` does.
    Values parsed from the wire never nest that deeply: the SDK's JSON parser (pydantic-core) refuses a
    message nested deeper than 200 levels. A lone surrogate passes as its UTF-8 bytes (upstream definitions may
    carry them, and hashing them must not crash the catalog), unless `strict`: then it raises `NotUnicode`.
    """
    try:
        text = _CANONICAL.encode(value)
    except RecursionError as exc:
        raise NestingTooDeep(
            "the value nests objects and arrays too deeply to encode; send arguments nested less deeply"
        ) from exc
    try:
        return text.encode("utf-8", "strict" if strict else "surrogatepass")
    except UnicodeEncodeError as exc:
        lone = ", ".join(f"U+{ord(c):04X}" for c in exc.object[exc.start : exc.end])
        raise NotUnicode(
            f"a string holds a lone UTF-16 surrogate ({lone}), which is not Unicode text and cannot be stored or "
            "sent; send valid UTF-8 text"
        ) from None


def _sha256(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def _pinned_fields(definition: Mapping[str, Any]) -> dict[str, Any]:
    return {field: definition.get(field) for field in FINGERPRINT_FIELDS}


def fingerprint(definition: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the pinned fields of a wire-form tool definition (absent = null)."""
    return _sha256(_pinned_fields(definition))


def _strip_docs(schema: Any) -> Any:
    """A copy of a JSON Schema without `description`, `default` and `enum` keywords, at any depth.

    Only keyword positions are stripped: a property *named* `description` stays, and so does data
    such as `const` or `examples`.
    """
    if isinstance(schema, list):
        # The draft 4 array form of `items`.
        return [_strip_docs(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    stripped: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword in _DOC_KEYWORDS:
            continue
        if keyword in _SCHEMA_KEYWORDS:
            stripped[keyword] = _strip_docs(value)
        elif keyword in _SCHEMA_LIST_KEYWORDS and isinstance(value, list):
            stripped[keyword] = [_strip_docs(item) for item in value]
        elif keyword in _SCHEMA_MAP_KEYWORDS and isinstance(value, dict):
            stripped[keyword] = {name: _strip_docs(subschema) for name, subschema in value.items()}
        else:
            stripped[keyword] = value
    return stripped


def structural_fingerprint(definition: Mapping[str, Any]) -> str:
    """The structural hash: name, schemas without documentation keywords, and annotations.

    It changes only when the shape of the tool changes, which tells an approver a change is more than wording.
    """
    return _sha256(
        {
            "name": definition.get("name"),
            "inputSchema": _strip_docs(definition.get("inputSchema")),
            "outputSchema": _strip_docs(definition.get("outputSchema")),
            "annotations": definition.get("annotations"),
        }
    )


class Fingerprints(BaseModel):
    """Both fingerprints of a tool definition, as pinned and as compared."""

    model_config = ConfigDict(frozen=True)

    full: str
    structural: str


def fingerprints(definition: Mapping[str, Any]) -> Fingerprints:
    """The full and structural fingerprints of a wire-form tool definition."""
    return Fingerprints(full=fingerprint(definition), structural=structural_fingerprint(definition))


def is_drifted(pinned: Fingerprints | None, current: Fingerprints) -> bool:
    """Whether a definition changed since it was pinned; an unpinned action has not drifted."""
    if pinned is None:
        return False
    return pinned.full != current.full or pinned.structural != current.structural


def guard(decision: ModeDecision, *, drifted: bool) -> ModeDecision:
    """Tighten `allow` to `require_approval` (source `drift`) for a drifted tool; never loosen anything."""
    if drifted and decision.mode == "allow":
        return ModeDecision(mode="require_approval", source="drift")
    return decision


def guard_drift(current: ModeDecision, pinned: ModeDecision | None) -> ModeDecision:
    """The mode of a drifted action: the stricter of what its current definition earns and what its
    trusted (pinned) definition earned, tightened as drifted; on a tie the `drift` source is reported.

    `pinned` is None when there is no trusted definition to judge by (a new tool held for approval).
    A drifted definition is untrusted, so its annotations can only tighten: flipping `readOnlyHint`
    to true never earns `allow`, and flipping it to false still reads as drift.
    """
    tightened = guard(pinned or current, drifted=True)
    if MODE_STRICTNESS[current.mode] > MODE_STRICTNESS[tightened.mode]:
        return current
    return tightened


def _pretty_lines(definition: Mapping[str, Any]) -> list[str]:
    return json.dumps(_pinned_fields(definition), indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def diff_definitions(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """A unified diff of the pinned fields of two definitions, for the approver deciding a drifted call.

    Empty when the pinned fields are equal.
    """
    return list(
        difflib.unified_diff(_pretty_lines(old), _pretty_lines(new), fromfile="pinned", tofile="current", lineterm="")
    )
