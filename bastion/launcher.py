"""The `bastion` command's entry point: `--version` answers without importing the command line (typer and rich,
a few hundred milliseconds); everything else is `bastion.cli.main`."""

from __future__ import annotations

import sys

VERSION_FLAGS = ("--version", "-V")


def main() -> None:
    if sys.argv[1:] and sys.argv[1] in VERSION_FLAGS and len(sys.argv) == 2:
        from bastion import __version__

        sys.stdout.write(__version__ + "\n")
        raise SystemExit(0)
    from bastion.cli import main as run

    run()
