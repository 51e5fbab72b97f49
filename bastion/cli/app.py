"""The typer application every command group registers on, and what the commands share: options,
output, exit statuses, and the composition config -> ledger -> gateway.

Exit statuses: 0 success, 1 a refused operation (not found, conflict, expired), 2 a usage or config error.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Final, TypeVar

import anyio
import typer
from rich.console import Console

from bastion.cli.logs import use_redactor
from bastion.config import Config, find_config_dir, load_config
from bastion.connectors import McpConnector
from bastion.errors import BastionError, ConfigError
from bastion.ledger import OpenLedger, Redactor
from bastion.ledger import open_ledger as ledger_at
from bastion.pipeline.gateway import Gateway

app = typer.Typer(
    help="Bastion: one policy-gated, audited MCP gateway for your agents' side effects.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
logger = logging.getLogger("bastion")

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="Configuration directory (else $BASTION_CONFIG, ./bastion.toml, ~/.config/bastion)."
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON instead of a table.")]
T = TypeVar("T")

PRINCIPAL_ENV_VAR: Final = "BASTION_PRINCIPAL"
TIME_FORMAT: Final = "%Y-%m-%d %H:%M:%S"


class Exit(Exception):
    """A clean stop with a message and an exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def run_async(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    """Run a command's async body, turning Bastion's errors into exit statuses (config 2, refusals 1)."""
    try:
        return anyio.run(fn, *args)
    except ConfigError as exc:
        raise Exit(f"error: {exc.message}", 2) from exc
    except BastionError as exc:
        raise Exit(f"error: {exc.error_class}: {exc.message}", 1) from exc


def emit_json(data: Any) -> None:
    """JSON for scripts: plain stdout, never wrapped or coloured."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def timestamp(moment: datetime) -> str:
    """A moment as people read it in tables (UTC, to the second)."""
    return moment.strftime(TIME_FORMAT)


def approver_principal() -> str:
    """Who decides from this command line: `$BASTION_PRINCIPAL`, else `local:<login name>`."""
    explicit = os.environ.get(PRINCIPAL_ENV_VAR, "").strip()
    if explicit:
        return explicit
    try:
        return f"local:{getpass.getuser()}"
    except (OSError, KeyError) as exc:  # no login name in the environment nor in the user database
        raise Exit(f"error: cannot tell who you are; set ${PRINCIPAL_ENV_VAR} to name the approver", 2) from exc


# -- composition ------------------------------------------------------------------------------------


def load(config_dir: Path | None, *, report: bool = True) -> Config:
    """Find and load the configuration as `serve` does; warn about skipped parts when `report`."""
    try:
        directory = find_config_dir(config_dir, env=os.environ, cwd=Path.cwd(), home=Path.home())
    except ConfigError as exc:
        raise Exit(f"error: {exc.message}", 2) from exc
    config = load_config(directory)
    if report:
        for issue in config.issues:
            err.print(f"warning: {issue} (this part of the configuration is skipped)", markup=False, highlight=False)
    return config


@asynccontextmanager
async def open_ledger(config: Config) -> AsyncIterator[OpenLedger]:
    """The configured ledger, closed on exit."""
    settings = config.settings.ledger
    redactor = Redactor(extra_secret_keys=settings.extra_secret_keys, max_bytes=settings.max_result_bytes)
    use_redactor(redactor)
    async with await ledger_at(config.ledger_url, redactor=redactor) as ledger:
        yield ledger


@asynccontextmanager
async def open_gateway(config: Config) -> AsyncIterator[Gateway]:
    """A running gateway over every configured connector (the disabled ones are not started) and the ledger."""
    list_timeout = config.settings.limits.list_timeout_seconds
    sources = [McpConnector(c, list_timeout=list_timeout) for c in config.connectors]
    async with open_ledger(config) as ledger:
        gateway = Gateway(config, ledger, sources)
        async with gateway.running():
            yield gateway
