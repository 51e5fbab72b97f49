"""Redaction and structural truncation of what the ledger persists (DESIGN.md §6 "Redaction").

Everything here is pure: a `Redactor` takes a JSON value and returns a new one, never mutating its input.
Secrets are removed first (by key and by the shape of the string), then the value is cut down to a byte
budget in a way that keeps it valid JSON and says what was cut.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, Final

REDACTED: Final = "[REDACTED]"

SECRET_KEY_PARTS: Final[tuple[str, ...]] = (
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
    "cookie",
    "credential",
    "private_key",
    "client_secret",
    "access_key",
)
"""A dict key containing one of these (case-insensitively, `-` and `_` alike) holds a secret."""

MIN_MAX_BYTES: Final = 64
"""The smallest budget `truncate` accepts: room for the `{"_truncated": true, ...}` fallback."""

# Credential shapes, each long enough that ordinary words never match, each with the literal text it
# must contain: a cheap `in` test skips the regex for the many strings that cannot hold one.
# A match is replaced whole, except the group `keep` (`Bearer `, a URL's `://user:`).
_AWS_KEY_ID: Final = re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}")
_CREDENTIALS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("eyJ", re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*")),  # JWT, maybe unsigned
    ("gh", re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}")),  # GitHub tokens
    ("github_pat_", re.compile(r"github_pat_[A-Za-z0-9_]{20,}")),  # GitHub fine-grained PAT
    ("xox", re.compile(r"xox[abprs]-[A-Za-z0-9_-]{10,}")),  # Slack
    ("sk-", re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}")),  # OpenAI, Anthropic (sk-ant-, sk-proj-)
    ("AKIA", _AWS_KEY_ID),
    ("ASIA", _AWS_KEY_ID),
    ("://", re.compile(r"(?P<keep>://[^\s:/?#@]*:)[^\s/?#]+(?=@)")),  # scheme://user:PASSWORD@host
)
# Every credential shape and every `key=value` pair contains one of these; most strings contain none.
_MAYBE_SECRET: Final = re.compile(r"eyJ|gh|github_pat_|xox|sk-|AKIA|ASIA|://|(?i:bearer)|[:=]")
# `Bearer <token>`: the token needs a digit and 8 characters, or 20 characters, so prose keeps its words.
_BEARER: Final = re.compile(
    r"(?P<keep>\b(?i:bearer)[ \t]+)"
    r"(?:(?=[A-Za-z0-9\-._~+/]*[0-9])[A-Za-z0-9\-._~+/]{8,}|[A-Za-z0-9\-._~+/]{20,})=*"
)
# `key=value`, `key: value`, `"key": "value"`: the key is checked against the secret parts in Python.
# The value is a quoted string, or a run up to a delimiter (an auth scheme word such as `Basic` is taken
# together with the credential that follows it).
_PAIR: Final = re.compile(
    r"""
    (?P<kq>["']?)(?<![A-Za-z0-9_.\-])(?P<key>[A-Za-z0-9_.\-]+)(?P=kq)
    (?P<sep>[ \t]*[:=][ \t]*)
    (?P<value>
        "(?:[^"\\\n]|\\.)*"
      | '(?:[^'\\\n]|\\.)*'
      | (?:(?i:bearer|basic|token|digest|bot)[ \t]+)?[^\s&,;"'<>]+
    )
    """,
    re.VERBOSE,
)

_KEY_CACHE_SIZE: Final = 4096
_SHORT_TEXT: Final = 256
_SURROGATE = re.compile("[\ud800-\udfff]")


def _normalise_key(key: str) -> str:
    return key.lower().replace("-", "_")


def _compact(value: Any) -> str:
    """The compact JSON text of `value`, non-ASCII kept as is: the form the ledger stores."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _size(value: Any) -> int:
    """Bytes of the compact UTF-8 JSON form, the measure `truncate` keeps under its budget."""
    return _bytes(_compact(value))


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class _Nothing:
    """Returned by the `_fit_*` helpers when nothing sensible fits the budget."""


_NOTHING: Final = _Nothing()


class Redactor:
    """Removes secrets from JSON values and truncates them to `max_bytes` before they are persisted."""

    def __init__(self, extra_secret_keys: Sequence[str] = (), max_bytes: int = 16384) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"max_bytes must be at least {MIN_MAX_BYTES}, got {max_bytes}")
        self.max_bytes = max_bytes
        parts = [_normalise_key(part) for part in (*SECRET_KEY_PARTS, *extra_secret_keys) if part]
        self._key_parts: tuple[str, ...] = tuple(dict.fromkeys(parts))
        self._keys: dict[str, tuple[str, bool]] = {}

    def is_secret_key(self, key: str) -> bool:
        """Whether values under this dict key are secrets (substring match, case and `-`/`_` insensitive)."""
        normalised = _normalise_key(key)
        return any(part in normalised for part in self._key_parts)

    def _redact_key(self, key: str) -> tuple[str, bool]:
        """The key as stored (credentials in it redacted) and whether its value is secret; memoised, since
        the same keys recur in every call."""
        known = self._keys.get(key)
        if known is None:
            if len(self._keys) >= _KEY_CACHE_SIZE:
                self._keys.clear()
            known = self._keys[key] = (self._redact_text(key), self.is_secret_key(key))
        return known

    def scrub(self, value: Any) -> Any:
        """What the ledger stores: `truncate(redact(value))`."""
        return self.truncate(self.redact(value))

    def scrub_json(self, value: Any) -> str:
        """`scrub(value)` as compact JSON text; a value that fits is serialised once, not measured first."""
        redacted = self.redact(value)
        text = _compact(redacted)
        if len(text) * 4 <= self.max_bytes or _bytes(text) <= self.max_bytes:  # UTF-8: at most 4 bytes a char
            return text
        return _compact(self.truncate(redacted))

    # -- redaction ---------------------------------------------------------------------------------------

    def redact(self, value: Any) -> Any:
        """A copy of `value` with secrets replaced by `[REDACTED]`.

        Values under secret-looking keys go whole; in strings, credential-looking substrings and the values
        of secret `key=value` pairs go, keeping the text around them. A string holding a JSON object or array
        is parsed, redacted and re-serialised. Tuples become lists, non-JSON objects their `str()`.
        """
        if isinstance(value, str):
            return self._redact_text(value)
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, item in value.items():
                stored_key, secret = self._redact_key(key if isinstance(key, str) else str(key))
                out[stored_key] = REDACTED if secret else self.redact(item)
            return out
        if isinstance(value, list | tuple):
            return [self.redact(item) for item in value]
        if value is None or isinstance(value, bool | int):
            return value
        if isinstance(value, float):
            # NaN and infinities are not JSON; keep what they were as text.
            return value if math.isfinite(value) else str(value)
        return self._redact_text(str(value))

    def _redact_text(self, text: str) -> str:
        if _SURROGATE.search(text):
            # Lone surrogates cannot be stored as UTF-8.
            text = text.encode("utf-8", "replace").decode("utf-8")
        if text.lstrip()[:1] in ("{", "["):
            embedded = self._redact_embedded_json(text)
            if embedded is not None:
                return embedded
        if len(text) < _SHORT_TEXT and _MAYBE_SECRET.search(text) is None:
            return text  # the quick exit for the many short strings; long ones are faster with `in` below
        for trigger, pattern in _CREDENTIALS:
            if trigger in text:
                text = pattern.sub(_replace_credential, text)
        folded = _normalise_key(text)
        if "bearer" in folded:
            text = _BEARER.sub(_replace_credential, text)
        if "=" in text or ":" in text:
            for part in self._key_parts:
                if part in folded:
                    return _PAIR.sub(self._replace_pair, text)
        return text

    def _replace_pair(self, match: re.Match[str]) -> str:
        head = match.group(0)[: match.start("value") - match.start(0)]
        value = match.group("value")
        if not self.is_secret_key(match.group("key")):
            # Not a secret, but its value may hold a pair that is: `note: password=x`.
            return head + _PAIR.sub(self._replace_pair, value)
        quote = value[0] if value[0] in "\"'" else ""
        return f"{head}{quote}{REDACTED}{quote}"

    def _redact_embedded_json(self, text: str) -> str | None:
        """Redact a string that is a JSON object or array; None if it is not one."""
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(parsed, dict | list):
            return None
        redacted = self.redact(parsed)
        if redacted == parsed:
            return text  # nothing secret: keep the original formatting
        return json.dumps(redacted, ensure_ascii=False)

    # -- truncation --------------------------------------------------------------------------------------

    def truncate(self, value: Any) -> Any:
        """`value` cut down so that its compact UTF-8 JSON fits in `max_bytes`; unchanged if it already fits.

        Works top-down keeping as much as fits: long strings end with `…[truncated N chars]`, lists keep a
        prefix and a `"[truncated N more items]"` element, dicts keep a prefix of keys and a `_truncated` key.
        When nothing sensible fits, returns `{"_truncated": true, "original_bytes": N, "preview": "..."}`.
        """
        total = _size(value)
        if total <= self.max_bytes:
            return value
        fitted = self._fit(value, self.max_bytes)
        if not isinstance(fitted, _Nothing):
            return fitted
        return self._fallback(value, total)

    def _fallback(self, value: Any, total: int) -> dict[str, Any]:
        serialised = _compact(value)
        head: dict[str, Any] = {"_truncated": True, "original_bytes": total}
        preview = _fit_str(serialised, self.max_bytes - _size(head) - len(',"preview":'))
        if isinstance(preview, str):
            head["preview"] = preview
        return head

    def _fit(self, value: Any, budget: int) -> Any:
        """`value` if it fits `budget` bytes, else a cut-down version, else `_NOTHING`."""
        if _size(value) <= budget:
            return value
        if isinstance(value, str):
            return _fit_str(value, budget)
        if isinstance(value, list):
            return self._fit_list(value, budget)
        if isinstance(value, dict):
            return self._fit_dict(value, budget)
        return _NOTHING

    def _fit_list(self, items: list[Any], budget: int) -> list[Any] | _Nothing:
        # Until the last item, reserve room for the marker element (with the largest count it could show).
        reserve = _size(_items_marker(len(items))) + 1
        kept: list[Any] = []
        used = 2  # the brackets
        for index, item in enumerate(items):
            comma = 1 if kept else 0
            room = budget - used - comma - (0 if index == len(items) - 1 else reserve)
            if room <= 0:
                break
            size = _size(item)
            if size <= room:
                kept.append(item)
                used += comma + size
                continue
            part = self._fit(item, room)
            if not isinstance(part, _Nothing):
                kept.append(part)
            break
        if not kept:
            return _NOTHING
        if len(kept) < len(items):
            kept.append(_items_marker(len(items) - len(kept)))
        return kept

    def _fit_dict(self, mapping: dict[str, Any], budget: int) -> dict[str, Any] | _Nothing:
        marker_key = "_truncated"
        while marker_key in mapping:
            marker_key = "_" + marker_key
        reserve = _size(marker_key) + 1 + _size(_keys_marker(len(mapping))) + 1
        kept: dict[str, Any] = {}
        used = 2  # the braces
        for index, (key, item) in enumerate(mapping.items()):
            comma = 1 if kept else 0
            room = budget - used - comma - (0 if index == len(mapping) - 1 else reserve)
            room -= _size(key) + 1  # what is left for the value
            if room <= 0:
                break
            size = _size(item)
            if size <= room:
                kept[key] = item
                used += comma + _size(key) + 1 + size
                continue
            part = self._fit(item, room)
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
    if _size(text) <= budget:
        return text

    def cut(keep: int) -> str:
        return f"{text[:keep]}…[truncated {len(text) - keep} chars]"

    if _size(cut(0)) > budget:
        return _NOTHING
    # Every character costs at least one byte, so no more than `budget` characters can be kept.
    low, high = 0, min(len(text) - 1, budget)
    while low < high:
        middle = (low + high + 1) // 2
        if _size(cut(middle)) <= budget:
            low = middle
        else:
            high = middle - 1
    return cut(low)


def _replace_credential(match: re.Match[str]) -> str:
    kept = match.groupdict().get("keep") or ""
    return kept + REDACTED
