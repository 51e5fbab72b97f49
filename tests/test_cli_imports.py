"""`bastion --help`, `--version` and the help of every command answer without importing what the commands run on:
the server, the ledger, the pipeline, the sources and their libraries take a second or more to import.

Each probe runs in a fresh interpreter and reports the modules it ended up with; no timing is asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "bastion.assembly",
    "bastion.config",
    "bastion.ledger",
    "bastion.models",
    "bastion.pipeline",
    "bastion.server",
    "bastion.sources",
)
"""Bastion's packages behind the commands (`bastion.config` compiles CEL, `bastion.models` builds pydantic models)."""
HEAVY_LIBRARIES = ("aiosqlite", "cryptography", "httpx2", "mcp", "opentelemetry", "psycopg", "starlette", "uvicorn")
PRINTING_LIBRARIES = ("pydantic", "rich")
"""What help does without: click formats it, and no option is coerced (typer coerces through pydantic)."""

REPORT = (
    "heavy = sorted(m for m in sys.modules if m.startswith(HEAVY) or m.split('.')[0] in HEAVY_LIBRARIES)\n"
    "print(json.dumps(heavy), file=sys.stderr)\n"
)


def _heavy_modules_after(program: str, libraries: tuple[str, ...] = HEAVY_LIBRARIES) -> list[str]:
    """The heavy modules a fresh interpreter holds after running `program`, which prints what it shows on stdout."""
    setup = f"import json, sys\nHEAVY = {HEAVY!r}\nHEAVY_LIBRARIES = {libraries!r}\n"
    done = subprocess.run(
        [sys.executable, "-c", setup + program + REPORT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the probe showed nothing"
    imported: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return imported


@pytest.mark.parametrize(
    "args",
    [["--version"], ["-V"], ["--help"], ["-h"], ["audit", "--help"], ["tokens", "-h"], ["approvals", "approve", "-h"]],
)
def test_the_entry_point_answers_help_and_version_without_importing_the_commands_machinery(args: list[str]) -> None:
    program = (
        f"sys.argv = ['bastion', *{args!r}]\n"
        "from bastion.launcher import main\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert exit.code in (0, None), exit.code\n"
    )
    assert _heavy_modules_after(program, HEAVY_LIBRARIES + PRINTING_LIBRARIES) == []


def test_the_help_of_every_command_imports_nothing_it_runs_on() -> None:
    """Every command, group and subcommand, found in the typer app, so that a new one is held to it too."""
    program = (
        "import typer, typer.core, typer.main\n"
        "from typer.testing import CliRunner\n"
        "from bastion.cli import app\n"
        "def walk(command, path, parent):\n"
        "    context = typer.Context(command, parent=parent, info_name=path[-1] if path else 'bastion')\n"
        "    yield path\n"
        "    if isinstance(command, typer.core.TyperGroup):\n"
        "        for name in command.list_commands(context):\n"
        "            yield from walk(command.get_command(context, name), [*path, name], context)\n"
        "paths = list(walk(typer.main.get_command(app), [], None))\n"
        "assert len(paths) > 30, paths\n"
        "for path in paths:\n"
        "    shown = CliRunner().invoke(app, [*path, '--help'], prog_name='bastion')\n"
        "    assert shown.exit_code == 0, (path, shown.output)\n"
        "print(len(paths), 'helps shown')\n"
    )
    assert _heavy_modules_after(program) == []
