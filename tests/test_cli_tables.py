"""Tables for people at any terminal width: ids whole on one line, long text cut, optional columns left out."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from bastion.cli.tables import Column, fitted_table

COLUMNS = (
    Column("id", "id"),
    Column("created", "time"),
    Column("tool"),
    Column("status", "word"),
    Column("session", optional=True),
    Column("error"),
)
IDS = ("0190abcdef0123456789abcd", "0190abcdef0123456789abce")
ROWS = [
    (IDS[0], "2026-01-31 12:00:00", "connector__" + "t" * 60, "completed", "session-1", ""),
    (IDS[1], "2026-01-31 12:00:01", "notes__read", "failed", "s" * 50, "upstream_error: boom\nline two\nline three"),
]


def render(width: int) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(fitted_table(COLUMNS, ROWS, width=width, title="2 invocations"))
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(output, str)
    return output.splitlines()


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160])
def test_ids_stay_whole_on_one_line_at_every_width(width: int) -> None:
    lines = render(width)
    for invocation_id in IDS:
        assert sum(invocation_id in line for line in lines) == 1, "\n".join(lines)


@pytest.mark.parametrize("width", [60, 80, 100])
def test_long_text_is_cut_with_an_ellipsis_and_the_table_fits(width: int) -> None:
    lines = render(width)
    text = "\n".join(lines)
    assert "t" * 60 not in text
    assert "…" in text
    assert max(len(line) for line in lines) <= width, text


def test_a_wide_terminal_shows_everything_on_one_line_per_row() -> None:
    lines = render(240)
    row = next(line for line in lines if IDS[0] in line)
    assert "2026-01-31 12:00:00" in row
    assert "connector__" + "t" * 60 in row
    assert any("s" * 50 in line for line in lines)


def test_a_narrow_terminal_leaves_optional_columns_out_then_stacks_times() -> None:
    lines = render(80)
    assert not any("session" in line for line in lines)
    row = lines.index(next(line for line in lines if IDS[0] in line))
    assert "2026-01-31" in lines[row]
    assert "12:00:00" in lines[row + 1]


def test_only_the_first_line_of_a_multi_line_value_is_shown() -> None:
    text = "\n".join(render(200))
    assert "upstream_error: boom …" in text
    assert "line two" not in text


def test_values_are_never_read_as_markup() -> None:
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(fitted_table((Column("tool"),), [("[bold]x[/bold]",)], width=80))
    assert "[bold]x[/bold]" in console.file.getvalue()  # type: ignore[attr-defined]
