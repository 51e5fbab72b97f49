"""Host-safe tool names: `<namespace>__<action_id>`, sanitised, capped and collision-free."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
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


def _is_form_of(name: str, base: str) -> bool:
    """Whether `name` is `base`, or `base` renamed with a hash suffix (see `_renamed`)."""
    if name == base:
        return True
    stem = base[: MAX_TOOL_NAME - _HASH_LENGTH - 1]
    return name.startswith(stem + "_") and re.fullmatch(r"[0-9a-f]{8}", name[len(stem) + 1 :]) is not None


def _renamed(name: str, key: str, taken: set[str], owned: Collection[str] = ()) -> str:
    """A free name for the action `key` that cannot have `name`: `name` plus a hash of `key`, rehashed until free
    (or until one the action was given before, in `owned`)."""
    attempt = 0
    while True:
        seed = key if attempt == 0 else f"{key}#{attempt}"
        candidate = _with_suffix(name, _short_hash(seed))
        if candidate in owned or candidate not in taken:
            return candidate
        attempt += 1


def assign_tool_names(requests: Iterable[NameRequest], kept: Mapping[str, NameKey] | None = None) -> NameAssignment:
    """Give every action a distinct host name, independently of the order of `requests`.

    Each action claims its `tool_name`. `kept` holds the names given before (the ledger's): a kept name stays with
    its action, listed now or not, so a source added later, or listing first, never takes it over; the later
    claimant is renamed. A name nobody keeps that several actions claim goes to none of them: each gets a
    source-qualified name (`<source_id>__<name>`, hashed when that is still not unique), so no order of
    configuration or start-up decides who answers to it. Renamed actions never take a name that another action
    claims or keeps, and one renamed before gets the same name again.
    """
    kept = kept or {}
    natural: dict[NameKey, str] = {}
    for request in requests:
        key = (request.source_id, request.action_id)
        if key in natural:
            raise ValueError(f"duplicate action {policy_key(*key)!r} in name requests")
        natural[key] = tool_name(request.namespace, request.action_id)

    claimants: dict[str, list[NameKey]] = {}
    for key in sorted(natural):
        claimants.setdefault(natural[key], []).append(key)
    owned: dict[NameKey, list[str]] = {}
    for name, holder in sorted(kept.items()):
        owned.setdefault(holder, []).append(name)
    names: dict[NameKey, str] = {}
    losers: list[NameKey] = []
    for key in sorted(natural):
        name = natural[key]
        keeper = kept.get(name)
        if keeper == key:
            names[key] = name
        elif keeper is None and len(claimants[name]) == 1:
            # Alone now; but an action listed under a qualified name before keeps that one.
            qualified = tool_name(key[0], name)
            names[key] = next((n for n in owned.get(key, ()) if _is_form_of(n, qualified)), name)
        else:
            losers.append(key)

    taken = {*kept, *claimants, *names.values()}
    qualified_names = {key: tool_name(key[0], natural[key]) for key in losers}
    contested = Counter(qualified_names.values())
    warnings: list[str] = []
    for key in losers:
        name = qualified_names[key]
        mine = owned.get(key, [])
        if name not in mine and (name in taken or contested[name] > 1):
            name = _renamed(name, policy_key(*key), taken, mine)
        taken.add(name)
        names[key] = name
        claimed = natural[key]
        keeper = kept.get(claimed)
        if keeper is not None:
            why = f"it was given to {policy_key(*keeper)}, which keeps it"
        else:
            others = [policy_key(*k) for k in claimants[claimed] if k != key]
            why = f"{', '.join(others)} also claim(s) it, so none gets it"
        warnings.append(f"tool name collision on {claimed!r}: {why}; {policy_key(*key)} is listed as {name!r}")
    return NameAssignment(names=names, warnings=warnings)
