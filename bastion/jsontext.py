"""JSON both ways on the hot path: orjson where it gives what the standard library gives, the standard library where
orjson would lose or refuse something (the standard library's encoder and parser are several times slower)."""

from __future__ import annotations

import json
import re
from typing import Any, Final

import orjson

_LONG_NUMBER: Final = re.compile(rb"[0-9][0-9]{18,}")
_LONG_NUMBER_TEXT: Final = re.compile(r"[0-9][0-9]{18,}")
"""19 digits or more: maybe an integer orjson cannot hold (beyond 64 bits), or text that merely has the digits. (A
pattern that opens with a character class is searched for that class first; `\\d{19,}` is tried at every byte.)"""
_LONG_RUN: Final = 19
_DIGITS: Final = b"0123456789"
_INT_MIN: Final = -(1 << 63)
_UINT_MAX: Final = (1 << 64) - 1
"""The integers orjson writes: from the least 64-bit signed to the greatest 64-bit unsigned."""


def loads(data: bytes | str) -> Any:
    """Parse JSON as `json.loads` does. Where orjson would lose something (it reads an integer beyond 64 bits as a
    float) or refuses (`NaN`, nesting beyond its limit), the standard library parses, and raises as it does
    (ValueError for what is not JSON, RecursionError for what nests too deeply)."""
    if isinstance(data, bytes):
        # Counting the digits (a deletion in C) is several times cheaper than the search it spares most messages.
        long = len(data) - len(data.translate(None, _DIGITS)) >= _LONG_RUN and _LONG_NUMBER.search(data) is not None
    else:
        long = _LONG_NUMBER_TEXT.search(data) is not None
    if long:
        return json.loads(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(value: Any) -> bytes:
    """Compact JSON bytes: orjson, or the standard library for what orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def compact(value: Any) -> str:
    """`json.dumps(value, ensure_ascii=False, separators=(",", ":"))` for JSON data (string keys, finite floats; orjson
    writes NaN and infinities as null), but with floats as orjson writes them: the same value, in other digits at
    times (`1e-7` where the standard library writes `1e-07`, `0.00001` for `1e-05`). An integer beyond 64 bits, which
    orjson refuses, is written as its digits and the rest as orjson writes it: a piece's text never depends on what
    it sits beside (the ledger's truncation measures pieces alone). Anything else orjson refuses goes to the standard
    library."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        pass
    try:
        return orjson.dumps(_long_ints_marked(value), default=_digits).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class _LongInt:
    """An integer beyond orjson's 64 bits, to be written as its digits."""

    __slots__ = ("digits",)

    def __init__(self, value: int) -> None:
        self.digits = str(value)


def _long_ints_marked(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _long_ints_marked(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_long_ints_marked(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value <= _UINT_MAX:
        return _LongInt(value)
    return value


def _digits(value: Any) -> orjson.Fragment:
    if isinstance(value, _LongInt):
        return orjson.Fragment(value.digits)
    raise TypeError(f"{type(value).__name__} is not JSON data")
