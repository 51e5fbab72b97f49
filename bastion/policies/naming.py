"""Host-safe tool names (DESIGN.md §3): `<namespace>__<action_id>`, sanitised, capped and collision-free."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Final

from pydantic import BaseModel, ConfigDict

from bastion.models import policy_key

MAX_TOOL_NAME: Final = 50
"""Hosts add their own prefix and cap names at 64, so Bastion keeps its names to 50 characters."""

_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]")
_HASH_LENGTH: Final = 8

NameKey = tuple[str, str]
"""`(source_id, action_id)`: identifies one action across all sources."""


def sanitize(text: str) -> str:
    """Replace every character outside `[A-Za-z0-9_-]` with `_`, since hosts reject anything else."""
    return _UNSAFE.sub("_", text)


def _short_hash(text: str) -> str:
    # surrogatepass: upstream JSON may carry lone surrogates; hashing them must not crash the catalog.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LENGTH]


def _with_suffix(name: str, suffix: str) -> str:
    """`name_suffix`, with `name` cut so the result fits in MAX_TOOL_NAME."""
    return f"{name[: MAX_TOOL_NAME - len(suffix) - 1]}_{suffix}"


def tool_name(namespace: str, action_id: str) -> str:
    """The name a host sees for an action: prefixed unless `namespace` is `""`, sanitised, at most 50 long.

    A name that is too long is cut and ends with a hash of the full unsanitised name, so two long
    names that share their first characters still differ.
    """
    if not action_id:
        raise ValueError("action_id must not be empty")
    joined = f"{namespace}__{action_id}" if namespace else action_id
    name = sanitize(joined)
    if len(name) <= MAX_TOOL_NAME:
        return name
    return _with_suffix(name, _short_hash(joined))


class NameRequest(BaseModel):
    """One action that needs a host tool name."""

    model_config = ConfigDict(frozen=True)

    source_id: str
    namespace: str
    action_id: str


class NameAssignment(BaseModel):
    """The host tool name of every requested action, and a warning per collision that was resolved."""

    model_config = ConfigDict(frozen=True)

    names: dict[NameKey, str]
    warnings: list[str]


def _renamed(name: str, key: str, taken: set[str]) -> str:
    """A free name for the action `key` that lost `name`: `name` plus a hash of `key`, rehashed until free."""
    attempt = 0
    while True:
        seed = key if attempt == 0 else f"{key}#{attempt}"
        candidate = _with_suffix(name, _short_hash(seed))
        if candidate not in taken:
            return candidate
        attempt += 1


def assign_tool_names(requests: Iterable[NameRequest]) -> NameAssignment:
    """Give every action a distinct host name, independently of the order of `requests`.

    Each action first claims its `tool_name`. When several claim the same name, the first in
    `(source_id, action_id)` order keeps it and the others get a hash suffix of their own policy key.
    Renamed actions never take a name that another action claims as its own.
    """
    natural: dict[NameKey, str] = {}
    for request in requests:
        key = (request.source_id, request.action_id)
        if key in natural:
            raise ValueError(f"duplicate action {policy_key(*key)!r} in name requests")
        natural[key] = tool_name(request.namespace, request.action_id)

    ordered = sorted(natural)
    holders: dict[str, NameKey] = {}
    for key in ordered:
        holders.setdefault(natural[key], key)

    taken = set(holders)
    names: dict[NameKey, str] = {}
    warnings: list[str] = []
    for key in ordered:
        name = natural[key]
        holder = holders[name]
        if holder == key:
            names[key] = name
            continue
        renamed = _renamed(name, policy_key(*key), taken)
        taken.add(renamed)
        names[key] = renamed
        warnings.append(
            f"tool name collision on {name!r}: {policy_key(*holder)} keeps {name!r}, "
            f"{policy_key(*key)} is renamed {renamed!r}"
        )
    return NameAssignment(names=names, warnings=warnings)
