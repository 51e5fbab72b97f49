"""Tables for people that fit the terminal: what identifies a row is never cut, long text gives way.

An id (an invocation id, a policy key, a connector or token name) is printed whole on one line at any width,
so that it can be copied into the next command; short fixed words (statuses, modes, risks) stay whole too; long
text (tool names, errors, sessions) is cut to one line with an ellipsis. When that does not fit, the columns
marked optional are left out, the last one first; then timestamps put their time under their date. Rows have
no borders, so a copied line holds only the values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text

Kind = Literal["id", "word", "time", "text"]

_TEXT_MIN: Final = 12
"""The narrowest a text column is worth showing; optional columns are left out before text gets narrower."""
_STACKED_TIME: Final = 10
"""A timestamp with its time under its date: `2026-01-31` over `12:00:00`."""
_GAP: Final = 3
"""The space between two columns (padding and the blank border)."""


@dataclass(frozen=True)
class Column:
    """A column: its header, how its values give way to a narrow terminal, and whether it may be left out."""

    header: str
    kind: Kind = "text"
    optional: bool = False


def fitted_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    width: int,
    title: str | None = None,
    row_styles: Sequence[str | None] | None = None,
) -> Table:
    """A table of `rows` (one string per column) for a terminal `width` columns wide."""
    from rich import box
    from rich.cells import cell_len
    from rich.table import Table

    natural = [
        max(cell_len(line) for line in [c.header, *(_shown(r[i], c.kind, stacked=False) for r in rows)])
        for i, c in enumerate(columns)
    ]
    shown = list(range(len(columns)))
    while _needed(columns, natural, shown, stacked=False) > width:
        optional = [i for i in shown if columns[i].optional]
        if not optional:
            break
        shown.remove(optional[-1])
    stacked = _needed(columns, natural, shown, stacked=False) > width
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i in shown:
        kind = columns[i].kind
        table.add_column(columns[i].header, no_wrap=kind != "text", min_width=natural[i] if kind == "id" else None)
    for n, row in enumerate(rows):
        style = row_styles[n] if row_styles is not None else None
        table.add_row(*(_cell(row[i], columns[i].kind, stacked=stacked) for i in shown), style=style)
    return table


def _needed(columns: Sequence[Column], natural: list[int], shown: list[int], *, stacked: bool) -> int:
    """The narrowest the shown columns can be without cutting what must stay whole."""
    widths = []
    for i in shown:
        kind = columns[i].kind
        if kind == "text":
            widths.append(min(natural[i], _TEXT_MIN))
        elif kind == "time" and stacked:
            widths.append(min(natural[i], _STACKED_TIME))
        else:
            widths.append(natural[i])
    return sum(widths) + _GAP * max(0, len(shown) - 1)


def _shown(value: str, kind: Kind, *, stacked: bool) -> str:
    """What a cell shows of a value: a stacked timestamp on two lines, long text on its first line only."""
    if kind == "time":
        return value.replace(" ", "\n", 1) if stacked else value
    if kind != "text":
        return value
    first, _, rest = value.partition("\n")
    return first + (" …" if rest.strip() else "")


def _cell(value: str, kind: Kind, *, stacked: bool) -> Text:
    """A cell as plain text (never markup); long text stays on one line, cut with an ellipsis when it must."""
    from rich.text import Text

    shown = _shown(value, kind, stacked=stacked)
    return Text(shown, no_wrap=True, overflow="ellipsis") if kind == "text" else Text(shown)
