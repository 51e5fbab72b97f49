"""JSON both ways on the hot path: orjson where it gives what the standard library gives, the standard library where
orjson would lose or refuse something (issue 17: the standard library's encoder and parser are several times slower)."""

from __future__ import annotations

import json
import re
from typing import Any, Final

import orjson

_LONG_NUMBER: Final = re.compile(rb"\d{19,}")
_LONG_NUMBER_TEXT: Final = re.compile(r"\d{19,}")
"""19 digits or more: maybe an integer orjson cannot hold (beyond 64 bits), or text that merely has the digits."""


def loads(data: bytes | str) -> Any:
    """Parse JSON as `json.loads` does. Where orjson would lose something (it reads an integer beyond 64 bits as a
    float) or refuses (`NaN`, nesting beyond its limit), the standard library parses, and raises as it does
    (ValueError for what is not JSON, RecursionError for what nests too deeply)."""
    if (_LONG_NUMBER.search(data) if isinstance(data, bytes) else _LONG_NUMBER_TEXT.search(data)) is not None:
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
    """`json.dumps(value, ensure_ascii=False, separators=(",", ":"))` for JSON data: string keys, finite floats
    (orjson writes NaN and infinities as null; floats in the shortest form that reads back the same, `1e16` where
    the standard library writes `1e+16`). Integers beyond 64 bits go to the standard library."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
