"""`bastion`: the command line and the composition root (config -> ledger -> sources -> gateway -> server).

`app` holds the typer application and what commands share; each other module registers one command
group on it when imported: `serve`, `inspect` (catalog, connectors, invocations, init), `doctor`,
`approvals` (+ `watch`), `pins` and `tokens`. Exit statuses: 0 success, 1 a refused operation, 2 a usage or
config error.
"""

from __future__ import annotations

import logging
import os
import sys

# Each module registers its commands on `app` when imported; this order is the order of `bastion --help`.
# isort: off
from bastion.cli import serve, inspect, doctor, approvals, watch, pins, tokens

# isort: on
import typer

from bastion.cli.app import JSON_FLAG, USAGE_ERROR, Exit, app, emit_json, err

__all__ = ["app", "main"]

COMMAND_GROUPS = (serve, inspect, doctor, approvals, watch, pins, tokens)
PROG_NAME = "bastion"


def main() -> None:
    """Console entry point: errors as `error: ...` lines on stderr, or under `--json` as JSON on stdout."""
    logging.basicConfig(
        level=os.environ.get("BASTION_LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    as_json = JSON_FLAG in sys.argv[1:]
    try:
        # Under --json, typer hands usage errors back (not standalone) so that they are printed as JSON too.
        status = app(prog_name=PROG_NAME, standalone_mode=not as_json)
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
