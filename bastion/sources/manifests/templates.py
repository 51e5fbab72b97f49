"""Interpolation of a step's inputs: `${args.<input>}` and `${<step>.<field>...}`.

A string that is exactly one reference takes the referenced value with its JSON type (a number stays a number);
a reference inside a longer string is written as text (numbers and booleans as JSON, objects and arrays as
compact JSON). Dotted paths go into a prior step's structured output, with integer parts indexing arrays
(`${list.notes.0.name}`). `$${` writes a literal `${`. An optional argument that was not given (and has no
default) drops the key it is the whole value of, and reads as "" inside a longer string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

ARGS: Final = "args"
_TOKEN: Final = re.compile(r"\$\$\{|\$\{([^{}]*)\}")
_PATH: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)+$")
_START: Final = "${"


class TemplateError(ValueError):
    """A reference that cannot be read (at load: malformed; at run time: absent from what it points into)."""


@dataclass(frozen=True, slots=True)
class Reference:
    """`${root.path...}`: root is `args` or a step id."""

    root: str
    path: tuple[str, ...]

    def __str__(self) -> str:
        return "${" + ".".join((self.root, *self.path)) + "}"


class _Omitted:
    """The value of an optional argument that was not given: its key is dropped."""


OMITTED: Final = _Omitted()


def references(value: Any) -> Iterator[tuple[tuple[str | int, ...], Reference]]:
    """Every reference in a (nested) input value, with the key path it sits at; TemplateError for a malformed one."""
    yield from _references(value, ())


def _references(value: Any, at: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], Reference]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _references(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _references(item, (*at, index))
    elif isinstance(value, str):
        rest = []
        position = 0
        for match in _TOKEN.finditer(value):
            rest.append(value[position : match.start()])
            position = match.end()
            if match.group(1) is not None:
                yield at, _parse(match.group(1))
        rest.append(value[position:])
        if any(_START in part for part in rest):
            raise TemplateError(f"an unclosed ${{ in {value!r}; close it with }} (or write $${{ for a literal ${{)")


def _parse(inner: str) -> Reference:
    text = inner.strip()
    if not _PATH.match(text):
        raise TemplateError(
            f"${{{inner}}} is not a reference; write ${{args.<input>}} or ${{<step id>.<field>}} "
            "(dotted for nested fields)"
        )
    root, *path = text.split(".")
    return Reference(root, tuple(path))


def render(value: Any, scope: Mapping[str, Any]) -> Any:
    """`value` with every reference replaced from `scope` (`args` -> the arguments, step id -> its output).

    Raises TemplateError naming the reference and what its target holds when a path is not there.
    """
    if isinstance(value, dict):
        rendered = {key: render(item, scope) for key, item in value.items()}
        return {key: item for key, item in rendered.items() if item is not OMITTED}
    if isinstance(value, list):
        return [item for item in (render(item, scope) for item in value) if item is not OMITTED]
    if not isinstance(value, str):
        return value
    whole = _TOKEN.fullmatch(value)
    if whole is not None and whole.group(1) is not None:
        return _lookup(_parse(whole.group(1)), scope)

    def replace(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return _START
        return _as_text(_lookup(_parse(match.group(1)), scope))

    return _TOKEN.sub(replace, value)


def deferred(value: Any) -> Any:
    """`value` with every reference to a step's output written as a literal (`$${step.field}`), so `render` fills in
    the arguments only: a composite's steps as a preview shows them, before any step ran."""
    if isinstance(value, dict):
        return {key: deferred(item) for key, item in value.items()}
    if isinstance(value, list):
        return [deferred(item) for item in value]
    if not isinstance(value, str):
        return value

    def keep(match: re.Match[str]) -> str:
        inner = match.group(1)
        if inner is None or _parse(inner).root == ARGS:
            return match.group(0)
        return "$" + match.group(0)

    return _TOKEN.sub(keep, value)


def _lookup(reference: Reference, scope: Mapping[str, Any]) -> Any:
    if reference.root not in scope:
        raise TemplateError(f"{reference}: nothing named {reference.root!r} has run before this step")
    current = scope[reference.root]
    walked = [reference.root]
    for part in reference.path:
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        elif reference.root == ARGS and len(walked) == 1:
            return OMITTED  # an optional argument that was not given
        else:
            raise TemplateError(f"{reference}: {'.'.join(walked)} has no {part!r} ({_shape(current)})")
        walked.append(part)
    return current


def _shape(value: Any) -> str:
    if isinstance(value, Mapping):
        return "its fields: " + (", ".join(sorted(str(k) for k in value)) or "none")
    if isinstance(value, list):
        return f"it is a list of {len(value)}"
    return f"it is {json.dumps(value, default=str)[:40]}"


def _as_text(value: Any) -> str:
    if value is OMITTED or value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
