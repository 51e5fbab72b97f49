"""Stopping Bastion with SIGTERM or SIGINT, as real processes: running calls finish, new ones are refused, no
connector process outlives it, the exit status is 0 and nothing is printed as a traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
import pytest
from anyio.abc import Process, TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from anyio.streams.text import TextReceiveStream
from mcp import Client
from mcp.client.sse import sse_client
from mcp.shared.message import SessionMessage

from tests.processes import READY, bastion_command, bastion_env, write_config
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
WAIT = 60.0
"""Upper bound of every wait: generous, since nothing here depends on timing."""


@dataclass
class Bastion:
    """A `bastion serve` process and what it has written on stderr so far."""

    process: Process
    stderr: list[str] = field(default_factory=list)
    _wrote: anyio.Event = field(default_factory=anyio.Event)

    async def line(self, pattern: str) -> re.Match[str]:
        """The first stderr line matching `pattern`, waiting for it."""
        with anyio.fail_after(WAIT):
            while True:
                for line in self.stderr:
                    if match := re.search(pattern, line):
                        return match
                if self.process.returncode is not None:
                    raise AssertionError(f"Bastion exited ({self.process.returncode}):\n" + "\n".join(self.stderr))
                await self._wrote.wait()

    async def exit_status(self) -> int:
        with anyio.fail_after(WAIT):
            return await self.process.wait()

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    async def drain(self) -> None:
        assert self.process.stderr is not None
        buffer = ""
        async for chunk in TextReceiveStream(self.process.stderr):
            *lines, buffer = (buffer + chunk).split("\n")
            self.stderr.extend(lines)
            self._wrote.set()
            self._wrote = anyio.Event()
        self.stderr.append(buffer)
        self._wrote.set()


@asynccontextmanager
async def bastion(config: Path, env: dict[str, str], *, transport: str) -> AsyncIterator[Bastion]:
    """Start `bastion serve`; its stdin and stdout are pipes (the host's, over stdio). Killed if still running."""
    argv = bastion_command("serve", "--config", str(config), "--transport", transport)
    if transport == "http":
        argv += ["--port", "0"]
    process = await anyio.open_process(argv, env=env, start_new_session=True)
    running = Bastion(process)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(running.drain)
            yield running
            with anyio.fail_after(WAIT):
                await process.wait()
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
        with anyio.CancelScope(shield=True):
            await process.aclose()


@asynccontextmanager
async def over_stdio(process: Process) -> AsyncIterator[tuple[Any, Any]]:
    """A client transport over a process's stdin and stdout that leaves the process alone when it ends."""
    to_client: MemoryObjectSendStream[SessionMessage | Exception]
    to_client, from_process = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_process, from_client = anyio.create_memory_object_stream[SessionMessage](0)
    assert process.stdout is not None and process.stdin is not None
    stdout, stdin = process.stdout, process.stdin

    async def read() -> None:
        async with to_client:
            buffer = b""
            async for chunk in stdout:
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    await to_client.send(SessionMessage(types.jsonrpc_message_adapter.validate_json(line)))

    async def write(receive: MemoryObjectReceiveStream[SessionMessage]) -> None:
        async with receive:
            async for message in receive:
                await stdin.send(message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")

    with to_client, from_process, to_process, from_client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(write, from_client)
            yield from_process, to_process
            tg.cancel_scope.cancel()


@asynccontextmanager
async def host(running: Bastion, transport: str) -> AsyncIterator[Client]:
    """An SDK client connected to `running` over its transport (HTTP: once it says where it listens)."""
    if transport == "http":
        base_url = (await running.line(READY.pattern)).group(1)
        client = Client(f"{base_url}/mcp", cache=None)
    else:
        client = Client(over_stdio(running.process), cache=None)
    async with client:
        yield client


def configured(
    tmp_path: Path, *, grace: float, connectors: dict[str, str], settings: str = ""
) -> tuple[Path, dict[str, str]]:
    config = write_config(
        tmp_path / "config",
        notes_file=tmp_path / "notes.json",
        time_server=False,
        policy='[modes]\n"slow:hold" = "allow"\n',
        extra_connectors=connectors,
    )
    (config / "bastion.toml").write_text(
        f'[server]\nledger = "sqlite:///state/ledger.db"\nstartup_wait_seconds = 20\nshutdown_grace_seconds = {grace}\n'
        f"{settings}"
    )
    return config, bastion_env(tmp_path / "home")


SLOW = f'command = "{sys.executable}"\nargs = ["-m", "tests.slow_server"]\ncwd = "{ROOT}"\n'


def statuses(config: Path) -> dict[str, str]:
    """Each recorded invocation's tool and status, read with the CLI."""
    listed = subprocess.run(
        bastion_command("invocations", "list", "--json", "--config", str(config)),
        env=bastion_env(config.parent / "home"),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    return {row["tool"]: row["status"] for row in json.loads(listed.stdout)}


async def hold_a_call(
    tg: TaskGroup, client: Client, release: Path, *, connection_may_drop: bool = False
) -> list[types.CallToolResult]:
    """Start `slow__hold` (it runs until `release` is written) in `tg` and return once it runs; its result comes
    into the list returned. `connection_may_drop`: Bastion stops under the call, the host's error is ignored."""
    outcome: list[types.CallToolResult] = []
    holding = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        holding.set()

    async def call() -> None:
        with suppress(Exception) if connection_may_drop else nullcontext():
            arguments = {"release": str(release)}
            outcome.append(await client.call_tool("slow__hold", arguments, progress_callback=on_progress))

    tg.start_soon(call)
    with anyio.fail_after(WAIT):
        await holding.wait()
    return outcome


@pytest.mark.parametrize(("transport", "signum"), [("http", signal.SIGTERM), ("stdio", signal.SIGINT)])
async def test_a_running_call_finishes_new_ones_are_refused_and_bastion_exits_0(
    tmp_path: Path, transport: str, signum: int
) -> None:
    config, env = configured(tmp_path, grace=WAIT, connectors={"slow": SLOW})
    release = tmp_path / "release"
    os.mkfifo(release)
    async with bastion(config, env, transport=transport) as running:
        async with host(running, transport) as client, anyio.create_task_group() as tg:
            await client.list_tools()  # the client checks results against listed schemas: list before Bastion stops
            outcome = await hold_a_call(tg, client, release)
            running.signal(signum)
            await running.line(f"{signal.Signals(signum).name}: stopping")
            refused = error_of(await client.call_tool("notes__list_notes", {}))
            assert (refused["class"], refused["retriable"]) == ("connector_unavailable", True)
            await anyio.to_thread.run_sync(release.write_text, "done\n")
        assert await running.exit_status() == 0
    [result] = outcome
    assert not result.is_error
    assert result.content == [types.TextContent(type="text", text="released: done")]
    assert "Traceback" not in "\n".join(running.stderr)
    assert statuses(config) == {"slow__hold": "completed"}


async def test_a_call_still_running_after_the_grace_period_is_cancelled_and_recorded_unknown(tmp_path: Path) -> None:
    config, env = configured(tmp_path, grace=0.5, connectors={"slow": SLOW})
    release = tmp_path / "release"
    os.mkfifo(release)
    async with bastion(config, env, transport="http") as running:
        async with host(running, "http") as client, anyio.create_task_group() as tg:
            await client.list_tools()
            outcome = await hold_a_call(tg, client, release)
            running.signal(signal.SIGTERM)
        assert await running.exit_status() == 0
    [result] = outcome
    assert error_of(result)["class"] == "unknown_outcome"
    assert "Traceback" not in "\n".join(running.stderr)
    assert statuses(config) == {"slow__hold": "unknown"}


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_second_signal_stops_at_once_quietly_and_the_running_call_is_recorded_unknown(
    tmp_path: Path, transport: str
) -> None:
    config, env = configured(tmp_path, grace=WAIT, connectors={"slow": SLOW})
    release = tmp_path / "release"
    os.mkfifo(release)
    async with bastion(config, env, transport=transport) as running, host(running, transport) as client:
        await client.list_tools()
        async with anyio.create_task_group() as tg:
            await hold_a_call(tg, client, release, connection_may_drop=True)
            running.signal(signal.SIGTERM)
            await running.line("SIGTERM: stopping; new calls are refused")  # the call holds the drain
            running.signal(signal.SIGINT)
            await running.line("SIGINT: stopping now")
            assert await running.exit_status() == 0
            tg.cancel_scope.cancel()
    assert "Traceback" not in "\n".join(running.stderr), "\n".join(running.stderr)
    assert statuses(config) == {"slow__hold": "unknown"}


async def test_open_streams_of_every_kind_end_so_bastion_stops_at_once_and_quietly(tmp_path: Path) -> None:
    """A 2025 session's GET stream, a legacy SSE connection and a 2026-07-28 listen stream stay open until
    Bastion ends them; uvicorn would otherwise wait, cancel them and print tracebacks."""
    config, env = configured(tmp_path, grace=WAIT, connectors={})
    async with bastion(config, env, transport="http") as running:
        base_url = (await running.line(READY.pattern)).group(1)
        listening = anyio.Event()
        hosts = [
            Client(f"{base_url}/mcp", mode="legacy", cache=None),
            Client(sse_client(f"{base_url}/sse"), mode="legacy", cache=None),
        ]
        modern = Client(f"{base_url}/mcp", cache=None)
        async with hosts[0], hosts[1], modern, anyio.create_task_group() as tg:

            async def listen() -> None:
                async with modern.listen(tools_list_changed=True) as subscription:
                    listening.set()
                    async for _ in subscription:
                        pass

            tg.start_soon(listen)
            with anyio.fail_after(WAIT):
                await listening.wait()
            for client in [*hosts, modern]:
                await client.list_tools()
            running.signal(signal.SIGTERM)
            assert await running.exit_status() == 0
            tg.cancel_scope.cancel()
    printed = "\n".join(running.stderr)
    assert "Traceback" not in printed
    assert "ERROR" not in printed


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_call_waiting_for_approval_is_answered_at_once_and_stays_pending(
    tmp_path: Path, transport: str
) -> None:
    config, env = configured(tmp_path, grace=WAIT, connectors={}, settings="[approvals]\nheartbeat_seconds = 0.1\n")
    outcome: list[types.CallToolResult] = []
    async with bastion(config, env, transport=transport) as running:
        async with host(running, transport) as client, anyio.create_task_group() as tg:
            await client.list_tools()
            waiting = anyio.Event()

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                waiting.set()

            async def call() -> None:
                arguments = {"name": "n", "text": "t"}
                outcome.append(await client.call_tool("notes__write_note", arguments, progress_callback=on_progress))

            tg.start_soon(call)
            with anyio.fail_after(WAIT):
                await waiting.wait()
            running.signal(signal.SIGTERM)
        assert await running.exit_status() == 0
    [result] = outcome
    assert (error_of(result)["class"], error_of(result)["retriable"]) == ("unknown_outcome", False)
    assert "Traceback" not in "\n".join(running.stderr)
    assert statuses(config) == {"notes__write_note": "pending"}


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for a parent that never reaps does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize(("transport", "signum"), [("stdio", signal.SIGTERM), ("http", signal.SIGINT)])
async def test_no_connector_process_outlives_bastion_even_one_ignoring_eof_and_sigterm(
    tmp_path: Path, transport: str, signum: int
) -> None:
    pids_file = tmp_path / "stubborn.pids"
    stubborn = f'command = "{sys.executable}"\nargs = ["-m", "tests.stubborn_server"]\ncwd = "{ROOT}"\n'
    stubborn += f'env = {{ STUBBORN_PIDS = "{pids_file}" }}\n'
    config, env = configured(tmp_path, grace=WAIT, connectors={"stubborn": stubborn})
    pids: list[int] = []
    try:
        async with bastion(config, env, transport=transport) as running:
            async with host(running, transport) as client:
                assert "stubborn__ping" in {t.name for t in (await client.list_tools()).tools}
            pids = [int(pid) for pid in pids_file.read_text().split()]
            assert all(alive(pid) for pid in pids)
            running.signal(signum)
            assert await running.exit_status() == 0
        assert "Traceback" not in "\n".join(running.stderr)
        assert [pid for pid in pids if alive(pid)] == []
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("ending", ["sigterm", "eof", "broken-pipe"])
def test_the_demo_notes_server_stops_quietly(tmp_path: Path, ending: str) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "bastion.demo.notes"],
        env=bastion_env(tmp_path / "home", BASTION_NOTES_FILE=str(tmp_path / "notes.json")),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert server.stdin is not None and server.stdout is not None and server.stderr is not None
    try:
        if ending == "broken-pipe":
            server.stdout.close()  # the host stops reading before the answer comes
        server.stdin.write(json.dumps(initialize).encode() + b"\n")
        server.stdin.flush()
        if ending == "sigterm":
            assert json.loads(server.stdout.readline())["id"] == 1
            server.send_signal(signal.SIGTERM)
        server.stdin.close()
        assert server.wait(timeout=WAIT) == 0
        assert server.stderr.read() == b""
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        server.stderr.close()
        if not server.stdout.closed:
            server.stdout.close()
