"""Redaction and truncation are total: deep, wide, huge or odd input never makes them
raise, what they return is valid JSON (under the budget, for what is stored), and a cut says what it cut."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.jsontext import compact
from bastion.ledger.redaction import MAX_DEPTH, REDACTED, Redactor

GHP = "ghp_" + "D33pS3cr3t" * 4


def nested_lists(depth: int, leaf: Any = None) -> Any:
    """`leaf` inside `depth` lists, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nested_dicts(depth: int, leaf: Any = None) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"k": value}
    return value


def depth_of(value: Any) -> int:
    """How many containers deep `value` nests (0 for a scalar), counted without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def stored_texts(redactor: Redactor, value: Any) -> Iterator[tuple[str, str]]:
    """(method, JSON text) for what each public method returns, in the compact form the ledger stores; each must be
    strict JSON (no NaN, which the standard library's encoder refuses here)."""
    yield "scrub_json", redactor.scrub_json(value)
    for method in ("scrub", "truncate", "redact"):
        returned = getattr(redactor, method)(value)
        json.dumps(returned, allow_nan=False)
        yield method, compact(returned)


ODD_VALUES: dict[str, Any] = {
    "a list nested 100000 deep": nested_lists(100_000),
    "a dict nested 5000 deep": nested_dicts(5_000),
    "JSON text nested 600 deep": "[" * 600 + "]" * 600,
    "JSON text nested 100000 deep": "[" * 100_000 + "]" * 100_000,
    "deep JSON text under a key": {"text": '{"a":' * 5_000 + "1" + "}" * 5_000},
    "NaN and infinities": {"nan": float("nan"), "inf": [float("inf"), float("-inf")]},
    "an integer too long for text": 10**5000,
    "a huge string": "password=hunter2 " + "x" * 1_000_000,
    "odd keys": {None: 1, 1.5: 2, (1, 2): 3, True: 4, 7: 5, "": 6},
    "objects that are not JSON": [{1, 2}, b"bytes", Decimal("1.5"), date(2020, 1, 1), object(), (1, "t")],
    "lone surrogates": {"\ud800key": "a\udfffb"},
    "a wide dict": {f"k{i}": list(range(50)) for i in range(2_000)},
}


@pytest.mark.parametrize("value", ODD_VALUES.values(), ids=ODD_VALUES.keys())
def test_odd_input_never_raises_and_gives_valid_json_within_the_depth_limit(value: Any) -> None:
    redactor = Redactor(max_bytes=4096)
    for method, text in stored_texts(redactor, value):
        parsed = json.loads(text)
        text.encode("utf-8")  # storable: no lone surrogates
        assert depth_of(parsed) <= MAX_DEPTH, method
        if method != "redact":
            assert len(text.encode()) <= 4096, method
    assert "hunter2" not in redactor.scrub_json(ODD_VALUES["a huge string"])


def test_containers_beyond_the_depth_limit_are_replaced_by_a_marker_saying_what_was_cut() -> None:
    at_limit = nested_lists(MAX_DEPTH - 1, [1, 2, 3])
    assert Redactor().redact(at_limit) is at_limit

    out = Redactor().redact(nested_lists(MAX_DEPTH, [1, 2, 3]))
    for _ in range(MAX_DEPTH - 1):
        (out,) = out
    assert out == [f"[truncated array of 3 items nested deeper than {MAX_DEPTH} levels]"]

    deep_object = Redactor().truncate(nested_dicts(MAX_DEPTH + 1, "leaf"))
    for _ in range(MAX_DEPTH - 1):
        deep_object = deep_object["k"]
    assert deep_object == {"k": f"[truncated object of 1 items nested deeper than {MAX_DEPTH} levels]"}


@pytest.mark.parametrize("as_text", [False, True])
def test_a_secret_below_the_depth_limit_is_cut_never_stored(as_text: bool) -> None:
    value = nested_dicts(MAX_DEPTH + 5, {"password": "hunter2", "note": f"token {GHP}"})
    carried = {"result": json.dumps(value) if as_text else value}
    for method, text in stored_texts(Redactor(), carried):
        if method == "truncate":
            continue  # it cuts depth too, but redacts nothing: `scrub` is what the ledger stores
        assert "hunter2" not in text, method
        assert GHP not in text, method
        assert "nested deeper than" in text, method


def test_redacting_from_a_nearly_exhausted_stack_withholds_the_value_instead_of_raising() -> None:
    redactor = Redactor()
    value = nested_lists(MAX_DEPTH, {"note": f"token {GHP}"})
    text = json.dumps(value)
    frame: FrameType | None = sys._getframe()
    depth = 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 40)  # too little for redacting 64 levels
    try:
        outcomes = [
            redactor.redact(value),
            redactor.scrub(value),
            redactor.scrub_json(value),
            redactor.truncate(value),
            redactor.redact_text(text),
        ]
    finally:
        sys.setrecursionlimit(limit)
    for outcome in outcomes:
        assert GHP not in json.dumps(outcome)
        assert "too deeply" in json.dumps(outcome)


def test_what_holds_no_secret_is_returned_as_it_is() -> None:
    value = {"a": [1, 2.5, None, True, {"b": "plain text"}], "c": '{\n  "json": [1,  2]\n}'}
    assert Redactor().redact(value) is value
    redacted = Redactor().redact({**value, "password": "x"})
    assert redacted["password"] == REDACTED
    assert redacted["a"] is value["a"]


# -- properties: total over deep and wide generated JSON ------------------------------------------------------

odd_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities too
    | st.text()
    | st.binary(max_size=8)
    | st.tuples(st.integers(), st.text(max_size=4))
)
odd_trees = st.recursive(
    odd_leaves,
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.text(max_size=6) | st.integers() | st.none() | st.booleans(), children, max_size=6)
    ),
    max_leaves=30,
)


@st.composite
def deep_and_wide(draw: st.DrawFn) -> Any:
    """Generated JSON-like data wrapped up to 300 levels deep in lists, dicts, wide lists and, now and then,
    as JSON text inside a string (whose content nests on)."""
    value = draw(odd_trees)
    texts = 0
    for _ in range(draw(st.integers(min_value=0, max_value=300))):
        how = draw(st.sampled_from(["list", "dict", "wide", "text"]))
        if how == "list":
            value = [value]
        elif how == "dict":
            value = {draw(st.text(max_size=4)): value}
        elif how == "wide":
            value = [*draw(st.lists(odd_leaves, max_size=30)), value]
        elif texts < 4:  # each level of text escapes the one inside: keep the size sane
            texts += 1
            value = json.dumps(value, default=str)
    return value


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(value=deep_and_wide(), max_bytes=st.integers(min_value=64, max_value=4096))
def test_redact_scrub_and_truncate_are_total_over_deep_and_wide_json(value: Any, max_bytes: int) -> None:
    redactor = Redactor(max_bytes=max_bytes)
    texts = dict(stored_texts(redactor, value))
    for method, text in texts.items():
        assert depth_of(json.loads(text)) <= MAX_DEPTH, method
        if method != "redact":
            assert len(text.encode()) <= max_bytes, method
    assert texts["scrub_json"] == texts["scrub"]
