"""`bastion`: the command line and the composition root (config -> ledger -> sources -> gateway -> server).

`app` holds the typer application and what commands share; each other module registers one command
group on it when imported: `serve`, `inspect` (catalog, connectors, invocations, doctor, init),
`approvals` (+ `watch`), `pins` and `tokens`. Exit statuses: 0 success, 1 a refused operation, 2 a usage or
config error.
"""

from __future__ import annotations

import os

# Each module registers its commands on `app` when imported; this order is the order of `bastion --help`.
# isort: off
from bastion.cli import serve, inspect, approvals, watch, pins, tokens

# isort: on
from bastion.cli.app import Exit, app, err
from bastion.cli.logs import LOG_LEVEL_ENV_VAR, configure_logging, parse_level

__all__ = ["app", "main"]

COMMAND_GROUPS = (serve, inspect, approvals, watch, pins, tokens)


def main() -> None:
    """Console entry point."""
    try:
        level = parse_level(os.environ.get(LOG_LEVEL_ENV_VAR))
    except ValueError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise SystemExit(2) from None
    configure_logging(level)
    try:
        app()
    except Exit as exc:
        err.print(str(exc), markup=False, highlight=False)
        raise SystemExit(exc.code) from None
