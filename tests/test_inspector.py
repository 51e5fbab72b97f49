"""The MCP Inspector CLI, a second real client, against Bastion over stdio and over streamable HTTP.

Bastion mounts the conformance fixture server (`tests/conformance/server.py`) as the connector `fx`,
so its tools and prompts are named `fx__...` like any connector's; resource URIs stay verbatim. The
Inspector (`mcp-inspector --cli`, pinned in `tests/tools.py`, installed by `make tools`) lists the
tools, calls one, reads a resource and gets two prompts through Bastion, and the ledger records the
call. `--format json` makes the Inspector print one `{"result": ...}` object on stdout.

The Inspector is a TypeScript-SDK host: it checks a tool's `structuredContent` against the tool's
`outputSchema`, error results included, so it also shows that a refusal of such a tool reaches it whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from bastion.models import Invocation
from tests.conformance.server import STATIC_TEXT, TOOLS
from tests.processes import bastion_env, bastion_http
from tests.processes import write_config as write_notes_config
from tests.test_e2e_approvals import until, watching
from tests.tools import ROOT, ensure_tools, inspector_bin, node_environment

pytestmark = pytest.mark.anyio

INSPECTOR_SECONDS = 60.0
"""The bound on one Inspector run: it starts Node, (over stdio) Bastion and the fixture, then one request."""

TOOL_ERROR_EXIT = 5
"""The Inspector CLI's exit status when the tool it called answered `isError: true` (its `EXIT_CODES.TOOL_ERROR`)."""


@pytest.fixture(scope="module", autouse=True)
def inspector_installed() -> None:
    """Install the pinned Inspector if `make tools` has not: this test never skips."""
    ensure_tools()


def write_config(directory: Path) -> Path:
    """A configuration with the conformance fixture as the connector `fx`, its tools allowed."""
    (directory / "connectors").mkdir(parents=True)
    (directory / "policies").mkdir()
    # The Inspector lists right after connecting: its first listing waits for the fixture to start.
    (directory / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///state/ledger.db"\nstartup_wait_seconds = 30\n'
    )
    (directory / "connectors" / "fx.toml").write_text(
        f"command = {json.dumps(sys.executable)}\n"
        'args = ["-m", "tests.conformance.server"]\n'
        f"cwd = {json.dumps(str(ROOT))}\n"
        'namespace = "fx"\n'
    )
    (directory / "policies" / "default.toml").write_text('[modes]\n"fx:*" = "allow"\n')
    return directory


async def inspect(target: Sequence[str], env: dict[str, str], *request: str, status: int = 0) -> Any:
    """Run `mcp-inspector --cli REQUEST --format json TARGET`; check its exit `status`; return the result it prints.

    `target` is `-- COMMAND ARGS...` (stdio: the Inspector starts the server) or `--transport http URL`.
    """
    command = [str(inspector_bin()), "--cli", *request, "--format", "json", *target]
    with anyio.fail_after(INSPECTOR_SECONDS):
        done = await anyio.run_process(command, env=env, stdin=subprocess.DEVNULL, check=False)
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == status, f"{' '.join(request)}: exit {done.returncode}\n{stdout}\n{stderr}"
    return json.loads(stdout)["result"]


async def exercise_through_bastion(target: Sequence[str], env: dict[str, str]) -> None:
    """tools/list, tools/call, resources/read and prompts/get, each checked against the fixture."""
    listed = await inspect(target, env, "--method", "tools/list")
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert {f"fx__{tool.name}" for tool in TOOLS} <= tools.keys()
    assert tools["fx__test_simple_text"]["description"] == "Return one text item."

    called = await inspect(
        target, env, "--method", "tools/call", "--tool-name", "fx__json_schema_2020_12_tool", "--tool-arg", "name=Ada"
    )
    assert called["content"] == [{"type": "text", "text": 'Received: {"name": "Ada"}'}]
    assert not called.get("isError")

    read = await inspect(target, env, "--method", "resources/read", "--uri", "test://static-text")
    assert read["contents"] == [{"uri": "test://static-text", "mimeType": "text/plain", "text": STATIC_TEXT}]

    simple = await inspect(target, env, "--method", "prompts/get", "--prompt-name", "fx__test_simple_prompt")
    text = {"type": "text", "text": "This is a simple prompt for testing."}
    assert simple["messages"] == [{"role": "user", "content": text}]

    with_arguments = await inspect(
        target, env, "--method", "prompts/get", "--prompt-name", "fx__test_prompt_with_arguments",
        "--prompt-args", "arg1=one", "arg2=two",
    )  # fmt: skip
    text = {"type": "text", "text": "Prompt with arguments: arg1='one', arg2='two'"}
    assert with_arguments["messages"] == [{"role": "user", "content": text}]


async def the_one_completed_call(config: Path) -> Invocation:
    """The ledger's only invocation, once it has completed (a bounded wait: Bastion may still write)."""
    async with watching(config) as ledger:

        async def probe() -> list[Invocation] | None:
            return await ledger.invocations.list(status="completed") or None

        await until(ledger, probe)
        (invocation,) = await ledger.invocations.list()
        return invocation


def assert_recorded(invocation: Invocation) -> None:
    assert invocation.status == "completed"
    assert (invocation.source_id, invocation.action_id) == ("fx", "json_schema_2020_12_tool")
    assert invocation.tool == "fx__json_schema_2020_12_tool"
    assert invocation.args == {"name": "Ada"}


async def test_the_inspector_cli_lists_calls_reads_and_gets_prompts_through_bastion_over_stdio(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "config")
    home = tmp_path / "home"
    env = node_environment(bastion_env(home))
    # The Inspector passes the server it starts only HOME, LOGNAME, PATH, SHELL, TERM, USER and its `-e` pairs.
    state = f"XDG_STATE_HOME={env['XDG_STATE_HOME']}"
    target = ["-e", state, "--", sys.executable, "-m", "bastion", "serve", "--config", str(config)]

    await exercise_through_bastion(target, env)

    assert_recorded(await the_one_completed_call(config))


async def test_the_inspector_cli_lists_calls_reads_and_gets_prompts_through_bastion_over_streamable_http(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "config")
    env = bastion_env(tmp_path / "home")
    async with bastion_http(["--config", str(config)], env=env) as bastion:
        target = ["--transport", "http", bastion.mcp_url]

        await exercise_through_bastion(target, node_environment(env))

        assert_recorded(await the_one_completed_call(config))


async def test_a_refused_call_of_a_tool_with_an_output_schema_reaches_the_inspector_with_its_class_and_message(
    tmp_path: Path,
) -> None:
    # The demo's read_note declares an outputSchema; a policy denies it, so Bastion answers the refusal itself.
    config = write_notes_config(
        tmp_path / "config",
        notes_file=tmp_path / "notes.json",
        time_server=False,
        policy='[modes]\n"notes:read_note" = "deny"\n',
    )
    env = node_environment(bastion_env(tmp_path / "home"))
    state = f"XDG_STATE_HOME={env['XDG_STATE_HOME']}"
    target = ["-e", state, "--", sys.executable, "-m", "bastion", "serve", "--config", str(config)]
    listed = await inspect(target, env, "--method", "tools/list")
    assert "outputSchema" in {tool["name"]: tool for tool in listed["tools"]}["notes__read_note"]

    # A schema-validation failure would be the Inspector's own error (exit 1, no result), not the tool's.
    refused = await inspect(
        target, env, "--method", "tools/call", "--tool-name", "notes__read_note", "--tool-arg", "name=groceries",
        status=TOOL_ERROR_EXIT,
    )  # fmt: skip

    assert refused["isError"] is True
    error = refused["_meta"]["io.bastion/error"]
    assert error["class"] == "policy_denied"
    assert refused["content"] == [{"type": "text", "text": f"policy_denied: {error['message']}"}]
    assert "structuredContent" not in refused
