"""Schema checks (bastion/schemas.py): jsonschema-rs answers first, but every verdict is the one the Python
`jsonschema` package (the MCP SDK's) gives, with its message."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import best_match
from referencing.exceptions import Unresolvable

from bastion.schemas import SchemaCheck
from tests.downstream import default_tools

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    next(tool.input_schema for tool in default_tools() if tool.name == "shapes"),  # 2020-12 features
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "multipleOf": 3}}},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}},  # format: an annotation
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "additionalProperties": {"type": "boolean"},
    },
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"}}},
]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
INSTANCES = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {},
        optional={
            "name": JSON,
            "at": st.lists(st.integers() | st.text(max_size=2), max_size=3),
            "kind": st.sampled_from(["circle", "square", "oval"]),
            "tags": st.lists(st.sampled_from(["a", "b"]), max_size=3),
            "n": st.integers(min_value=-10, max_value=2**70),
            "when": st.sampled_from(["2026-11-26T12:00:00Z", "not a date"]),
            "code": st.sampled_from(["ABC-1", "abc-1", "ABCD-12"]),
            "flag": JSON,
        },
    ),
)


def _reference(schema: dict[str, Any], instance: Any) -> str | None:
    cls = validators.validator_for(schema, default=Draft202012Validator)
    error = best_match(cls(schema).iter_errors(instance))
    return None if error is None else error.message


@settings(max_examples=400, deadline=None)
@given(schema=st.sampled_from(SCHEMAS), instance=INSTANCES)
def test_every_verdict_and_message_is_the_python_jsonschema_ones(schema: dict[str, Any], instance: Any) -> None:
    error = SchemaCheck(schema).error(instance)
    assert (None if error is None else error.message) == _reference(schema, instance)


def test_a_schema_whose_ref_leaves_the_document_is_never_fetched_and_refused_as_jsonschema_refuses_it() -> None:
    check = SchemaCheck({"type": "object", "properties": {"x": {"$ref": "https://example.com/x.json"}}})
    with pytest.raises(Unresolvable):
        check.error({"x": 1})
    assert check.error({}) is None  # the reference is only followed where the instance has something


def test_an_integer_beyond_64_bits_is_checked_whole() -> None:
    check = SchemaCheck({"type": "object", "properties": {"n": {"type": "integer", "maximum": 2**70}}})
    assert check.error({"n": 2**70}) is None
    error = check.error({"n": 2**70 + 1})
    assert error is not None and "maximum" in error.message
