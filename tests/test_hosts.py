"""Hosts people run, against a real Bastion: Claude Code's `claude mcp list` (it connects to each configured server
and reports it) over HTTP and stdio, with and without tokens; Codex reading the host guide's configuration
blocks (`codex mcp list --json`). Both at the versions tests/tools.py pins, each in a throwaway HOME."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest

from tests.processes import bastion_command, bastion_env, bastion_http, run_cli, write_config
from tests.tools import CLAUDE_BIN, CODEX_BIN, ROOT, ensure_tools, node_environment

pytestmark = pytest.mark.anyio

HOST_SECONDS = 120.0
"""The bound on one host command (`claude mcp list` connects to every configured server, one after another)."""


@pytest.fixture(scope="module", autouse=True)
def hosts_installed() -> None:
    """Install the pinned hosts if `make tools` has not: these tests never skip."""
    ensure_tools()


def _host_env(home: Path) -> dict[str, str]:
    """A host's environment: a HOME of its own, no update checks or traffic beyond this machine."""
    env = node_environment(bastion_env(home))
    env |= {
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CODEX_HOME": str(home / ".codex"),
    }
    return env


async def _host(command: list[str], env: dict[str, str], cwd: Path, *, stdout_only: bool = False) -> str:
    """What the host command printed (on stdout only, or on both); it must succeed."""
    with anyio.fail_after(HOST_SECONDS):
        done = await anyio.run_process(command, env=env, cwd=cwd, check=False)
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, f"{' '.join(command[:3])}: exit {done.returncode}\n{stdout}\n{stderr}"
    return stdout if stdout_only else stdout + stderr


def _listed(said: str) -> dict[str, str]:
    """`claude mcp list`'s report: each server's name and what it says of it (after ` - `)."""
    found = {}
    for line in said.splitlines():
        matched = re.match(r"^([\w-]+): .* - (.*)$", line.strip())
        if matched:
            found[matched.group(1)] = matched.group(2)
    return found


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    notes = tmp_path / "notes.json"
    notes.write_text("{}")
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False)
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    project = tmp_path / "project"
    project.mkdir()
    return config, _host_env(home), project


async def test_claude_code_reports_bastion_connected_over_http_and_stdio_without_tokens(
    setup: tuple[Path, dict[str, str], Path],
) -> None:
    config, env, project = setup
    claude = str(CLAUDE_BIN)
    async with bastion_http(["--config", str(config)], env=env) as bastion:
        await _host([claude, "mcp", "add", "--transport", "http", "bastion", bastion.mcp_url], env, project)
        await _host(
            [claude, "mcp", "add", "bastion-stdio", "--", *bastion_command("serve", "--config", str(config))],
            env,
            project,
        )
        listed = _listed(await _host([claude, "mcp", "list"], env, project))
    assert "Connected" in listed["bastion"], listed
    assert "Connected" in listed["bastion-stdio"], listed


async def test_once_a_token_exists_claude_code_connects_with_one_and_a_host_without_is_told_the_fix(
    setup: tuple[Path, dict[str, str], Path],
) -> None:
    config, env, project = setup
    claude = str(CLAUDE_BIN)
    async with bastion_http(["--config", str(config)], env=env) as bastion:
        created = run_cli("tokens", "create", "agent", "--role", "agent", "--json", "--config", str(config), env=env)
        assert created.returncode == 0, created.stderr
        made = json.loads(created.stdout)
        assert made["first_token"] is True
        header = f"Authorization: Bearer {made['token']}"
        url = bastion.mcp_url
        await _host([claude, "mcp", "add", "--transport", "http", "with-token", url, "--header", header], env, project)
        await _host([claude, "mcp", "add", "--transport", "http", "without", url], env, project)
        stdio = bastion_command("serve", "--config", str(config))
        await _host([claude, "mcp", "add", "over-stdio", "--", *stdio], env, project)
        said = await _host([claude, "mcp", "list"], env, project)
        changed = await bastion.stderr.wait_for(lambda line: "a token now exists" in line)
    listed = _listed(said)
    assert "Connected" in listed["with-token"], said
    assert "Connected" in listed["over-stdio"], said  # the local user's own host: no token over stdio
    assert "Failed" in listed["without"] and "bastion tokens create NAME --role agent" in said, said
    assert "--header" in changed


def _guide_codex_blocks() -> list[str]:
    """The host guide's TOML blocks that configure Codex (`[mcp_servers.bastion]`)."""
    guide = (ROOT / "docs" / "guides" / "host-user.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", guide, flags=re.DOTALL)
    return [block for block in blocks if "[mcp_servers.bastion]" in block]


async def test_codex_reads_the_host_guides_configuration_with_and_without_a_token(tmp_path: Path) -> None:
    blocks = _guide_codex_blocks()
    assert len(blocks) == 2, "the host guide shows Codex's configuration without a token and with one"
    home = tmp_path / "home"
    env = _host_env(home)
    read = []
    for block in blocks:
        (home / ".codex").mkdir(parents=True, exist_ok=True)
        (home / ".codex" / "config.toml").write_text(block)
        listed = json.loads(await _host([str(CODEX_BIN), "mcp", "list", "--json"], env, tmp_path, stdout_only=True))
        (server,) = [entry for entry in listed if entry["name"] == "bastion"]
        read.append(server["transport"])
    assert [transport["url"] for transport in read] == ["http://127.0.0.1:8765/mcp"] * 2
    assert [transport.get("bearer_token_env_var") for transport in read] == [None, "BASTION_AGENT_TOKEN"]
