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
from pathlib import Path
from typing import Annotated, Any, Final

import typer
from rich.console import Console
from typer.core import TyperOption

from bastion import __version__
from bastion.errors import BastionError, ConfigError

USAGE_ERROR: Final = "usage_error"
"""The error class of a command line used wrongly (exit 2), in `--json` error output."""
JSON_FLAG: Final = "--json"
URL_ENV_VAR: Final = "BASTION_URL"
TOKEN_ENV_VAR: Final = "BASTION_TOKEN"
TIME_FORMAT: Final = "%Y-%m-%d %H:%M:%S"


def _flags_shown_as_flags() -> None:
    """typer's help writes `<bool>` beside every flag (`--json <bool>`), as if it took a value; a flag takes none,
    so its type column is left empty, as click's own help does."""
    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_shown_as_flags()

app = typer.Typer(
    help="Bastion: one policy-gated, audited MCP gateway for your agents' side effects.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

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
