"""Structural truncation of what the ledger persists: JSON data cut down to a byte budget, kept valid JSON, saying
what was cut. Long strings end with `…[truncated N chars]`, lists keep a prefix and a `"[truncated N more items]"`
element, dicts keep a prefix of keys and a `_truncated` key; when nothing sensible fits, the value becomes
`{"_truncated": true, "original_bytes": N, "preview": "..."}`. Pure; `Redactor.truncate` hands it JSON data already
cleaned (bastion.ledger.redaction).
"""

from __future__ import annotations

from typing import Any, Final

from bastion.jsontext import compact


def json_size(value: Any) -> int:
    """Bytes of the compact UTF-8 JSON form, the measure `fit_json` keeps under its budget."""
    return json_bytes(compact(value))


def json_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def fit_json(value: Any, max_bytes: int) -> Any:
    """`value`, JSON data within `MAX_DEPTH` (bastion.ledger.redaction), cut down so that its compact UTF-8 JSON fits
    in `max_bytes`; unchanged if it fits (see the module's docstring for how)."""
    total = json_size(value)
    if total <= max_bytes:
        return value
    fitted = _fit(value, max_bytes)
    if not isinstance(fitted, _Nothing):
        return fitted
    return _fallback(value, total, max_bytes)


class _Nothing:
    """Returned by the `_fit_*` helpers when nothing sensible fits the budget."""


_NOTHING: Final = _Nothing()


def _fallback(value: Any, total: int, max_bytes: int) -> dict[str, Any]:
    serialised = compact(value)
    head: dict[str, Any] = {"_truncated": True, "original_bytes": total}
    preview = _fit_str(serialised, max_bytes - json_size(head) - len(',"preview":'))
    if isinstance(preview, str):
        head["preview"] = preview
    return head


def _fit(value: Any, budget: int) -> Any:
    """`value` if it fits `budget` bytes, else a cut-down version, else `_NOTHING`."""
    if json_size(value) <= budget:
        return value
    if isinstance(value, str):
        return _fit_str(value, budget)
    if isinstance(value, list):
        return _fit_list(value, budget)
    if isinstance(value, dict):
        return _fit_dict(value, budget)
    return _NOTHING


def _fit_list(items: list[Any], budget: int) -> list[Any] | _Nothing:
    # Until the last item, reserve room for the marker element (with the largest count it could show).
    reserve = json_size(_items_marker(len(items))) + 1
    kept: list[Any] = []
    used = 2  # the brackets
    for index, item in enumerate(items):
        comma = 1 if kept else 0
        room = budget - used - comma - (0 if index == len(items) - 1 else reserve)
        if room <= 0:
            break
        size = json_size(item)
        if size <= room:
            kept.append(item)
            used += comma + size
            continue
        part = _fit(item, room)
        if not isinstance(part, _Nothing):
            kept.append(part)
        break
    if not kept:
        return _NOTHING
    if len(kept) < len(items):
        kept.append(_items_marker(len(items) - len(kept)))
    return kept


def _fit_dict(mapping: dict[str, Any], budget: int) -> dict[str, Any] | _Nothing:
    marker_key = "_truncated"
    while marker_key in mapping:
        marker_key = "_" + marker_key
    reserve = json_size(marker_key) + 1 + json_size(_keys_marker(len(mapping))) + 1
    kept: dict[str, Any] = {}
    used = 2  # the braces
    for index, (key, item) in enumerate(mapping.items()):
        comma = 1 if kept else 0
        room = budget - used - comma - (0 if index == len(mapping) - 1 else reserve)
        room -= json_size(key) + 1  # what is left for the value
        if room <= 0:
            break
        size = json_size(item)
        if size <= room:
            kept[key] = item
            used += comma + json_size(key) + 1 + size
            continue
        part = _fit(item, room)
        if not isinstance(part, _Nothing):
            kept[key] = part
        break
    if not kept:
        return _NOTHING
    if len(kept) < len(mapping):
        kept[marker_key] = _keys_marker(len(mapping) - len(kept))
    return kept


def _items_marker(count: int) -> str:
    return f"[truncated {count} more items]"


def _keys_marker(count: int) -> str:
    return f"[truncated {count} more keys]"


def _fit_str(text: str, budget: int) -> str | _Nothing:
    """The longest prefix of `text` that, with its `…[truncated N chars]` marker, fits `budget` bytes."""
    if json_size(text) <= budget:
        return text

    def cut(keep: int) -> str:
        return f"{text[:keep]}…[truncated {len(text) - keep} chars]"

    if json_size(cut(0)) > budget:
        return _NOTHING
    # Every character costs at least one byte, so no more than `budget` characters can be kept.
    low, high = 0, min(len(text) - 1, budget)
    while low < high:
        middle = (low + high + 1) // 2
        if json_size(cut(middle)) <= budget:
            low = middle
        else:
            high = middle - 1
    return cut(low)
