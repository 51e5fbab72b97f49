"""End to end: a real MCP client, a real Bastion process, real downstream servers as subprocesses."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.session import IncomingMessage
from mcp.client.sse import sse_client
from mcp.server import Server

from tests.processes import bastion_command, bastion_env, bastion_http, run_cli, stop, write_config
from tests.test_cli import INVOCATION_KEYS
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

NOTES_TOOLS = {"notes__list_notes", "notes__read_note", "notes__write_note", "notes__delete_note"}
TIME_TOOLS = {"time__get_current_time", "time__convert_time"}
ERAS = ["legacy", "auto"]  # auto negotiates 2026-07-28 against Bastion


@asynccontextmanager
async def host_client(
    target: str | StdioServerParameters | Server[Any], mode: str
) -> AsyncIterator[tuple[Client, MemoryObjectReceiveStream[None]]]:
    """An SDK client plus a stream that yields once per tools/list_changed it hears, in either era."""
    send, receive = anyio.create_memory_object_stream[None](100)

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(message, types.ToolListChangedNotification):
            await send.send(None)

    client = Client(target, mode=mode, cache=None, message_handler=on_message)
    with send, receive:
        async with client, anyio.create_task_group() as tg:
            if client.protocol_version == "2026-07-28":
                await _listen(tg, client)
            yield client, receive
            tg.cancel_scope.cancel()


async def _listen(tg: TaskGroup, client: Client) -> None:
    """On 2026-07-28 change events arrive only on an open subscriptions/listen stream."""
    opened = anyio.Event()

    async def run() -> None:
        async with client.listen(tools_list_changed=True) as subscription:
            opened.set()
            async for _ in subscription:
                pass  # the frames are teed to the message handler, which counts them

    tg.start_soon(run)
    with anyio.fail_after(10):
        await opened.wait()


async def wait_for_tools(
    client: Client, changes: MemoryObjectReceiveStream[None], predicate: Callable[[set[str]], bool]
) -> set[str]:
    """List until the catalog satisfies `predicate`, waiting for a list_changed between tries."""
    with anyio.fail_after(45):
        while True:
            names = {t.name for t in (await client.list_tools()).tools}
            if predicate(names):
                return names
            await changes.receive()


def ledger_rows(config_dir: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(config_dir / "state" / "ledger.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM invocations ORDER BY created_at")]


def error_class(result: types.CallToolResult) -> str:
    assert result.is_error, result
    return str(error_of(result)["class"])


async def exercise_catalog(client: Client, notes_file: Path) -> None:
    """The shared scenario: merged listing, a read through each downstream, a refused destructive call."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) >= NOTES_TOOLS | TIME_TOOLS
    delete = tools["notes__delete_note"]
    assert delete.annotations is not None and delete.annotations.destructive_hint is True
    assert delete.title == "Delete a note"

    read = await client.call_tool("notes__read_note", {"name": "groceries"})
    assert not read.is_error
    assert isinstance(read.content[0], types.TextContent) and read.content[0].text == "milk, eggs"

    now = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
    assert not now.is_error

    before = notes_file.read_bytes()
    refused = await client.call_tool("notes__delete_note", {"name": "groceries"})
    assert error_class(refused) == "policy_denied"
    assert notes_file.read_bytes() == before

    invalid = await client.call_tool("notes__read_note", {"title": "groceries"})
    assert error_class(invalid) == "invalid_arguments"
    missing = await client.call_tool("notes__no_such_tool", {})
    assert error_class(missing) == "not_found"


def assert_ledger(config_dir: Path, calls: int) -> None:
    """One invocation per recorded call (invalid and unknown calls record nothing), with the right modes."""
    rows = ledger_rows(config_dir)
    assert len(rows) == calls
    by_tool = {r["tool"]: r for r in rows}
    assert by_tool["notes__read_note"]["status"] == "completed"
    assert (by_tool["notes__read_note"]["mode"], by_tool["notes__read_note"]["mode_source"]) == ("allow", "inferred")
    assert by_tool["time__get_current_time"]["status"] == "completed"
    denied = by_tool["notes__delete_note"]
    assert (denied["status"], denied["mode"], denied["mode_source"]) == ("denied", "deny", "inferred")
    assert denied["error_class"] == "policy_denied"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"groceries": "milk, eggs"}))
    config = write_config(tmp_path / "config", notes_file=notes)
    return config, notes, bastion_env(tmp_path / "home")


@pytest.mark.parametrize("mode", ERAS)
async def test_host_over_stdio_sees_one_catalog_and_destructive_calls_never_reach_downstream(
    setup: tuple[Path, Path, dict[str, str]], mode: str
) -> None:
    config, notes, env = setup
    argv = bastion_command("serve", "--config", str(config))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with host_client(params, mode) as (client, _):
        await exercise_catalog(client, notes)
    assert_ledger(config, calls=3)

    listed = run_cli("invocations", "list", "--json", "--config", str(config), env=env)
    assert listed.returncode == 0, listed.stderr
    invocations = json.loads(listed.stdout)
    assert len(invocations) == 3
    assert set(invocations[0]) >= INVOCATION_KEYS
    shown = run_cli("invocations", "show", invocations[0]["id"], "--json", "--config", str(config), env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["events"][0]["kind"] == "planned"


@pytest.mark.parametrize("mode", ERAS)
async def test_host_over_http_sees_one_catalog_and_destructive_calls_never_reach_downstream(
    setup: tuple[Path, Path, dict[str, str]], mode: str
) -> None:
    config, notes, env = setup
    async with bastion_http(["--config", str(config)], env=env) as bastion:
        async with host_client(bastion.mcp_url, mode) as (client, _):
            await exercise_catalog(client, notes)
        async with httpx2.AsyncClient() as http:
            health = (await http.get(f"{bastion.base_url}/healthz")).json()
            assert health["status"] == "ok"
            assert {s["id"]: s["state"] for s in health["sources"]} == {"notes": "ready", "time": "ready"}
            evil = await http.post(bastion.mcp_url, headers={"Host": "evil.example.com"}, content=b"{}")
            assert evil.status_code == 421
    assert_ledger(config, calls=3)


async def test_legacy_sse_host_is_served(setup: tuple[Path, Path, dict[str, str]]) -> None:
    config, notes, env = setup
    async with bastion_http(["--config", str(config)], env=env) as bastion:
        client = Client(sse_client(f"{bastion.base_url}/sse"), mode="legacy", cache=None)
        async with client:
            await exercise_catalog(client, notes)


async def test_ledger_never_holds_a_secret(tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    canaries = {
        "github": "ghp_" + "C4n4ry" * 6,
        "openai": "sk-proj-" + "Canary0123456789" * 2,
        "password": "hunter2-canary-password",
        "bearer": "Bearer canaryBearerToken0123456789abcdef",
    }
    notes.write_text(json.dumps({"keys": f"github {canaries['github']} and {canaries['bearer']}"}))
    policy = '[modes]\n"notes:write_note" = "allow"\n'
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False, policy=policy)
    argv = bastion_command("serve", "--config", str(config))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=bastion_env(tmp_path / "home"))
    async with host_client(params, "auto") as (client, _):
        written = await client.call_tool(
            "notes__write_note",
            {"name": "openai", "text": f"key={canaries['openai']}", "password": canaries["password"]},
        )
        assert not written.is_error
        read = await client.call_tool("notes__read_note", {"name": "keys"})
        assert not read.is_error  # the host still gets the real result; only the ledger is redacted
        assert isinstance(read.content[0], types.TextContent) and canaries["github"] in read.content[0].text
    assert [r["status"] for r in ledger_rows(config)] == ["completed", "completed"]
    stored = b"".join(p.read_bytes() for p in (config / "state").iterdir() if p.name.startswith("ledger.db"))
    for name, secret in canaries.items():
        assert secret.encode() not in stored, f"the {name} canary reached the ledger"


@pytest.mark.parametrize(("mode", "counted_in_the_ledger"), [("legacy", 0), ("auto", 2)])
async def test_over_http_a_session_is_rate_limited_counted_where_other_instances_can_see_it(
    tmp_path: Path, mode: str, counted_in_the_ledger: int
) -> None:
    """A 2025-era HTTP session lives in the instance that opened it: its rate is counted there, and the
    ledger holds no count of it. A 2026-07-28 caller (its principal and client name) may be served by any instance
    sharing the ledger: counted in the ledger. Either way the third call in a minute is refused and recorded."""
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"a": "b"}))
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False)
    with (config / "bastion.toml").open("a") as toml:  # its last table is [limits]
        toml.write("invocations_per_minute = 2\n")
    async with (
        bastion_http(["--config", str(config)], env=bastion_env(tmp_path / "home")) as bastion,
        host_client(bastion.mcp_url, mode) as (client, _),
    ):
        for _ in range(2):
            assert not (await client.call_tool("notes__read_note", {"name": "a"})).is_error
        assert error_class(await client.call_tool("notes__read_note", {"name": "a"})) == "rate_limited"
    assert [row["status"] for row in ledger_rows(config)] == ["completed", "completed", "denied"]
    with sqlite3.connect(config / "state" / "ledger.db") as db:
        assert db.execute("SELECT COALESCE(SUM(count), 0) FROM rate_counts").fetchone()[0] == counted_in_the_ledger


async def test_stdio_hosts_on_one_ledger_each_have_a_session_and_a_rate_budget_of_their_own(tmp_path: Path) -> None:
    """Each `bastion serve` over stdio serves one host: two of them on one ledger file (every stdio server a user
    starts shares the default one) count their calls apart, and the ledger tells their sessions apart."""
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"a": "b"}))
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False)
    with (config / "bastion.toml").open("a") as toml:  # its last table is [limits]
        toml.write("invocations_per_minute = 2\n")
    argv = bastion_command("serve", "--config", str(config))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=bastion_env(tmp_path / "home"))
    async with host_client(params, "auto") as (first, _), host_client(params, "auto") as (second, _):
        for _ in range(2):
            assert not (await first.call_tool("notes__read_note", {"name": "a"})).is_error
        assert error_class(await first.call_tool("notes__read_note", {"name": "a"})) == "rate_limited"
        assert not (await second.call_tool("notes__read_note", {"name": "a"})).is_error
    rows = ledger_rows(config)
    by_session: dict[str, list[str]] = {}
    for row in rows:
        by_session.setdefault(row["session_id"], []).append(row["status"])
    assert sorted(by_session.values()) == [["completed"], ["completed", "completed", "denied"]]
    assert all(session.startswith("stdio-") for session in by_session)


async def test_an_oversized_stdio_message_is_refused_and_the_session_and_connector_carry_on(tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    policy = '[modes]\n"notes:write_note" = "allow"\n'
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False, policy=policy)
    argv = bastion_command("serve", "--config", str(config))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=bastion_env(tmp_path / "home"))
    async with host_client(params, "auto") as (client, _):
        with pytest.raises(MCPError) as caught:
            await client.call_tool("notes__write_note", {"name": "big", "text": "x" * 20_000_000})
        assert caught.value.code == types.INVALID_REQUEST
        written = await client.call_tool("notes__write_note", {"name": "small", "text": "fits"})
        assert not written.is_error
    assert [r["status"] for r in ledger_rows(config)] == ["completed"]
    assert json.loads(notes.read_text()) == {"small": "fits"}


def test_connectors_check_names_a_failing_connector_s_exit_status_and_last_stderr_lines(tmp_path: Path) -> None:
    script = "import sys; print('boom: missing KEY', file=sys.stderr); sys.exit(3)"
    bad = f'command = {json.dumps(sys.executable)}\nargs = ["-c", {json.dumps(script)}]\n'
    config = write_config(
        tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False, extra_connectors={"bad": bad}
    )
    done = run_cli("connectors", "check", "bad", "--json", "--config", str(config), env=bastion_env(tmp_path / "home"))
    assert done.returncode == 1, done.stderr
    [status] = json.loads(done.stdout)
    assert status["last_error"] == "the process exited with status 3; its stderr ended with: boom: missing KEY"
    assert done.stderr.splitlines().count("boom: missing KEY") == 1
    assert "Traceback" not in done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def demo_over_http(port: int, notes: Path) -> AsyncIterator[None]:
    argv = [sys.executable, "-m", "bastion.demo.notes", "--transport", "http", "--port", str(port)]
    env = bastion_env(notes.parent / "home", BASTION_NOTES_FILE=str(notes))
    process = await anyio.open_process(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        process.kill()  # a crash, not a shutdown: no goodbye to the connector
        await stop(process)


async def test_killing_a_downstream_notifies_a_connected_host(tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    port = _free_port()
    remote = f'transport = "http"\nurl = "http://127.0.0.1:{port}/mcp"\n'
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False, extra_connectors={"remote": remote})
    argv = bastion_command("serve", "--config", str(config))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=bastion_env(tmp_path / "home"))
    remote_tools = {"remote__read_note", "remote__delete_note"}
    for mode in ERAS:
        async with host_client(params, mode) as (client, changes):
            async with demo_over_http(port, notes):
                await wait_for_tools(client, changes, lambda names: remote_tools <= names)
            # killed: the tools go, and the host hears about it without asking
            with anyio.fail_after(30):
                await changes.receive()
            names = await wait_for_tools(client, changes, lambda names: not (remote_tools & names))
            assert names >= NOTES_TOOLS
            async with demo_over_http(port, notes):
                await wait_for_tools(client, changes, lambda names: remote_tools <= names)


def test_doctor_reports_every_broken_file_while_serve_keeps_the_good_connector(tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False)
    (config / "connectors" / "broken.toml").write_text('command = "x"\nargs = [\n')
    (config / "policies" / "bad.toml").write_text('[modes]\n"notes:read_note" = "allow"\n[sources]\ndisabld = []\n')
    env = bastion_env(tmp_path / "home")

    doctor = run_cli("doctor", "--config", str(config), env=env)
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    assert "broken.toml:" in doctor.stdout and "bad.toml:4" in doctor.stdout

    catalog = run_cli("catalog", "--json", "--config", str(config), env=env)
    assert catalog.returncode == 0, catalog.stderr
    assert {row["tool"] for row in json.loads(catalog.stdout)} >= NOTES_TOOLS
    assert "broken.toml" in catalog.stderr


def test_a_policy_file_that_cannot_be_read_denies_every_call_until_it_is_fixed(tmp_path: Path) -> None:
    """Skipping it could allow what it denies: a policy file Bastion cannot parse fails closed, and says so."""
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    strict = config / "policies" / "strict.toml"
    strict.write_text('[modes]\n"notes:read_note" = "deny"\n[modes]\n')  # a table declared twice
    env = bastion_env(tmp_path / "home")
    catalog = run_cli("catalog", "--json", "--config", str(config), env=env)
    assert catalog.returncode == 0, catalog.stderr
    modes = {row["tool"]: (row["mode"], row["mode_source"]) for row in json.loads(catalog.stdout)}
    assert set(modes) >= NOTES_TOOLS
    assert set(modes.values()) == {("deny", "unreadable_policy:policies/strict.toml:3")}
    assert "strict.toml:3" in catalog.stderr and "every call is denied" in catalog.stderr
    strict.write_text('[modes]\n"notes:read_note" = "deny"\n')
    fixed = run_cli("catalog", "--json", "--config", str(config), env=env)
    modes = {row["tool"]: (row["mode"], row["mode_source"]) for row in json.loads(fixed.stdout)}
    assert modes["notes__read_note"] == ("deny", "org") and modes["notes__list_notes"] == ("allow", "inferred")


async def test_make_run_starts_the_embedded_default_and_healthz_answers(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    env = bastion_env(tmp_path / "home")
    command = ["make", "--no-print-directory", "-C", str(root), "run", "PORT=0"]
    async with bastion_http([], env=env, command=command) as bastion, httpx2.AsyncClient() as http:
        # Bastion serves before the demo connector is up: a host hears it arrive.
        async with host_client(bastion.mcp_url, "auto") as (client, changes):
            await wait_for_tools(client, changes, lambda names: names >= NOTES_TOOLS)
        health = (await http.get(f"{bastion.base_url}/healthz")).json()
    assert health["status"] == "ok"
    assert health["sources"] == [{"id": "notes", "state": "ready", "tools": 4}]
    assert (tmp_path / "home" / ".local" / "state" / "bastion" / "ledger.db").exists()
