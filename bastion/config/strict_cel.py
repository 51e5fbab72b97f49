"""Comparisons that fail closed: a condition rewritten so that `==`, `!=` and `in` between different JSON types are
undecided instead of false (or true).

CEL defines `==` between values of different types as false, and `!=` as true. For policy that is a way around a
rule: `args.n == 5` does not hold for `"5"`, so a deny does not fire, and `args.env != "prod"` holds for `["prod"]`,
so an allow opens. Bastion departs from the spec on purpose: a comparison whose operands have different JSON types
(null, boolean, number, string, array, object; integers and floats are both numbers) raises, which makes the
condition undecided, and an undecided condition takes the stricter mode. Arrays and objects compare element by
element under the same rule; `x in list` needs every element to be of `x`'s type, `x in map` a string `x`.

The evaluator (the `cel` package) cannot override its operators, so the condition's text is parsed here (a small
Pratt parser of CEL's expression grammar) and written back with each comparison as a call of a function of
Bastion's (`FUNCTIONS`), every other node as it was, parenthesised. What this parser does not know (CEL's message
construction, a leading-dot name) is refused as a problem of the condition: it never silently compares the
spec's way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

EQUAL: Final = "__bastion_equal"
UNEQUAL: Final = "__bastion_unequal"
MEMBER: Final = "__bastion_in"

_TOKEN: Final = re.compile(
    r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<string>(?:[rR][bB]?|[bB][rR]?)?
        (?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"|'(?:\\.|[^\\'\n])*'|"(?:\\.|[^\\"\n])*"))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[uU]?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<operator>\|\||&&|==|!=|<=|>=|[<>+\-*/%!?:.,\[\](){}])
    """,
    re.VERBOSE | re.DOTALL,
)

_BINARY: Final[dict[str, int]] = {
    "||": 1,
    "&&": 2,
    "==": 3,
    "!=": 3,
    "<": 3,
    "<=": 3,
    ">": 3,
    ">=": 3,
    "in": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
}
"""Binding power of CEL's binary operators (the ternary `?:` binds loosest, unary operators tightest)."""
_REWRITTEN: Final = {"==": EQUAL, "!=": UNEQUAL, "in": MEMBER}


class UncheckedSyntax(ValueError):
    """A condition this module cannot rewrite (the message says what); the condition is then a problem."""


@dataclass
class _Tokens:
    items: list[tuple[str, str]]
    at: int = 0

    def peek(self) -> tuple[str, str] | None:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise UncheckedSyntax("the condition ends too early")
        self.at += 1
        return token

    def expect(self, text: str) -> None:
        _, value = self.take()
        if value != text:
            raise UncheckedSyntax(f"expected {text!r}, found {value!r}")

    def next_is(self, text: str) -> bool:
        token = self.peek()
        return token is not None and token[1] == text and token[0] in ("operator", "name")


def strict_comparisons(text: str) -> str:
    """`text` with every `==`, `!=` and `in` a call of Bastion's strict comparisons; UncheckedSyntax when it uses
    CEL this parser does not know."""
    tokens = _Tokens(_tokenize(text))
    rewritten = _expression(tokens, 0)
    if tokens.peek() is not None:
        raise UncheckedSyntax(f"unexpected {tokens.peek()[1]!r}")  # type: ignore[index]
    return rewritten


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    at = 0
    while at < len(text):
        found = _TOKEN.match(text, at)
        if found is None:
            raise UncheckedSyntax(f"unexpected character {text[at]!r} at {at}")
        kind = found.lastgroup
        assert kind is not None
        if kind != "space":
            tokens.append((kind, found.group()))
        at = found.end()
    return tokens


def _expression(tokens: _Tokens, power: int) -> str:
    left = _unary(tokens)
    while True:
        token = tokens.peek()
        if token is None:
            return left
        kind, value = token
        if value == "?" and power == 0:
            tokens.take()
            yes = _expression(tokens, 0)
            tokens.expect(":")
            no = _expression(tokens, 0)
            left = f"({left} ? {yes} : {no})"
            continue
        binding = _BINARY.get(value) if kind in ("operator", "name") else None
        if binding is None or binding <= power:
            return left
        tokens.take()
        right = _expression(tokens, binding)
        function = _REWRITTEN.get(value)
        left = f"{function}({left}, {right})" if function else f"({left} {value} {right})"


def _unary(tokens: _Tokens) -> str:
    if tokens.next_is("!") or tokens.next_is("-"):
        operator = tokens.take()[1]
        following = tokens.peek()
        if operator == "-" and following is not None and following[0] == "number":
            return _postfix(tokens, "-" + tokens.take()[1])  # a negative literal (-9223372036854775808 included)
        return f"{operator}({_unary(tokens)})"
    return _postfix(tokens, _primary(tokens))


def _primary(tokens: _Tokens) -> str:
    kind, value = tokens.take()
    if kind in ("string", "number"):
        return value
    if kind == "name":
        if value == "in":
            raise UncheckedSyntax("'in' without a left operand")
        if tokens.next_is("("):
            tokens.take()
            return f"{value}({_items(tokens, ')')})"
        if tokens.next_is("{"):
            raise UncheckedSyntax(f"message construction ({value}{{...}}) is not supported in conditions")
        return value
    if value == "(":
        inner = _expression(tokens, 0)
        tokens.expect(")")
        return f"({inner})"
    if value == "[":
        return f"[{_items(tokens, ']')}]"
    if value == "{":
        return "{" + _entries(tokens) + "}"
    if value == ".":
        raise UncheckedSyntax("a name with a leading dot is not supported in conditions")
    raise UncheckedSyntax(f"unexpected {value!r}")


def _postfix(tokens: _Tokens, operand: str) -> str:
    while True:
        if tokens.next_is("."):
            tokens.take()
            kind, field = tokens.take()
            if kind != "name":
                raise UncheckedSyntax(f"expected a field name after '.', found {field!r}")
            if tokens.next_is("("):
                tokens.take()
                operand = f"{operand}.{field}({_items(tokens, ')')})"
            else:
                operand = f"{operand}.{field}"
        elif tokens.next_is("["):
            tokens.take()
            index = _expression(tokens, 0)
            tokens.expect("]")
            operand = f"{operand}[{index}]"
        else:
            return operand


def _items(tokens: _Tokens, closing: str) -> str:
    """A comma-separated list of expressions up to `closing` (its opening token already taken)."""
    items: list[str] = []
    while not tokens.next_is(closing):
        items.append(_expression(tokens, 0))
        if not tokens.next_is(","):
            break
        tokens.take()
    tokens.expect(closing)
    return ", ".join(items)


def _entries(tokens: _Tokens) -> str:
    entries: list[str] = []
    while not tokens.next_is("}"):
        key = _expression(tokens, 0)
        tokens.expect(":")
        entries.append(f"{key}: {_expression(tokens, 0)}")
        if not tokens.next_is(","):
            break
        tokens.take()
    tokens.expect("}")
    return ", ".join(entries)


# -- the comparisons ---------------------------------------------------------------------------------------------


def json_type(value: Any) -> str:
    """The JSON type of a value as CEL hands it to Python (a non-JSON value, e.g. a timestamp, is its own type)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _equal(a: Any, b: Any) -> bool:
    kind = json_type(a)
    if kind != json_type(b):
        raise TypeError(f"compares a {kind} with a {json_type(b)}")
    # Every pair is compared (a list, not a short-circuiting all()): a mismatch of types anywhere is undecided,
    # even after a pair that already differs.
    if kind == "array":
        return len(a) == len(b) and all([_equal(x, y) for x, y in zip(a, b, strict=True)])
    if kind == "object":
        return a.keys() == b.keys() and all([_equal(a[key], b[key]) for key in a])
    return bool(a == b)


def _unequal(a: Any, b: Any) -> bool:
    return not _equal(a, b)


def _member(item: Any, container: Any) -> bool:
    kind = json_type(container)
    if kind == "object":
        if not isinstance(item, str):
            raise TypeError(f"looks for a {json_type(item)} among an object's keys")
        return item in container
    if kind != "array":
        raise TypeError(f"'in' needs a list or a map, not a {kind}")
    wanted = json_type(item)
    for element in container:  # every element first: a match early in the list must not hide a mismatch later
        if json_type(element) != wanted:
            raise TypeError(f"looks for a {wanted} in a list holding a {json_type(element)}")
    return any(_equal(item, element) for element in container)


FUNCTIONS: Final[dict[str, Callable[..., bool]]] = {EQUAL: _equal, UNEQUAL: _unequal, MEMBER: _member}
"""What a rewritten condition calls: given to every evaluation beside `args`."""
