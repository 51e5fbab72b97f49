"""`bastion`: the command line. It parses arguments, asks the composition root (`bastion.assembly`) and prints.

`app` holds the typer application and what commands share to declare themselves; each other module registers one
command group on it when imported: `serve`, `inspect` (catalog, connectors, invocations, init), `audit` (+
`invocations reconcile`), `anchors` (`audit key`, `audit anchor`), `doctor`, `approvals` (+ `watch`, which runs in
`watch`), `grants`, `pins`, `tokens` and `actions`. Exit statuses: 0 success, 1 a refused operation, 2 a usage or
config error.

Importing them is cheap, so `bastion --help` answers at once: a command imports what it runs on (`compose`: the
configuration, the ledger, the gateway; the server, the pipeline, the sources) inside its body.
tests/test_cli_imports.py holds every module to it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# Each module registers its commands on `app` when imported; this order is the order of `bastion --help`.
# isort: off
from bastion.cli import serve, inspect, audit, anchors, doctor, approvals, grants, pins, tokens, actions

# isort: on
import typer
import typer.main
from typer._click.core import Command
from typer.core import TyperGroup

from bastion.cli.app import HELP_FLAGS, JSON_FLAG, USAGE_ERROR, Exit, app, emit_json, err
from bastion.cli.logs import LOG_LEVEL_ENV_VAR, configure_logging, parse_level
from bastion.program import NAME

__all__ = ["app", "help_of", "main"]

COMMAND_GROUPS = (serve, inspect, audit, anchors, doctor, approvals, grants, pins, tokens, actions)
PROG_NAME = NAME
COMPLETION_ENV_VAR = f"_{PROG_NAME.upper()}_COMPLETE"
"""What click's shell completion sets when a shell asks `bastion` to complete a word."""


def help_of(words: Sequence[str], *, group: bool = False, root: Command | None = None) -> str | None:
    """What `bastion WORDS --help` prints when WORDS name a command, formatted by click as when it parses that line,
    but without processing the options of the groups on the way: typer coerces each through pydantic, whose import
    would double the time `--help` takes. None when a word names no command; with `group`, also when WORDS name a
    command that is not a group (a group run without its command shows its help). `root`: `app`'s command, when the
    caller has it built already (building it takes a tenth of what `--help` takes)."""
    command = root if root is not None else typer.main.get_command(app)
    context = command.context_class(command, info_name=PROG_NAME, **command.context_settings)
    for word in words:
        found = command.get_command(context, word) if isinstance(command, TyperGroup) else None
        if found is None:
            return None
        command = found
        context = command.context_class(command, info_name=word, parent=context, **command.context_settings)
    if group and not isinstance(command, TyperGroup):
        return None
    return command.get_help(context)


def main() -> None:
    """Console entry point: errors as `error: ...` lines on stderr, or under `--json` as JSON on stdout."""
    args = sys.argv[1:]
    as_json = JSON_FLAG in args
    try:
        level = parse_level(os.environ.get(LOG_LEVEL_ENV_VAR))
    except ValueError as exc:
        if as_json:
            emit_json({"error": {"class": USAGE_ERROR, "message": str(exc)}})
        else:
            err.print(f"error: {exc}", markup=False, highlight=False)
        raise SystemExit(2) from None
    root = typer.main.get_command(app)  # once, for help answered at once and for the command line's parse
    # Help answered at once (`help_of`); not while a shell completes a word, which runs `bastion` alone with this set.
    if COMPLETION_ENV_VAR not in os.environ:
        asked = bool(args) and args[-1] in HELP_FLAGS
        shown = help_of(args[:-1], root=root) if asked else help_of(args, group=True, root=root)
        if shown is not None:  # asked for, or a group without its command: a usage error (exit 2), shown on stdout
            sys.stdout.write(shown + "\n")
            raise SystemExit(0 if asked else 2)
    configure_logging(level)
    try:
        # Under --json, typer hands usage errors back (not standalone) so that they are printed as JSON too.
        status = root(prog_name=PROG_NAME, standalone_mode=not as_json)
    except Exit as exc:
        if as_json:
            emit_json(exc.json())
        else:
            err.print(str(exc), markup=False, highlight=False)
        raise SystemExit(exc.code) from None
    except typer.TyperException as exc:  # --json only: a usage error found while parsing the command line
        emit_json({"error": {"class": USAGE_ERROR, "message": exc.format_message()}})
        raise SystemExit(exc.exit_code) from None
    raise SystemExit(status if isinstance(status, int) else 0)
