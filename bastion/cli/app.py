"""The typer application every command group registers on, and what commands share to declare themselves and to
print: options, output, exit statuses.

Cheap to import, as every command module is at its top: `bastion --help` reads them all. What commands run on (the
configuration, the ledger, the gateway: `bastion.cli.compose`) is imported inside their bodies.

Exit statuses: 0 success, 1 a refused operation (not found, conflict, expired), 2 a usage or config error.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from bastion import __version__
from bastion.errors import BastionError, ConfigError

if TYPE_CHECKING:
    from rich.console import Console

USAGE_ERROR: Final = "usage_error"
"""The error class of a command line used wrongly (exit 2), in `--json` error output."""
JSON_FLAG: Final = "--json"
URL_ENV_VAR: Final = "BASTION_URL"
TOKEN_ENV_VAR: Final = "BASTION_TOKEN"
TIME_FORMAT: Final = "%Y-%m-%d %H:%M:%S"
HELP_FLAGS: Final = ("-h", "--help")


HELP_SETTINGS: Final[dict[str, Any]] = {
    "no_args_is_help": True,
    # click's own help: plain text, prose rewrapped to the terminal up to 80 columns, a flag shown without a value.
    # typer's rich help would import rich.markdown and its parser on every `--help` (a third of its time here).
    "rich_markup_mode": None,
}
"""What the application and each command group share: a group run without a command shows its help."""

app = typer.Typer(
    help="Bastion: one policy-gated, audited MCP gateway for your agents' side effects.",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": list(HELP_FLAGS)},
    **HELP_SETTINGS,
)


def command_group(name: str, help: str) -> typer.Typer:
    """A command group (`bastion NAME COMMAND`), registered on `app`."""
    group = typer.Typer(help=help, **HELP_SETTINGS)
    app.add_typer(group, name=name)
    return group


class Printer:
    """Where a command prints for people: a rich console, made when first used. Help is click's and prints none,
    and importing rich would add a sixth to the time `--help` takes."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr

    @cached_property
    def console(self) -> Console:
        from rich.console import Console

        return Console(stderr=self._stderr, soft_wrap=True)

    def print(self, *objects: Any, **options: Any) -> None:
        """`Console.print`: markup, highlighting and wrapping as rich does them unless `options` say otherwise."""
        self.console.print(*objects, **options)

    @property
    def width(self) -> int:
        return self.console.width

    @property
    def is_terminal(self) -> bool:
        return self.console.is_terminal


out = Printer()
err = Printer(stderr=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="Configuration directory (else $BASTION_CONFIG, ./bastion.toml, ~/.config/bastion)."
    ),
]
JsonOption = Annotated[
    bool, typer.Option(JSON_FLAG, help='Print JSON for scripts instead of text; errors too, as {"error": ...}.')
]
UrlOption = Annotated[
    str | None,
    typer.Option("--url", help=f"A remote Bastion's base URL, e.g. http://host:8765 (or ${URL_ENV_VAR})."),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        help=f"An owner or admin token (or ${TOKEN_ENV_VAR}): of the remote Bastion with --url; else of the local "
        "ledger, where deciding needs one once any owner or admin token exists.",
    ),
]


class Exit(Exception):
    """A clean stop: the line people see (`error: ...`), the exit status, and the error class for `--json`."""

    def __init__(self, message: str, code: int, error_class: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.error_class = error_class or (USAGE_ERROR if code == 2 else "refused")

    @classmethod
    def of(cls, exc: BastionError) -> Exit:
        """Bastion's error as an exit: a configuration error exits 2, any other refusal 1 (named by its class)."""
        if isinstance(exc, ConfigError):
            return cls(f"error: {exc.message}", 2, exc.error_class)
        return cls(f"error: {exc.error_class}: {exc.message}", 1, exc.error_class)

    def json(self) -> dict[str, Any]:
        """`{"error": {"class", "message"}}`: what `--json` prints instead of the line."""
        message = str(self).removeprefix("error: ").removeprefix(f"{self.error_class}: ")
        return {"error": {"class": self.error_class, "message": message}}


def _print_version(value: bool) -> None:
    if value:
        out.print(__version__, markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_print_version, is_eager=True, help="Print Bastion's version and exit."
        ),
    ] = False,
) -> None:
    """Options that come before any command."""


def emit_json(data: Any) -> None:
    """JSON for scripts: plain stdout, never wrapped or coloured."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def timestamp(moment: datetime) -> str:
    """A moment as people read it in tables (UTC, to the second)."""
    return moment.strftime(TIME_FORMAT)
