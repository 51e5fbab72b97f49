"""Where things are in TOML text, and how to say what is wrong there, for configuration issues.

`tomllib` returns values without positions. `KeyIndex` scans the same text once and records the line of
every key path, in the shape of a pydantic error location: `("tools", "write_file", "risk")`, with
integer indices for array elements and `[[array]]` tables. It handles table and array-of-tables headers,
dotted and quoted keys, inline tables and multi-line strings. It expects text that `tomllib` accepts and
is lenient (never raises, always terminates) on anything else. It also finds the first line where the
nesting goes deeper than `MAX_NESTING` (arrays, tables and dotted keys alike): `tomllib` and every
recursive step after it would otherwise fail with `RecursionError` on such a file. `describe_error` words
a pydantic validation error in the terms of the file (`tools.write_file.risk`), with a fix.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any, Final

KeyPath = tuple[str | int, ...]

MAX_NESTING: Final = 32
"""How deep a configuration value may nest (tables, arrays and dotted keys count alike); no configuration
needs more than a handful of levels, and `tomllib` itself overflows Python's stack at a few hundred."""

_BARE_KEY_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SCALAR_END: Final = frozenset(",]}\n#")
_SYNTAX_LINE: Final = re.compile(r"at line (\d+)")
_BARE_KEY: Final = re.compile(r"^[A-Za-z0-9_-]+$")
_SYNTAX_POSITION: Final = re.compile(r"\s*\(at (line \d+, column \d+|end of document)\)")
_UNQUOTED_COLON_KEY: Final = re.compile(r"^\s*[A-Za-z0-9_-]+:[^=]*=")


class KeyIndex:
    """The line of every key path of one TOML document."""

    def __init__(self, text: str) -> None:
        scanner = _Scanner(text)
        self.lines: dict[KeyPath, int] = scanner.scan()
        self.too_deep: int | None = scanner.too_deep
        """The first line where the nesting goes deeper than MAX_NESTING (the index stops there), else None."""

    def line_of(self, path: KeyPath) -> int:
        """The line of the most specific key of `path` that the text defines (its table's, at worst), else 1."""
        for end in range(len(path), 0, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return 1


def describe_syntax_error(error: tomllib.TOMLDecodeError, text: str) -> tuple[int, str]:
    """The line a `tomllib` syntax error points at (`at line N`; the last line at end of document) and a message."""
    found = _SYNTAX_LINE.search(str(error))
    line = int(found.group(1)) if found else max(1, len(text.splitlines()))
    reason = _SYNTAX_POSITION.sub("", str(error)).strip()
    lines = text.splitlines()
    if 0 < line <= len(lines) and _UNQUOTED_COLON_KEY.match(lines[line - 1]):
        fix = 'quote keys that contain ":", e.g. "fs:write_file" = "deny"'
    else:
        fix = "fix the TOML syntax on this line"
    return line, f"TOML syntax error: {reason}; {fix}"


def line_containing(text: str, needle: str, start: int) -> int:
    """The first line from `start` on that contains `needle` (a value may span lines), else `start`."""
    for number, line in enumerate(text.splitlines()[start - 1 :], start=start):
        if needle in line:
            return number
    return start


def describe_error(error: Mapping[str, Any], known_keys: Sequence[str]) -> str:
    """A pydantic validation error as a sentence naming the problem and the fix.

    `known_keys` are the keys the table holding the error accepts, to suggest a fix for an unknown key.
    """
    loc: KeyPath = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        where = f" in [{dotted_key(loc[:-1])}]" if loc[:-1] else ""
        close = difflib.get_close_matches(key, known_keys, n=1)
        if close:
            return f'unknown key "{key}"{where}; did you mean "{close[0]}"?'
        return f'unknown key "{key}"{where}; remove it (known keys: {", ".join(known_keys) or "none"})'
    if kind == "missing":
        table = f"[{dotted_key(loc[:-1])}]" if loc[:-1] else "this file"
        return f"{loc[-1]} is required in {table}; add it"
    if kind == "string_pattern_mismatch" and loc == ("id",):
        return f'connector id {_show(error["input"])} may use only lowercase letters, digits, "_" and "-"; change it'
    message = str(error["msg"])
    if message.startswith("Input should be"):
        message = "it should be" + message.removeprefix("Input should be")
    hint = " (or a tier R0-R4)" if loc and loc[-1] in ("risk", "default_risk") else ""
    return f"invalid {dotted_key(loc)} = {_show(error['input'])}: {message}{hint}"


def dotted_key(path: KeyPath) -> str:
    """A key path as a person would write it in TOML: `tools.write_file.risk`, `modes."fs:x"`, `args[0]`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            name = part if _BARE_KEY.match(part) else json.dumps(part)
            text += f".{name}" if text else name
    return text


def _show(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def drop_invalid(data: dict[str, Any], error: Mapping[str, Any]) -> bool:
    """Remove from `data` the entry a validation error is about (for a missing key, its table).

    Lets a loader keep the valid rest of a file; False when there is nothing left to remove.
    """
    loc: KeyPath = tuple(error["loc"])
    if error["type"] == "missing":
        loc = loc[:-1]
    container: Any = data
    parent: Any = None
    key: str | int = ""
    for part in loc:
        inside_dict = isinstance(container, dict) and part in container
        inside_list = isinstance(container, list) and isinstance(part, int) and 0 <= part < len(container)
        if not (inside_dict or inside_list):
            break
        parent, key, container = container, part, container[part]
    if parent is None:
        return False
    del parent[key]
    return True


def _decode_quoted_key(raw: str) -> str:
    """Decode a quoted key exactly as TOML does (escapes included) by letting tomllib read it."""
    try:
        value = tomllib.loads(f"k = {raw}")["k"]
    except tomllib.TOMLDecodeError:
        return raw[1:-1]
    return value if isinstance(value, str) else raw[1:-1]


class _TooDeep(Exception):
    """Stops the scan at the first key path deeper than MAX_NESTING (so its recursion stays shallow)."""


class _Scanner:
    """A single pass over TOML text that records key lines; values are skipped, never decoded."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1
        self.lines: dict[KeyPath, int] = {}
        self.table: KeyPath = ()
        self.array_table_counts: dict[KeyPath, int] = {}
        self.too_deep: int | None = None

    def scan(self) -> dict[KeyPath, int]:
        try:
            while True:
                self._skip_blank(newlines=True)
                if self.pos >= len(self.text):
                    return self.lines
                start = self.pos
                if self._peek() == "[":
                    self._header()
                else:
                    self._key_value(self.table)
                if self.pos == start:
                    self._advance(1)
        except _TooDeep:
            return self.lines

    def _check_depth(self, depth: int, line: int) -> None:
        if depth > MAX_NESTING:
            self.too_deep = line
            raise _TooDeep

    # -- characters

    def _peek(self, offset: int = 0) -> str:
        index = self.pos + offset
        return self.text[index] if index < len(self.text) else ""

    def _advance(self, count: int) -> None:
        end = min(self.pos + count, len(self.text))
        self.line += self.text.count("\n", self.pos, end)
        self.pos = end

    def _skip_blank(self, *, newlines: bool) -> None:
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char in " \t\r" or (newlines and char == "\n"):
                self._advance(1)
            elif char == "#":
                end = self.text.find("\n", self.pos)
                self._advance((len(self.text) if end < 0 else end) - self.pos)
            else:
                return

    # -- structure

    def _header(self) -> None:
        line = self.line
        is_array = self.text.startswith("[[", self.pos)
        self._advance(2 if is_array else 1)
        parts = self._key()
        self._check_depth(len(parts), line)
        self._skip_blank(newlines=False)
        self._advance(2 if is_array and self.text.startswith("]]", self.pos) else 1)
        path: KeyPath = ()
        for i, part in enumerate(parts):
            path = (*path, part)
            self.lines.setdefault(path, line)
            if is_array and i == len(parts) - 1:
                count = self.array_table_counts.get(path, 0)
                self.array_table_counts[path] = count + 1
                path = (*path, count)
            elif path in self.array_table_counts:
                # `[a.b]` after `[[a]]` belongs to the last element of the array `a`.
                path = (*path, self.array_table_counts[path] - 1)
        self._check_depth(len(path), line)
        self.lines[path] = line
        self.table = path

    def _key_value(self, base: KeyPath) -> None:
        line = self.line
        parts = self._key()
        if not parts:
            return
        path = (*base, *parts)
        self._check_depth(len(path), line)
        for end in range(len(base) + 1, len(path)):
            self.lines.setdefault(path[:end], line)
        self.lines[path] = line
        self._skip_blank(newlines=False)
        if self._peek() == "=":
            self._advance(1)
            self._skip_blank(newlines=False)
        self._value(path)

    def _key(self) -> list[str]:
        parts: list[str] = []
        while True:
            self._skip_blank(newlines=False)
            char = self._peek()
            if char in ('"', "'"):
                parts.append(_decode_quoted_key(self._single_line_string(char)))
            else:
                start = self.pos
                while self._peek() in _BARE_KEY_CHARS:
                    self._advance(1)
                if self.pos == start:
                    return parts
                parts.append(self.text[start : self.pos])
            self._skip_blank(newlines=False)
            if self._peek() != ".":
                return parts
            self._advance(1)

    def _value(self, path: KeyPath) -> None:
        if self.text.startswith('"""', self.pos) or self.text.startswith("'''", self.pos):
            self._multi_line_string(self._peek())
        elif self._peek() in ('"', "'"):
            self._single_line_string(self._peek())
        elif self._peek() == "[":
            self._array(path)
        elif self._peek() == "{":
            self._inline_table(path)
        else:
            while self.pos < len(self.text) and self.text[self.pos] not in _SCALAR_END:
                self._advance(1)

    def _array(self, path: KeyPath) -> None:
        self._advance(1)
        index = 0
        while self.pos < len(self.text):
            self._skip_blank(newlines=True)
            char = self._peek()
            if char == "]":
                self._advance(1)
                return
            if char == ",":
                self._advance(1)
                continue
            start = self.pos
            self._check_depth(len(path) + 1, self.line)
            self.lines[(*path, index)] = self.line
            self._value((*path, index))
            index += 1
            if self.pos == start:
                self._advance(1)

    def _inline_table(self, path: KeyPath) -> None:
        self._advance(1)
        while self.pos < len(self.text):
            self._skip_blank(newlines=True)
            char = self._peek()
            if char == "}":
                self._advance(1)
                return
            if char == ",":
                self._advance(1)
                continue
            start = self.pos
            self._key_value(path)
            if self.pos == start:
                self._advance(1)

    def _single_line_string(self, quote: str) -> str:
        start = self.pos
        self._advance(1)
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "\\" and quote == '"':
                self._advance(2)
            elif char == quote:
                self._advance(1)
                break
            elif char == "\n":
                break
            else:
                self._advance(1)
        return self.text[start : self.pos]

    def _multi_line_string(self, quote: str) -> None:
        self._advance(3)
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "\\" and quote == '"':
                self._advance(2)
            elif self.text.startswith(quote * 3, self.pos):
                # The closing delimiter may follow one or two quotes that belong to the string.
                run = 3
                while run < 5 and self._peek(run) == quote:
                    run += 1
                self._advance(run)
                return
            else:
                self._advance(1)
