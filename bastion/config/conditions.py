"""Argument-level conditions of policy rules: CEL expressions over a call's arguments (`args`).

CEL is evaluated by `common-expression-language` (Python bindings of the Rust `cel` crate): maintained, typed,
Apache-2.0, no dependency on protobuf, and fast enough to run on every call. CEL always terminates, so what a
condition can cost is bounded by its size and the size of the arguments, raised to the power of its
comprehensions (`all`, `exists`, `exists_one`, `map`, `filter`); that estimate is checked before each evaluation,
and a condition over the limit is not evaluated. A condition that does not compile, costs too much, fails (a
missing key, a wrong type) or does not give a boolean is *undecided*, which resolution turns into the stricter
mode (see `bastion.policies.resolve_mode`). So is one that compares values of different JSON types with `==`, `!=`
or `in` (`args.n == 5` with `"5"`), where CEL would say false (or true, for `!=`): a departure from the spec, on
purpose (bastion.config.strict_cel).

Beside CEL's own functions a condition may call `normpath(path)`: the path with repeated slashes, `.` and `..`
resolved (`normpath("/srv/public/../../etc/x") == "/etc/x"`), so a prefix test cannot be walked out of. A rule that
tests a raw prefix of a path-like argument (`args.path.startsWith(...)`) is reported as a problem naming that fix.
"""

from __future__ import annotations

import logging
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import cel

from bastion.config.strict_cel import FUNCTIONS as STRICT_COMPARISONS
from bastion.config.strict_cel import UncheckedSyntax, strict_comparisons
from bastion.models import PolicyRule

logger = logging.getLogger(__name__)

MAX_CONDITION_CHARS: Final = 2000
"""The longest condition accepted: conditions are policy, meant to be read by people."""
COST_LIMIT: Final = 1_000_000
"""The most a condition may cost on one call, in units of (its length) x (nodes of the arguments) ** (its
comprehensions)."""
_EVALUATION_ERRORS: Final = (LookupError, ArithmeticError, TypeError, ValueError, RuntimeError)
"""What the evaluator raises for a condition that fails on a call (a missing key, a wrong type, a division by 0)."""
_COMPREHENSION: Final = re.compile(r"\.\s*(?:all|exists_one|exists|map|filter)\s*\(")
_RAW_PATH_PREFIX: Final = re.compile(
    r"\bargs\.(\w*(?:path|file|dir|directory|folder|destination|source|target|cwd|root)\w*)\s*\.\s*startsWith\s*\(",
    re.IGNORECASE,
)
"""A prefix test of a path-like argument as sent: `/srv/public/../../etc/passwd` starts with `/srv/public/`."""
_SLASHES: Final = re.compile(r"/{2,}")


def normpath(path: object) -> str:
    """The `normpath` of conditions: `path` with repeated slashes, `.` and `..` resolved; an absolute path never
    climbs above `/`, a relative one keeps the `..` it starts with (`normpath("a/../../b") == "../b"`)."""
    if not isinstance(path, str):
        raise TypeError(f"normpath takes a string, not {type(path).__name__}")
    if not path:
        return path
    return posixpath.normpath(_SLASHES.sub("/", path))


_FUNCTIONS: Final = {"normpath": normpath, **STRICT_COMPARISONS}


class ConditionError(ValueError):
    """A condition that does not compile: the message says what is wrong."""


@dataclass(frozen=True)
class Condition:
    """A compiled condition and what bounds its cost."""

    text: str
    program: cel.Program
    comprehensions: int

    def cost(self, arguments: Any) -> int:
        """The estimated cost of evaluating it over `arguments` (see COST_LIMIT)."""
        return int(len(self.text) * max(1, _nodes(arguments)) ** self.comprehensions)


def compile_condition(text: str) -> Condition:
    """Compile a condition; ConditionError (naming the problem) when it is too long or not valid CEL."""
    if len(text) > MAX_CONDITION_CHARS:
        raise ConditionError(f"the condition is {len(text)} characters long; keep it under {MAX_CONDITION_CHARS}")
    if not text.strip():
        raise ConditionError("the condition is empty; write a CEL expression over args, e.g. 'args.n < 10'")
    try:
        cel.compile(text)
    except ValueError as exc:  # the parser's message: position and what it expected
        raise ConditionError(f"not a valid CEL expression: {str(exc).strip()}") from exc
    try:
        program = cel.compile(strict_comparisons(text))
    except (UncheckedSyntax, ValueError) as exc:
        raise ConditionError(
            f"{exc}: Bastion checks that every comparison is between values of one JSON type, and cannot here; "
            "write the condition without it"
        ) from exc
    return Condition(text=text, program=program, comprehensions=len(_COMPREHENSION.findall(text)))


def rule_problems(rule: PolicyRule, known_key: re.Pattern[str], modes: tuple[str, ...]) -> list[tuple[str, str]]:
    """What is wrong with a rule, as (its field, the message naming the fix); the loader adds file and line."""
    problems: list[tuple[str, str]] = []
    if not known_key.match(rule.key):
        problems.append(("key", f'rule key "{rule.key}" is not a policy key; write "source:action" or "source:*"'))
    if rule.mode not in modes:
        problems.append(
            (
                "mode",
                f'rule mode "{rule.mode}" is not a mode; use allow, require_approval or deny (until then it '
                "resolves to deny)",
            )
        )
    try:
        compile_condition(rule.when)
    except ConditionError as exc:
        problems.append(
            (
                "when",
                f"rule condition for {rule.key}: {exc} (until then it is undecided on every call, "
                "which resolves to the stricter mode)",
            )
        )
    problems.extend(("when", f"rule condition for {rule.key} {problem}") for problem in raw_path_prefixes(rule.when))
    return problems


def raw_path_prefixes(text: str) -> list[str]:
    """For each path-like argument whose raw prefix the condition tests, what is wrong and the fix (a sentence
    without its subject: "tests a raw prefix of args.path, ...")."""
    return [
        f"tests a raw prefix of args.{name}, which a path with `..` or `//` passes while pointing elsewhere; "
        f"compare the normalised path: normpath(args.{name}).startsWith(...)"
        for name in dict.fromkeys(_RAW_PATH_PREFIX.findall(text))
    ]


class Conditions:
    """The policy's conditions, compiled once, judged on a call's arguments."""

    def __init__(self, rules: list[PolicyRule]) -> None:
        self._compiled: dict[str, Condition | None] = {}
        for rule in rules:
            if rule.when not in self._compiled:
                try:
                    self._compiled[rule.when] = compile_condition(rule.when)
                except ConditionError:  # reported by the loader with file and line; undecided on every call
                    self._compiled[rule.when] = None

    def holds(self, rule: PolicyRule, arguments: Mapping[str, Any]) -> bool | None:
        """Whether the rule's condition holds for these arguments; None when it is undecided (see the module)."""
        condition = self._compiled.get(rule.when)
        if condition is None:
            condition = self._compile_late(rule.when)
            if condition is None:
                return None
        cost = condition.cost(arguments)
        if cost > COST_LIMIT:
            logger.warning("policy condition for %s not evaluated: its cost %d is over %d", rule.key, cost, COST_LIMIT)
            return None
        try:
            verdict = condition.program.execute({"args": dict(arguments), **_FUNCTIONS})
        except _EVALUATION_ERRORS as exc:
            logger.info("policy condition for %s failed on this call: %s", rule.key, exc)
            return None
        if not isinstance(verdict, bool):
            logger.info("policy condition for %s gave %r, not a boolean", rule.key, type(verdict).__name__)
            return None
        return verdict

    def _compile_late(self, text: str) -> Condition | None:
        if text in self._compiled:
            return None
        try:
            condition: Condition | None = compile_condition(text)
        except ConditionError:
            condition = None
        self._compiled[text] = condition
        return condition


def _nodes(value: Any) -> int:
    """How many JSON values `value` holds, itself included (strings count by length: CEL's string functions scan
    them)."""
    if isinstance(value, Mapping):
        return 1 + sum(1 + _nodes(item) for item in value.values())
    if isinstance(value, list):
        return 1 + sum(_nodes(item) for item in value)
    if isinstance(value, str):
        return 1 + len(value) // 64
    return 1
