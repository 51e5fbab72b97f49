"""JSON on the hot path: orjson's speed, never a value it would change (bastion.jsontext)."""

from __future__ import annotations

import json

import pytest

from bastion.jsontext import compact, dumps, loads


@pytest.mark.parametrize("number", [-5.960464477539063e-08, 1e16, 1e-05, 123456789012345680.0, 0.1, -0.0])
def test_a_value_s_text_does_not_depend_on_what_it_sits_beside(number: float) -> None:
    """The ledger's truncation measures pieces alone: a float beside an integer orjson refuses (beyond 64 bits) is
    written as it is alone, as orjson writes it."""
    alone = compact(number)
    assert float(alone) == number
    assert compact([10**30, number]) == f"[{10**30},{alone}]"
    assert compact({"n": -(10**30), "f": [number]}) == f'{{"n":{-(10**30)},"f":[{alone}]}}'
    assert compact([2**64 - 1, -(2**63), number]) == f"[{2**64 - 1},{-(2**63)},{alone}]"


@pytest.mark.parametrize(
    "value", [{"a": [1, 2.5, None, True, "é\n\u2028"]}, [], {"nested": {"deep": [[[{"x": "y"}]]]}}, 10**40, "text"]
)
def test_compact_text_reads_back_as_the_same_value(value: object) -> None:
    assert json.loads(compact(value)) == value
    assert json.loads(dumps(value)) == value


def test_loads_keeps_integers_beyond_64_bits_and_reads_what_only_the_standard_library_reads() -> None:
    assert loads(b"[123456789012345678901234567890]") == [123456789012345678901234567890]
    assert loads("[123456789012345678901234567890]") == [123456789012345678901234567890]
    assert loads('{"n": NaN}')["n"] != loads('{"n": NaN}')["n"]  # NaN, as json.loads reads it
    with pytest.raises(json.JSONDecodeError, match="property name"):
        loads(b"{not json")
