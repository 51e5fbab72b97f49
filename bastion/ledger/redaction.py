"""Redaction and structural truncation of what the ledger persists.

Everything here is pure and total: a `Redactor` takes any JSON-like value and returns JSON data, never
mutating its input and never raising (however deep, wide or odd the value). Secrets are removed first (by key
and by the shape of the string), then the value is cut down to a byte budget in a way that keeps it valid JSON
and says what was cut (bastion.ledger.truncation). Containers nested deeper than `MAX_DEPTH` are cut too, so that
nothing downstream (the JSON encoder, a reader of the ledger) recurses without bound.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import re
from collections.abc import Sequence
from typing import Any, Final

from bastion.jsontext import compact, loads
from bastion.ledger.truncation import fit_json, json_bytes

REDACTED: Final = "[REDACTED]"

SECRET_KEY_PARTS: Final[tuple[str, ...]] = (
    "password",
    "passwd",
    "passphrase",
    "pwd",
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
    "session_id",
    "sessid",
)
"""A dict key holding one of these at the end of a word holds a secret (see `Redactor.is_secret_key`)."""

TOKEN_COUNT_WORDS: Final = frozenset(
    {
        *("max", "min", "total", "input", "output", "prompt", "completion", "cached", "reasoning"),
        *("used", "usage", "count", "num", "number", "limit", "remaining", "budget", "per"),
        *("next", "page", "continuation"),
    }
)
"""Words that make a `token` key a count or a page cursor (`max_tokens`, `tokens_used`, `nextPageToken`)."""

MIN_MAX_BYTES: Final = 64
"""The smallest budget `truncate` accepts: room for the `{"_truncated": true, ...}` fallback."""

MAX_DEPTH: Final = 64
"""Containers nested deeper than this are replaced by a marker string: no real tool call nests so deep."""

# Credential shapes, each long enough that ordinary words never match, each with the literal text it
# must contain: a cheap `in` test skips the regex for the many strings that cannot hold one.
# A match is replaced whole, except the groups `keep` (`Bearer `, a URL's `://user:`, a PEM header) and
# `tail` (a PEM footer).
_AWS_KEY_ID: Final = re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}")
_CREDENTIALS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    # JWT, maybe unsigned; it starts a token (the lookbehind keeps a long run of `eyJeyJ...` linear).
    ("eyJ", re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*")),
    ("gh", re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}")),  # GitHub tokens
    ("github_pat_", re.compile(r"github_pat_[A-Za-z0-9_]{20,}")),  # GitHub fine-grained PAT
    ("xox", re.compile(r"xox[abprs]-[A-Za-z0-9_-]{10,}")),  # Slack
    ("sk-", re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}")),  # OpenAI, Anthropic (sk-ant-, sk-proj-)
    ("AKIA", _AWS_KEY_ID),
    ("ASIA", _AWS_KEY_ID),
    ("bst_", re.compile(r"bst_[A-Za-z0-9_-]{43}")),  # Bastion's own tokens (ledger/tokens.py)
    ("://", re.compile(r"(?P<keep>://[^\s:/?#@]*:)[^\s/?#]+(?=@)")),  # scheme://user:PASSWORD@host
    (
        "PRIVATE KEY",  # a PEM block, to its footer or, cut short, to the end of the text
        re.compile(
            r"(?P<keep>-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----)"
            r".*?(?:(?P<tail>-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----)|\Z)",
            re.DOTALL,
        ),
    ),
)
# Every credential shape and every `key=value` pair contains one of these (or `bearer` or `basic`, in any case);
# most strings contain none. Tested with `in`, one after the other: one regex alternating them all tries each at
# every character of the text, several times slower.
_TRIGGERS: Final = ("=", ":", *dict.fromkeys(trigger for trigger, _ in _CREDENTIALS))
# `Bearer <token>`: the token needs a digit and 8 characters, or 20 characters, so prose keeps its words.
_BEARER: Final = re.compile(
    r"(?P<keep>\b(?i:bearer)[ \t]+)"
    r"(?:(?=[A-Za-z0-9\-._~+/]*[0-9])[A-Za-z0-9\-._~+/]{8,}|[A-Za-z0-9\-._~+/]{20,})=*"
)
# `Basic <base64 of user:password>`: replaced only when it decodes to that (`_replace_basic`).
_BASIC: Final = re.compile(r"(?P<keep>\b(?i:basic)[ \t]+)(?P<credential>[A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])")
# `key=value`, `key: value`, `"key": "value"`, and the same inside escaped JSON (`\"key\": \"value\"`): a key
# and its separator. Whether the key is secret is decided in Python (`Redactor.is_secret_key`).
_PAIR_KEY: Final = re.compile(
    r"""(?P<kq>\\*["']|)(?<![A-Za-z0-9_.\-])(?P<key>[A-Za-z0-9_.\-]+)(?P=kq)[ \t]*[:=][ \t]*"""
)
# The value after a secret key: a quoted string (its quotes maybe escaped, as in escaped JSON), a quote left
# open (to the end of the line), a `{braced}` value, a run up to `;` (connection strings: `Pwd=two words;`),
# or a run up to a delimiter (an auth scheme word such as `Basic` is taken with the credential that follows).
_PAIR_VALUE: Final = re.compile(
    r"""
        "(?:[^"\\\n]|\\.)*"
      | '(?:[^'\\\n]|\\.)*'
      | (?P<vq>\\+["']).*?(?<!\\)(?P=vq)
      | \\*["'][^\n]*
      | \{[^{}\n]*\}(?=[\s;&,"'<>]|$)
      | [^\s;&,"'<>={][^;&,"'<>=\n]*(?=;)
      | (?:(?i:bearer|basic|token|digest|bot)[ \t]+)?[^\s&,;"'<>]+
    """,
    re.VERBOSE,
)
_QUOTE: Final = re.compile(r"""\\*["']""")
_JSON_START: Final = re.compile(r"\s*[\[{]")
_JSON_FIRST: Final = frozenset("[{ \t\r\n")  # what text that _JSON_START matches can begin with
# Key normalisation: camelCase split (`privateKey`, `APIKey`, `password2`), then lower case words joined by `_`.
_CAMEL_BOUNDARY: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=[0-9])")
_NOT_WORD: Final = re.compile(r"[^a-z0-9]+")

_KEY_CACHE_SIZE: Final = 4096
_SURROGATE = re.compile("[\ud800-\udfff]")
# Integers with more digits than this cannot be turned into text (sys.get_int_max_str_digits, 4300).
_MAX_INT_BITS: Final = 10_000
_TOO_DEEP: Final = "[truncated: nested too deeply to redact here]"
_TOO_DEEP_TEXT: Final = "[truncated JSON text: nested too deeply to parse]"


def _key_words(key: str) -> str:
    """A key as lower-case words joined by `_`: `privateKey`, `Private-Key` and `PRIVATE_KEY` all give `private_key`."""
    return _NOT_WORD.sub("_", _CAMEL_BOUNDARY.sub("_", key).lower()).strip("_")


def _squash(text: str) -> str:
    """Lower case without `_`, `-`, `.`: a cheap test of whether text can mention a key part at all."""
    return text.lower().replace("_", "").replace("-", "").replace(".", "")


def _depth_marker(value: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> str:
    kind = "object" if isinstance(value, dict) else "array"
    return f"[truncated {kind} of {len(value)} items nested deeper than {MAX_DEPTH} levels]"


def _int_marker(value: int) -> str:
    return f"[truncated integer of {value.bit_length()} bits]"


def _valid_text(text: str) -> str:
    """`text` with lone surrogates replaced: they cannot be stored as UTF-8."""
    if not text.isascii() and _SURROGATE.search(text):
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


class Redactor:
    """Removes secrets from JSON values and truncates them to `max_bytes` before they are persisted.

    Every public method is total: whatever it is given, it returns JSON data (or its text) and never raises.
    """

    def __init__(self, extra_secret_keys: Sequence[str] = (), max_bytes: int = 16384) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"max_bytes must be at least {MIN_MAX_BYTES}, got {max_bytes}")
        self.max_bytes = max_bytes
        normalised = (_key_words(part) for part in (*SECRET_KEY_PARTS, *extra_secret_keys))
        parts = tuple(dict.fromkeys(part for part in normalised if part))
        # A part's own words match with or without `_` between them; the longest part is tried first.
        alternatives = "|".join(
            "_?".join(re.escape(word) for word in part.split("_")) for part in sorted(parts, key=len, reverse=True)
        )
        self._key_part: re.Pattern[str] = re.compile(rf"(?P<part>{alternatives})s?(?![a-z0-9])")
        self._squashed_parts: tuple[str, ...] = tuple(dict.fromkeys(part.replace("_", "") for part in parts))
        self._secret_keys: dict[str, bool] = {}
        self._keys: dict[str, tuple[str, bool]] = {}

    def is_secret_key(self, key: str) -> bool:
        """Whether values under this dict key are secrets; memoised, since the same keys recur in every call.

        The key is read as lower-case words (camelCase split: `privateKey` is `private_key`, `APIKey` is
        `api_key`; `-`, `.` and spaces separate words too) and is secret when a secret part ends one of its
        words, maybe plural: `x-api-key`, `authToken`, `csrftoken`, `client_secrets`, `passwordHash` are secret;
        `tokenizer`, `keyboard`, `secretary` are not. A part of several words matches with or without the
        separator (`apikey`, `session_id`, `sessionid`). `token` beside a count or paging word is ordinary data
        (`max_tokens`, `tokens_used`, `nextPageToken`: see `TOKEN_COUNT_WORDS`).
        """
        known = self._secret_keys.get(key)
        if known is None:
            if len(self._secret_keys) >= _KEY_CACHE_SIZE:
                self._secret_keys.clear()
            known = self._secret_keys[key] = self._match_key(key)
        return known

    def _match_key(self, key: str) -> bool:
        words = _key_words(key)
        found = [match.group("part") for match in self._key_part.finditer(words)]
        if found and all(part == "token" for part in found):
            return TOKEN_COUNT_WORDS.isdisjoint(words.split("_"))
        return bool(found)

    def _redact_key(self, key: str) -> tuple[str, bool]:
        """The key as stored (credentials in it redacted) and whether its value is secret; memoised."""
        known = self._keys.get(key)
        if known is None:
            if len(self._keys) >= _KEY_CACHE_SIZE:
                self._keys.clear()
            known = self._keys[key] = (self._redact_text(key, None), self.is_secret_key(key))
        return known

    def scrub(self, value: Any) -> Any:
        """What the ledger stores: `truncate(redact(value))`."""
        try:
            return fit_json(self._clean(value, 1, redacting=True), self.max_bytes)
        except RecursionError:  # see `redact`
            return _TOO_DEEP

    def scrub_json(self, value: Any) -> str:
        """`scrub(value)` as compact JSON text; a value that fits is serialised once, not measured first."""
        try:
            redacted = self._clean(value, 1, redacting=True)
            text = compact(redacted)
            if len(text) * 4 <= self.max_bytes or json_bytes(text) <= self.max_bytes:  # UTF-8: at most 4 bytes a char
                return text
            return compact(fit_json(redacted, self.max_bytes))
        except RecursionError:  # see `redact`
            return compact(_TOO_DEEP)

    # -- redaction ---------------------------------------------------------------------------------------

    def redact(self, value: Any) -> Any:
        """JSON data: `value` with secrets replaced by `[REDACTED]`.

        Values under secret-looking keys go whole; in strings, credential-looking substrings and the values
        of secret `key=value` pairs go, keeping the text around them. A string holding a JSON object or array
        is parsed, redacted and re-serialised. Tuples become lists, non-JSON objects their `str()`, NaN and
        infinities their text, containers nested deeper than `MAX_DEPTH` a marker saying what was cut. What
        holds nothing to change is returned as it is, not copied.
        """
        try:
            return self._clean(value, 1, redacting=True)
        except RecursionError:
            # Our own recursion is bounded by MAX_DEPTH; this happens only when called from a stack that is
            # already nearly exhausted, and then the value is withheld rather than kept unredacted.
            return _TOO_DEEP

    def redact_text(self, text: str) -> str:
        """`text` with credentials and the values of secret `key=value` pairs redacted (as `redact` does)."""
        try:
            return self._redact_text(text, 1)
        except RecursionError:  # see `redact`
            return _TOO_DEEP

    def _clean(self, value: Any, depth: int, *, redacting: bool) -> Any:
        """`value` as JSON data, redacted when `redacting`; `depth` is its container's nesting level."""
        if isinstance(value, str):
            return self._redact_text(value, depth) if redacting else _valid_text(value)
        if isinstance(value, dict):
            return self._clean_dict(value, depth, redacting=redacting)
        if isinstance(value, list | tuple):
            return self._clean_list(value, depth, redacting=redacting)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            return value if value.bit_length() <= _MAX_INT_BITS else _int_marker(value)
        if isinstance(value, float):
            # NaN and infinities are not JSON; keep what they were as text.
            return value if math.isfinite(value) else str(value)
        text = str(value)
        return self._redact_text(text, depth) if redacting else _valid_text(text)

    def _clean_dict(self, mapping: dict[Any, Any], depth: int, *, redacting: bool) -> dict[str, Any] | str:
        if depth > MAX_DEPTH:
            return _depth_marker(mapping)
        out: dict[str, Any] | None = None
        for index, (key, item) in enumerate(mapping.items()):
            text_key = key if isinstance(key, str) else str(key)
            stored_key, secret = self._redact_key(text_key) if redacting else (_valid_text(text_key), False)
            cleaned = REDACTED if secret else self._clean(item, depth + 1, redacting=redacting)
            if out is None and (stored_key != key or cleaned is not item):
                out = dict(itertools.islice(mapping.items(), index))  # the unchanged items so far
            if out is not None:
                out[stored_key] = cleaned
        return mapping if out is None else out

    def _clean_list(
        self, items: list[Any] | tuple[Any, ...], depth: int, *, redacting: bool
    ) -> list[Any] | tuple[Any, ...] | str:
        if depth > MAX_DEPTH:
            return _depth_marker(items)
        out: list[Any] | None = None if isinstance(items, list) else []  # a tuple always becomes a list
        for index, item in enumerate(items):
            cleaned = self._clean(item, depth + 1, redacting=redacting)
            if out is None and cleaned is not item:
                out = list(items[:index])  # the unchanged items so far
            if out is not None:
                out.append(cleaned)
        return items if out is None else out

    def _redact_text(self, text: str, depth: int | None) -> str:
        """`text` redacted; the same object when nothing changed. A JSON object or array in it is parsed and
        redacted as a value at nesting level `depth` (None: never parsed, for dict keys)."""
        original = text
        text = _valid_text(text)
        if depth is not None and text[:1] in _JSON_FIRST and _JSON_START.match(text):
            embedded = self._redact_embedded_json(text, depth)
            if embedded is not None:
                return embedded
        if not _holds_trigger(text):
            folded = text.lower()
            if "bearer" not in folded and "basic" not in folded:
                return text  # the quick exit: nothing below would change it
        for trigger, pattern in _CREDENTIALS:
            if trigger in text:
                text = pattern.sub(_replace_credential, text)
        folded = text.lower()
        if "bearer" in folded:
            text = _BEARER.sub(_replace_credential, text)
        if "basic" in folded:
            text = _BASIC.sub(_replace_basic, text)
        if ("=" in text or ":" in text) and self._may_name_a_secret_key(text):
            text = self._redact_pairs(text)
        return original if text == original else text

    def _may_name_a_secret_key(self, text: str) -> bool:
        squashed = _squash(text)
        return any(part in squashed for part in self._squashed_parts)

    def _redact_pairs(self, text: str) -> str:
        """`text` with the value of every `key=value` pair whose key is secret redacted.

        A loop rather than `re.sub`: after a key that is not secret the scan goes on right after its separator,
        so a pair inside its value (`note: password=x`) is found without recursion.
        """
        pieces: list[str] = []
        position = 0
        while (key := _PAIR_KEY.search(text, position)) is not None:
            if not self.is_secret_key(key.group("key")):
                pieces.append(text[position : key.end()])
                position = key.end()
                continue
            value = _PAIR_VALUE.match(text, key.end())
            pieces.append(text[position : key.end()])
            position = key.end()
            if value is not None:
                quote = _QUOTE.match(value.group(0))
                mark = quote.group(0) if quote else ""
                pieces.append(f"{mark}{REDACTED}{mark}")
                position = value.end()
        pieces.append(text[position:])
        return "".join(pieces)

    def _redact_embedded_json(self, text: str, depth: int) -> str | None:
        """Redact a string that is a JSON object or array; None if it is not one."""
        try:
            parsed = loads(text)
        except RecursionError:
            return _TOO_DEEP_TEXT  # nested deeper than the parser goes: withheld, never kept unredacted
        except ValueError:
            return None
        if not isinstance(parsed, dict | list):
            return None
        redacted = self._clean(parsed, depth, redacting=True)
        if redacted is parsed:
            return text  # nothing secret: keep the original formatting
        return json.dumps(redacted, ensure_ascii=False)

    # -- truncation --------------------------------------------------------------------------------------

    def truncate(self, value: Any) -> Any:
        """`value` as JSON data cut down so that its compact UTF-8 JSON fits in `max_bytes`; unchanged if it
        already is JSON data that fits.

        Works top-down keeping as much as fits: long strings end with `…[truncated N chars]`, lists keep a
        prefix and a `"[truncated N more items]"` element, dicts keep a prefix of keys and a `_truncated` key.
        When nothing sensible fits, returns `{"_truncated": true, "original_bytes": N, "preview": "..."}`.
        Non-JSON parts are converted and over-deep containers cut first, as `redact` does (without redacting).
        """
        try:
            return fit_json(self._clean(value, 1, redacting=False), self.max_bytes)
        except RecursionError:  # see `redact`
            return _TOO_DEEP


def _holds_trigger(text: str) -> bool:
    """Whether `text` contains one of `_TRIGGERS` (a loop: a third cheaper than `any()` over a generator)."""
    for trigger in _TRIGGERS:  # noqa: SIM110 (see the docstring)
        if trigger in text:
            return True
    return False


def _replace_credential(match: re.Match[str]) -> str:
    groups = match.groupdict()
    return (groups.get("keep") or "") + REDACTED + (groups.get("tail") or "")


def _replace_basic(match: re.Match[str]) -> str:
    """`Basic <credential>` redacted when the credential is the base64 of printable `user:password` text."""
    credential = match.group("credential")
    try:
        decoded = base64.b64decode(credential + "=" * (-len(credential) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return match.group(0)
    if ":" in decoded and decoded.isprintable():
        return match.group("keep") + REDACTED
    return match.group(0)
