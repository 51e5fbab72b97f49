"""How a person runs this Bastion from their shell, for the hints printed for people (the next step, the commands
that decide a call) to work where they are printed: after `make run` the `bastion` script is in `.venv/bin`, which
is not on PATH until the virtual environment is activated.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from functools import cache
from pathlib import Path
from typing import Final

NAME: Final = "bastion"


@cache
def bastion_command() -> str:
    """`bastion` when that name on PATH runs this installation; else the `bastion` script beside this interpreter,
    by its path (quoted for a POSIX shell); else this interpreter with `-m bastion`."""
    beside = Path(sys.executable).parent / NAME
    on_path = shutil.which(NAME)
    if on_path is not None and (not beside.is_file() or os.path.samefile(on_path, beside)):
        return NAME
    if beside.is_file():
        return shlex.quote(str(beside))
    return f"{shlex.quote(sys.executable)} -m {NAME}"
