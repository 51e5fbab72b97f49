"""End to end: a host's call blocks in one Bastion process; an approver decides from another process."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.models import Invocation, Status
from tests.processes import bastion_command, bastion_env, bastion_http, write_config
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio
T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def watching(config: Path) -> AsyncIterator[OpenLedger]:
    """The ledger Bastion writes, opened here too, woken by the other processes' commits."""
    ledger = await open_ledger(config / "state" / "ledger.db", redactor=Redactor())
    async with ledger, anyio.create_task_group() as tg:
        tg.start_soon(ledger.changes.run)
        yield ledger
        tg.cancel_scope.cancel()


async def until(ledger: OpenLedger, probe: Callable[[], Awaitable[T | None]], timeout: float = 30) -> T:
    """Wait (bounded) until `probe` finds something another process wrote."""
    with anyio.fail_after(timeout):
        while (found := await probe()) is None:
            with anyio.move_on_after(0.5):  # a change between probe and wait is caught on the next round
                await ledger.changes.next(ledger.changes.cursor)
    return found


async def one(ledger: OpenLedger, status: Status) -> Invocation:
    async def probe() -> Invocation | None:
        found = await ledger.invocations.list(status=status)
        return found[0] if found else None

    return await until(ledger, probe)


async def reaches(ledger: OpenLedger, invocation_id: str, status: Status) -> Invocation:
    async def probe() -> Invocation | None:
        found = await ledger.invocations.get(invocation_id)
        return found if found is not None and found.status == status else None

    return await until(ledger, probe)


async def kinds(ledger: OpenLedger, invocation_id: str) -> list[str]:
    return [e.kind for e in await ledger.invocations.events(invocation_id)]


async def decide_from_another_process(config: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    result = await anyio.run_process(
        bastion_command("approvals", *args, "--config", str(config)), env=env | {"BASTION_PRINCIPAL": "carol"},
        check=False,
    )  # fmt: skip
    return result.returncode, (result.stdout + result.stderr).decode()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_blocked_call_is_released_by_an_approval_from_another_process(
    configured: tuple[Path, Path, dict[str, str]], mode: str
) -> None:
    config, notes, env = configured
    argv = bastion_command("serve", "--config", str(config))
    beats: list[str] = []
    heard = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        beats.append(message or "")
        heard.set()

    outcome: list[types.CallToolResult] = []
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with (
        Client(params, mode=mode, cache=None) as client,
        watching(config) as ledger,
        anyio.create_task_group() as tg,
    ):

        async def call() -> None:
            arguments = {"name": "todo", "text": "call mum"}
            outcome.append(await client.call_tool("notes__write_note", arguments, progress_callback=on_progress))

        tg.start_soon(call)
        pending = (await one(ledger, "pending")).id
        with anyio.fail_after(30):
            await heard.wait()
        assert pending in beats[0]
        assert "todo" not in json.loads(notes.read_text())
        code, output = await decide_from_another_process(config, env, "approve", pending, "--note", "ok")
        assert code == 0, output
    (result,) = outcome
    assert not result.is_error
    assert json.loads(notes.read_text())["todo"] == "call mum"
    async with watching(config) as ledger:
        assert (await reaches(ledger, pending, "completed")).mode == "require_approval"
        events = await ledger.invocations.events(pending)
    assert [e.kind for e in events] == ["planned", "pending", "approved", "executing", "completed"]
    assert events[2].detail["by"] == "carol"

    code, output = await decide_from_another_process(config, env, "deny", pending)
    assert code == 1
    assert "conflict" in output


async def test_a_denial_from_another_process_reaches_the_blocked_host(
    configured: tuple[Path, Path, dict[str, str]],
) -> None:
    config, notes, env = configured
    argv = bastion_command("serve", "--config", str(config))
    outcome: list[types.CallToolResult] = []
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with Client(params, cache=None) as client, watching(config) as ledger, anyio.create_task_group() as tg:

        async def call() -> None:
            outcome.append(await client.call_tool("notes__write_note", {"name": "x", "text": "y"}))

        tg.start_soon(call)
        pending = (await one(ledger, "pending")).id
        code, output = await decide_from_another_process(config, env, "deny", pending, "--reason", "no thanks")
        assert code == 0, output
        await reaches(ledger, pending, "denied")
    (result,) = outcome
    assert result.is_error
    assert error_of(result)["class"] == "approval_denied"
    assert "no thanks" in error_of(result)["message"]
    assert "x" not in json.loads(notes.read_text())


async def test_an_undecided_call_expires_for_the_host(configured: tuple[Path, Path, dict[str, str]]) -> None:
    config, _, env = configured
    (config / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///state/ledger.db"\nstartup_wait_seconds = 20\n'
        "[approvals]\nheartbeat_seconds = 0.2\nexpiry_seconds = 1\n"
    )
    argv = bastion_command("serve", "--config", str(config))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with Client(params, cache=None) as client:
        with anyio.fail_after(30):
            result = await client.call_tool("notes__write_note", {"name": "x", "text": "y"})
    assert error_of(result)["class"] == "approval_expired"
    invocation_id = error_of(result)["invocation_id"]
    async with watching(config) as ledger:
        assert await kinds(ledger, invocation_id) == ["planned", "pending", "expired"]


async def test_a_killed_bastion_loses_no_invocation(configured: tuple[Path, Path, dict[str, str]]) -> None:
    config, notes, env = configured
    (config / "connectors" / "slow.toml").write_text(
        f'command = "{sys.executable}"\nargs = ["-m", "tests.slow_server"]\ncwd = "{ROOT}"\n'
    )
    (config / "policies" / "default.toml").write_text('[modes]\n"slow:wait" = "allow"\n')
    async with bastion_http(["--config", str(config)], env=env) as first, watching(config) as ledger:
        async with anyio.create_task_group() as tg:
            for tool, arguments in (("slow__wait", {}), ("notes__write_note", {"name": "kept", "text": "safe"})):
                tg.start_soon(_call_and_ignore, first.mcp_url, tool, arguments)
            executing = (await one(ledger, "executing")).id
            pending = (await one(ledger, "pending")).id
            os.killpg(first.process.pid, signal.SIGKILL)
            tg.cancel_scope.cancel()
        assert (await reaches(ledger, executing, "executing")).owner is not None  # nobody has looked yet

    async with bastion_http(["--config", str(config)], env=env), watching(config) as ledger:
        await reaches(ledger, executing, "unknown")
        await reaches(ledger, pending, "pending")
        code, output = await decide_from_another_process(config, env, "approve", pending)
        assert code == 0, output
        await reaches(ledger, pending, "completed")
    assert json.loads(notes.read_text())["kept"] == "safe"


async def _call_and_ignore(url: str, tool: str, arguments: dict[str, Any]) -> None:
    """A host whose call is cut off when Bastion dies; what it sees does not matter here."""
    try:
        async with Client(url, cache=None) as client:
            await client.call_tool(tool, arguments)
    except Exception:  # noqa: BLE001 - the server was killed under it, any failure is expected
        pass


async def test_the_agent_is_told_the_id_its_approver_finds_the_call_by_and_no_command(tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    notes.write_text("{}")
    config = write_config(tmp_path / "my config", notes_file=notes, time_server=False)
    (config / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///state/ledger.db"\n'
        "[approvals]\nheartbeat_seconds = 0.2\nwait_without_progress_seconds = 1\n"
    )
    env = bastion_env(tmp_path / "home")
    argv = bastion_command("serve", "--config", str(config))
    beats: list[str] = []
    heard = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        beats.append(message or "")
        heard.set()

    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with Client(params, mode="legacy", cache=None) as client, anyio.create_task_group() as tg:
        first = functools.partial(client.call_tool, progress_callback=on_progress)
        tg.start_soon(first, "notes__write_note", {"name": "a", "text": "b"})
        with anyio.fail_after(30):
            await heard.wait()
        with anyio.fail_after(30):
            pending = await client.call_tool("notes__write_note", {"name": "c", "text": "d"})  # no progress token
        tg.cancel_scope.cancel()
    assert error_of(pending)["class"] == "approval_pending"
    told = pending.content[0].text if isinstance(pending.content[0], types.TextContent) else ""
    held_id = error_of(pending)["invocation_id"]
    for text in (beats[0], told):
        assert "bastion " not in text and "`" not in text, text  # an agent is steered to no command
    assert held_id in told

    # The approver, from anywhere, finds it by that id.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = await anyio.run_process(
        bastion_command("approvals", "show", held_id, "--config", str(config), "--json"),
        env=env,
        cwd=elsewhere,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr.decode()
    assert json.loads(shown.stdout)["id"] == error_of(pending)["invocation_id"]
