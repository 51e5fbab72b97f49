"""Fingerprints and the drift guard."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.models import MODES, Mode, ModeDecision
from bastion.policies.drift import (
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
from bastion.policies.modes import MODE_STRICTNESS


def _tool() -> dict[str, Any]:
    return {
        "name": "write_note",
        "title": "Write a note",
        "description": "Writes a note to the store.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "The note body", "default": ""},
                "kind": {"type": "string", "enum": ["memo", "todo"]},
                "description": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string", "description": "one tag"}},
            },
            "required": ["text"],
            "$defs": {"when": {"anyOf": [{"type": "string", "description": "iso"}, {"type": "null"}]}},
        },
        "outputSchema": {"type": "object", "properties": {"id": {"type": "string", "description": "note id"}}},
        "annotations": {"readOnlyHint": False, "destructiveHint": False},
        "_meta": {"ignored": True},
    }


def _reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(item) for item in value]
    return value


def test_canonical_json_sorts_keys_drops_whitespace_and_keeps_unicode() -> None:
    assert canonical_json({"b": [1, 2], "a": "é"}) == '{"a":"é","b":[1,2]}'.encode()


def test_canonical_json_refuses_a_value_nested_too_deeply_with_a_value_error() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(NestingTooDeep):
        canonical_json({"arguments": deep})
    assert issubclass(NestingTooDeep, ValueError)


def test_fingerprint_is_sha256_of_the_canonical_pinned_fields_with_absent_as_null() -> None:
    definition = {"name": "t", "inputSchema": {"type": "object"}}
    expected = hashlib.sha256(
        b'{"annotations":null,"description":null,"inputSchema":{"type":"object"},'
        b'"name":"t","outputSchema":null,"title":null}'
    ).hexdigest()
    assert fingerprint(definition) == expected


def test_fingerprints_are_stable_under_key_order() -> None:
    assert fingerprints(_reversed_keys(_tool())) == fingerprints(_tool())


def test_fingerprints_ignore_fields_outside_the_pinned_set() -> None:
    changed = _tool()
    changed["_meta"] = {"other": 1}
    assert fingerprints(changed) == fingerprints(_tool())


def test_a_description_change_changes_the_full_fingerprint_only() -> None:
    changed = _tool()
    changed["description"] = "Deletes every note."
    assert fingerprint(changed) != fingerprint(_tool())
    assert structural_fingerprint(changed) == structural_fingerprint(_tool())


def test_a_read_only_hint_flip_changes_both_fingerprints() -> None:
    changed = _tool()
    changed["annotations"]["readOnlyHint"] = True
    assert fingerprint(changed) != fingerprint(_tool())
    assert structural_fingerprint(changed) != structural_fingerprint(_tool())


def test_a_schema_change_changes_both_fingerprints() -> None:
    changed = _tool()
    changed["inputSchema"]["properties"]["text"]["type"] = "integer"
    assert fingerprint(changed) != fingerprint(_tool())
    assert structural_fingerprint(changed) != structural_fingerprint(_tool())


def test_structural_fingerprint_ignores_description_default_and_enum_at_any_depth() -> None:
    changed = _tool()
    schema = changed["inputSchema"]
    schema["description"] = "top level"
    schema["properties"]["text"]["description"] = "reworded"
    schema["properties"]["text"]["default"] = "hello"
    schema["properties"]["kind"]["enum"] = ["memo", "todo", "idea"]
    schema["properties"]["tags"]["items"]["description"] = "a label"
    schema["$defs"]["when"]["anyOf"][0]["description"] = "ISO 8601"
    changed["outputSchema"]["properties"]["id"]["description"] = "identifier"
    assert structural_fingerprint(changed) == structural_fingerprint(_tool())
    assert fingerprint(changed) != fingerprint(_tool())


def test_structural_fingerprint_keeps_a_property_named_description() -> None:
    changed = _tool()
    del changed["inputSchema"]["properties"]["description"]
    assert structural_fingerprint(changed) != structural_fingerprint(_tool())

    retyped = _tool()
    retyped["inputSchema"]["properties"]["description"]["type"] = "integer"
    assert structural_fingerprint(retyped) != structural_fingerprint(_tool())


def test_structural_fingerprint_keeps_data_that_looks_like_a_keyword() -> None:
    with_const = _tool()
    with_const["inputSchema"]["properties"]["kind"]["const"] = {"description": "a"}
    other_const = copy.deepcopy(with_const)
    other_const["inputSchema"]["properties"]["kind"]["const"] = {"description": "b"}
    assert structural_fingerprint(with_const) != structural_fingerprint(other_const)


def test_an_unpinned_action_has_not_drifted() -> None:
    assert is_drifted(None, fingerprints(_tool())) is False


def test_equal_fingerprints_have_not_drifted() -> None:
    assert is_drifted(fingerprints(_tool()), fingerprints(_reversed_keys(_tool()))) is False


def test_either_fingerprint_differing_counts_as_drift() -> None:
    pinned = fingerprints(_tool())
    assert is_drifted(pinned, pinned.model_copy(update={"full": "0" * 64})) is True
    assert is_drifted(pinned, pinned.model_copy(update={"structural": "0" * 64})) is True


def test_drift_turns_allow_into_require_approval() -> None:
    decision = guard(ModeDecision(mode="allow", source="org"), drifted=True)
    assert decision == ModeDecision(mode="require_approval", source="drift")


def test_drift_keeps_deny_and_require_approval_with_their_source() -> None:
    deny = ModeDecision(mode="deny", source="unknown_mode:x")
    approval = ModeDecision(mode="require_approval", source="profile")
    assert guard(deny, drifted=True) == deny
    assert guard(approval, drifted=True) == approval


def test_no_drift_leaves_the_decision_unchanged() -> None:
    decision = ModeDecision(mode="allow", source="inferred")
    assert guard(decision, drifted=False) == decision


@given(st.sampled_from(MODES), st.text(max_size=20), st.booleans())
def test_guard_never_loosens_a_mode(mode: Mode, source: str, drifted: bool) -> None:
    decision = ModeDecision(mode=mode, source=source)
    guarded = guard(decision, drifted=drifted)
    assert MODE_STRICTNESS[guarded.mode] >= MODE_STRICTNESS[decision.mode]
    if not drifted:
        assert guarded == decision


def test_diff_shows_the_changed_line() -> None:
    changed = _tool()
    changed["description"] = "Deletes every note."
    diff = diff_definitions(_tool(), changed)
    assert diff[:2] == ["--- pinned", "+++ current"]
    assert '-  "description": "Writes a note to the store.",' in diff
    assert '+  "description": "Deletes every note.",' in diff
    assert diff == diff_definitions(_reversed_keys(_tool()), changed)


def test_diff_of_equal_definitions_is_empty() -> None:
    assert diff_definitions(_tool(), _reversed_keys(_tool())) == []


_decisions = st.builds(
    ModeDecision,
    mode=st.sampled_from(["allow", "require_approval", "deny"]),
    source=st.sampled_from(["profile", "org", "inferred", "unknown_mode:x"]),
)


@given(current=_decisions, pinned=st.one_of(st.none(), _decisions))
def test_guard_drift_is_never_looser_than_the_current_or_the_pinned_decision(
    current: ModeDecision, pinned: ModeDecision | None
) -> None:
    guarded = guard_drift(current, pinned)
    assert MODE_STRICTNESS[guarded.mode] >= MODE_STRICTNESS[current.mode]
    if pinned is not None:
        assert MODE_STRICTNESS[guarded.mode] >= MODE_STRICTNESS[pinned.mode]
    assert guarded.mode != "allow"


def test_flipping_read_only_to_false_reads_as_drift() -> None:
    pinned = ModeDecision(mode="allow", source="inferred")
    current = ModeDecision(mode="require_approval", source="inferred")
    assert guard_drift(current, pinned) == ModeDecision(mode="require_approval", source="drift")


def test_a_drifted_tool_that_is_denied_stays_denied() -> None:
    denied = ModeDecision(mode="deny", source="inferred")
    assert guard_drift(denied, ModeDecision(mode="allow", source="org")) == denied
