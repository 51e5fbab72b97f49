"""`[approvers]` of the policy files: how many distinct approvers a held call needs (two-person approval), checked
before the policy is validated.

A value that is not a whole number of approvers (`"two"`, `2.5`, `0`, `true`) is reported, naming the fix, and kept
as 0, which resolution turns into `deny` for the calls it names (mode source `invalid_approvers:<key>`): a typo in a
policy file must never open a door, and asking fewer approvers than the operator meant would.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bastion.config.models import PolicyConfig
from bastion.config.tomlpos import KeyPath, dotted_key
from bastion.models import TIERS

INVALID: Final = 0
"""What an invalid count is kept as: calls it names are denied."""
FIX: Final = "write 2 (two distinct approvers must approve each call) or 1 (one approver, the default)"


def approver_problems(
    data: dict[str, Any], policy_key: re.Pattern[str], line_of: Callable[[KeyPath], int]
) -> Iterator[tuple[int, str]]:
    """Check and normalise every `approvers` of one policy file's data (the org's and profiles' `[approvers]`
    tables, and each rule's `approvers`): yield (its line, what is wrong and the fix) for each problem. An invalid
    count is replaced by INVALID in `data`."""
    for path, message in _problems(data, policy_key):
        yield line_of(path), message


def _problems(data: dict[str, Any], policy_key: re.Pattern[str]) -> Iterator[tuple[KeyPath, str]]:
    tables: list[tuple[KeyPath, Any]] = [(("approvers",), data.get("approvers"))]
    rules: list[tuple[KeyPath, Any]] = [(("rules",), data.get("rules"))]
    profiles = data.get("profiles")
    for name, profile in profiles.items() if isinstance(profiles, dict) else ():
        if isinstance(profile, dict):
            tables.append((("profiles", name, "approvers"), profile.get("approvers")))
            rules.append((("profiles", name, "rules"), profile.get("rules")))
    for path, table in tables:
        if table is None:
            continue
        if not isinstance(table, dict):
            yield (
                path,
                (
                    f"[{dotted_key(path)}] must be a table of policy keys or tiers, e.g. "
                    f'{dotted_key(path)} = {{ "fs:delete_file" = 2, R4 = 2 }}'
                ),
            )
            continue
        for key, value in table.items():
            if not (policy_key.match(key) or key in TIERS):
                yield (
                    (*path, key),
                    (
                        f'[{dotted_key(path)}] key "{key}" is not a policy key or a risk tier; write "source:action", '
                        '"source:*" or a tier R0-R4 (e.g. R4 = 2)'
                    ),
                )
            if not _is_count(value):
                table[key] = INVALID
                yield (
                    (*path, key),
                    (
                        f'[{dotted_key(path)}] "{key}" = {_show(value)} is not a number of approvers; {FIX}. Until '
                        "then its calls are denied"
                    ),
                )
    for path, listed in rules:
        for i, rule in enumerate(listed if isinstance(listed, list) else []):
            if not isinstance(rule, dict) or "approvers" not in rule:
                continue
            if not _is_count(rule["approvers"]):
                yield (
                    (*path, i, "approvers"),
                    (
                        f"[[{dotted_key(path)}]] approvers = {_show(rule['approvers'])} is not a number of approvers; "
                        f"{FIX}. Until then the calls the rule matches are denied"
                    ),
                )
                rule["approvers"] = INVALID
            elif rule.get("mode") != "require_approval" and rule["approvers"] > 1:
                yield (
                    (*path, i, "approvers"),
                    (
                        f"[[{dotted_key(path)}]] approvers = {rule['approvers']} applies to calls held for approval, "
                        f'and this rule\'s mode is "{rule.get("mode")}"; set mode = "require_approval" or remove '
                        "approvers"
                    ),
                )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class _Placed:
    count: int
    file: Path
    line: int


class ApproverCounts:
    """The `[approvers]` of every policy file, merged: the organisation's and each profile's. A key set in two files
    keeps the larger count (an invalid one, 0, wins: its calls are denied), and is reported."""

    def __init__(self) -> None:
        self.org: dict[str, _Placed] = {}
        self.profiles: dict[str, dict[str, _Placed]] = {}

    def add(self, policy: PolicyConfig, file: Path, line_of: Callable[[KeyPath], int]) -> Iterator[tuple[int, str]]:
        """Merge one file's (validated) policy; yield (line, message) for each key another file set too."""
        tables: list[tuple[dict[str, _Placed], dict[str, int], KeyPath]] = [
            (self.org, policy.approvers, ("approvers",))
        ]
        for name, profile in policy.profiles.items():
            if profile.approvers:
                tables.append((self.profiles.setdefault(name, {}), profile.approvers, ("profiles", name, "approvers")))
        for merged, counts, table in tables:
            for key, count in counts.items():
                here = _Placed(count, file, line_of((*table, key)))
                earlier = merged.setdefault(key, here)
                if earlier is here:
                    continue
                kept = here if count == INVALID or (earlier.count != INVALID and count > earlier.count) else earlier
                merged[key] = kept
                yield (
                    here.line,
                    (
                        f'[{dotted_key(table)}] "{key}" is set in both {earlier.file.name}:{earlier.line} '
                        f"({earlier.count}) and {file.name}:{here.line} ({count}); {kept.count} applies. "
                        "Keep it in one file only"
                    ),
                )

    def of(self, profile: str | None) -> dict[str, int]:
        """The merged counts of the organisation (None) or of a profile."""
        placed = self.org if profile is None else self.profiles.get(profile, {})
        return {key: value.count for key, value in placed.items()}
