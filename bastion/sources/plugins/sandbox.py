"""Where a plugin step runs: inside bubblewrap (`bwrap`, a well-kept tool packaged by Debian and Ubuntu), which
applies the package's `permissions.filesystem` with a mount namespace and ties the step's whole process tree to
Bastion's life.

- The filesystem is read-only, but for the call's own state directory; `/tmp` is a fresh one of the step's own
  (where Bastion's Python is installed under `/tmp`, that is shown again, read-only).
- `workspace`: the workspace is writable; `read`: it is read-only; `none`: it is not there at all.
- Bastion's own files (its configuration directory and its ledger's) are hidden; the package's directory is shown
  again, read-only, since its executables live there.
- The step gets a PID namespace of its own and bubblewrap dies with Bastion (`--die-with-parent`): when Bastion
  stops, however it stops (a SIGKILL included), every process the step started dies with it, so nothing changes the
  workspace after the ledger says the call's outcome is unknown.

A machine where bubblewrap is missing or cannot make its namespaces loads no plugin: a permission Bastion cannot
apply is never accepted (`probe`).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

Filesystem = Literal["workspace", "read", "none"]

INSTALL_FIX: Final = "install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap)"
PROBE_SECONDS: Final = 10.0


@dataclass(frozen=True)
class Sandbox:
    """How this Bastion confines plugin steps: the bubblewrap to run, the workspace, what to hide."""

    bwrap: str
    workspace: Path
    hidden: tuple[Path, ...] = ()
    """Directories no step sees (Bastion's configuration and ledger directories)."""
    runtime: tuple[Path, ...] = ()
    """Directories under `/tmp` the steps' interpreter lives in (a virtualenv there): shown again, read-only, over
    the step's fresh `/tmp`."""

    def argv(self, argv: Sequence[str], *, filesystem: Filesystem, package: Path, state: Path) -> list[str]:
        """`argv` run inside the sandbox, in the workspace, with `filesystem` access to it."""
        workspace = str(self.workspace)
        wrapped = [self.bwrap, "--die-with-parent", "--unshare-pid", "--new-session", "--ro-bind", "/", "/"]
        wrapped += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for kept in self.runtime:
            wrapped += ["--ro-bind", str(kept), str(kept)]
        for hidden in self.hidden:
            if hidden.is_dir():
                wrapped += ["--tmpfs", str(hidden)]
        wrapped += ["--ro-bind", str(package), str(package)]
        if filesystem == "workspace":
            wrapped += ["--bind", workspace, workspace]
        elif filesystem == "read":
            wrapped += ["--ro-bind", workspace, workspace]
        else:
            wrapped += ["--tmpfs", workspace]
        wrapped += ["--bind", str(state), str(state), "--chdir", workspace, "--", *argv]
        return wrapped


def sandbox(workspace: Path, *, hidden: Sequence[Path] = ()) -> Sandbox | str:
    """The sandbox of this machine, or why there is none (and how to get one)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"bubblewrap (bwrap) is not on Bastion's PATH; {INSTALL_FIX}"
    problem = probe(bwrap)
    if problem is not None:
        return problem
    return Sandbox(bwrap, workspace, tuple(hidden), runtime_under_tmp())


def runtime_under_tmp() -> tuple[Path, ...]:
    """Where the Python that runs `<step>.py` (Bastion's own) is installed, where that is under `/tmp`."""
    found = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent}
    return tuple(sorted(path for path in found if path.is_relative_to("/tmp")))


@functools.lru_cache(maxsize=4)
def probe(bwrap: str) -> str | None:
    """Why `bwrap` cannot confine a step here (it cannot make its namespaces, say); None when it can. Asked once."""
    command = [bwrap, "--die-with-parent", "--unshare-pid", "--new-session", "--ro-bind", "/", "/", "--", "true"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap ({bwrap}) cannot be run ({exc}); {INSTALL_FIX}"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return (
            f"bubblewrap ({bwrap}) cannot confine a step on this machine ({said}); it needs user namespaces "
            "(or to run as root)"
        )
    return None
