"""Tables of a pydantic model's fields for the reference pages: name, type, default and the field's docstring.

The docstrings are the string literals written under each field in the model's source (as the models of
bastion.config do): read from the class's syntax tree, so they need no runtime configuration of the models.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import re
import textwrap
import types
from collections.abc import Callable, Iterator, Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

Linker = Callable[[type[BaseModel]], str | None]
"""Where a nested model's own table is on the page (a Markdown link target), or None to name it only."""


def field_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Each field's docstring, from `model` and its bases, by field name."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        statements = body.body
        for here, after in itertools.pairwise(statements):
            if (
                isinstance(here, ast.AnnAssign)
                and isinstance(here.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[here.target.id] = inspect.cleandoc(after.value.value)
    return found


def class_doc(model: type[BaseModel]) -> str:
    """The model's own docstring, or nothing (never a base class's)."""
    doc = model.__dict__.get("__doc__")
    return prose(inspect.cleandoc(doc)) if isinstance(doc, str) else ""


def type_name(annotation: Any, link: Linker) -> str:
    """How a field's type reads on the page: `integer`, `list of string`, `"a" | "b"`, a link to a nested table."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return type_name(args[0], link)
    if origin is Literal:
        return " | ".join(f"`{json.dumps(value)}`" for value in args)
    if origin in (Union, types.UnionType):
        shown = [type_name(arg, link) for arg in args if arg is not type(None)]
        return " | ".join(shown) + (" or none" if type(None) in args else "")
    if origin in (list, tuple, set, frozenset):
        return f"list of {type_name(args[0], link)}" if args else "list"
    if origin is dict:
        return f"table of {type_name(args[1], link)}" if args else "table"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            target = link(annotation)
            return f"[{annotation.__name__}]({target})" if target else annotation.__name__
        if issubclass(annotation, Enum):
            return " | ".join(f"`{json.dumps(member.value)}`" for member in annotation)
        if issubclass(annotation, SecretStr):
            return "secret string"
        return _SCALARS.get(annotation, annotation.__name__)
    if annotation is Any:
        return "any"
    return str(annotation)


_SCALARS: Mapping[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    Path: "path",
}


def constraints(field: FieldInfo) -> list[str]:
    """The bounds and patterns a value must meet, as short phrases."""
    found: list[str] = []
    for item in _metadata(field):
        if isinstance(item, annotated_types.Gt):
            found.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Ge):
            found.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Lt):
            found.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.Le):
            found.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.MinLen) and item.min_length > 0:
            found.append(f"at least {item.min_length} long")
        elif isinstance(item, annotated_types.MaxLen):
            found.append(f"at most {item.max_length} long")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            found.append(f"matches `{pattern}`")
    return found


def _metadata(field: FieldInfo) -> Iterator[Any]:
    yield from field.metadata


def default_text(field: FieldInfo) -> str:
    """The default as it would be written in the file, or *required*."""
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    else:
        return "*required*"
    if isinstance(value, BaseModel):
        return "see its table"
    if value is None:
        return "none"
    return f"`{json.dumps(value, ensure_ascii=False)}`"


_CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)


def cell(text: str) -> str:
    """`text` fit for one cell of a Markdown table: one line, its pipes outside code spans escaped (MkDocs' tables
    never split a cell inside a code span, and would show a backslash written there)."""
    return " ".join(_outside_code(text, lambda part: part.replace("|", "\\|")).split())


def prose(text: str) -> str:
    """Plain text (a docstring, a help text) made safe to put in Markdown: outside its code spans, `<`, `>` and `*`
    are written so they are shown, not read as HTML or emphasis."""
    return _outside_code(text, _escaped)


def _outside_code(text: str, change: Callable[[str], str]) -> str:
    """`text` with `change` applied to what lies outside its code spans."""
    parts: list[str] = []
    last = 0
    for span in _CODE_SPAN.finditer(text):
        parts += [change(text[last : span.start()]), span.group(0)]
        last = span.end()
    parts.append(change(text[last:]))
    return "".join(parts)


def _escaped(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def field_table(model: type[BaseModel], link: Linker, *, by_alias: bool = False) -> str:
    """The Markdown table of `model`'s fields, in declaration order."""
    docs = field_docstrings(model)
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = field.alias if by_alias and field.alias else name
        kind = type_name(field.annotation, link)
        bounds = constraints(field)
        if bounds:
            kind += " (" + ", ".join(bounds) + ")"
        rows.append(f"| `{key}` | {cell(kind)} | {cell(default_text(field))} | {cell(prose(docs.get(name, '')))} |")
    return "\n".join(rows)


def undocumented(model: type[BaseModel]) -> list[str]:
    """The fields of `model` without a docstring, as `Model.field`."""
    docs = field_docstrings(model)
    return [f"{model.__name__}.{name}" for name in model.model_fields if name not in docs]
