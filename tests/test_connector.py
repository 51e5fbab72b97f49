"""McpConnector against in-process fixture downstreams and real subprocesses (stdio and streamable HTTP)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import pytest
from mcp import MCPError

from bastion.config import ConnectorConfig
from bastion.errors import CallTimeout, ConnectorUnavailable, UnknownOutcome, UpstreamError
from bastion.sources.mcp import McpConnector
from bastion.sources.mcp.connector import CORRELATION_META_KEY
from tests.downstream import FAILURE_CODE, FixtureServer, StreamTarget, default_tools
from tests.harness import harness
from tests.test_gateway import error_of

REPO_ROOT = Path(__file__).resolve().parent.parent
WAIT = 10.0
"""Upper bound of every wait: generous, since nothing here depends on timing."""

# How the connector reaches the fixture: in-process direct dispatch (negotiates 2026-07-28),
# memory streams through the dual-era server loop (2026-07-28), and the same with discover refused
# (falls back to the 2025-11-25 handshake).
ERAS = ["modern-direct", "modern-streams", "legacy-streams"]


class Changes:
    """An `on_change` callback that records calls and lets a test wait for a condition."""

    def __init__(self) -> None:
        self.sources: list[str] = []
        self._changed = anyio.Event()

    async def __call__(self, source_id: str) -> None:
        self.sources.append(source_id)
        self._changed.set()
        self._changed = anyio.Event()

    async def until(self, predicate: Callable[[], bool], timeout: float = WAIT) -> None:
        with anyio.fail_after(timeout):
            while not predicate():
                await self._changed.wait()


def fixture_link(era: str) -> tuple[FixtureServer, Callable[[], Any]]:
    """A fresh fixture and the connector `target` reaching it the way `era` names."""
    fixture = FixtureServer()
    if era == "modern-direct":
        return fixture, lambda: fixture.server
    return fixture, StreamTarget(fixture.server, legacy_only=era == "legacy-streams")


@asynccontextmanager
async def running(connector: McpConnector, changes: Changes) -> AsyncIterator[anyio.abc.TaskGroup]:
    async with anyio.create_task_group() as tg:
        tg.start_soon(connector.run, changes)
        try:
            yield tg
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def ready_connector(era: str) -> AsyncIterator[tuple[FixtureServer, McpConnector, Changes]]:
    """A connector of the default configuration on a fresh fixture reached the way `era` names, running and ready:
    the fixture, the connector and its recorded changes."""
    fixture, target = fixture_link(era)
    connector = McpConnector(config(), target=target)
    changes = Changes()
    async with running(connector, changes):
        await changes.until(ready(connector))
        yield fixture, connector, changes


def config(**fields: Any) -> ConnectorConfig:
    return ConnectorConfig.model_validate({"id": "fx", **fields})


def dump(tool: types.Tool) -> dict[str, Any]:
    return tool.model_dump(by_alias=True, mode="json", exclude_none=True)


def ready(connector: McpConnector) -> Callable[[], bool]:
    return lambda: connector.status.state == "ready"


def down(connector: McpConnector) -> Callable[[], bool]:
    return lambda: connector.status.state == "down"


@pytest.mark.anyio
@pytest.mark.parametrize("era", ERAS)
async def test_lists_tools_and_forwards_calls(era: str) -> None:
    async with ready_connector(era) as (_, connector, changes):
        assert changes.sources == ["fx"]
        assert [t.name for t in connector.tools()] == [t.name for t in default_tools()]
        assert connector.status.tools == len(default_tools())
        assert connector.status.server_name == "fixture"
        expected_version = "2025-11-25" if era == "legacy-streams" else "2026-07-28"
        assert connector.status.protocol_version == expected_version

        result = await connector.call("echo", {"text": "hi"}, correlation_id="c-1", timeout=WAIT)
        assert result.content == [types.TextContent(type="text", text="hi")]
        assert result.structured_content == {"echo": {"text": "hi"}}
        assert result.meta == {"example.com/kept": 1}


@pytest.mark.anyio
@pytest.mark.parametrize("era", ERAS)
async def test_annotations_and_schemas_pass_through_verbatim(era: str) -> None:
    async with ready_connector(era) as (fixture, connector, _):
        assert [dump(t) for t in connector.tools()] == [dump(t) for t in fixture.tools]


@pytest.mark.anyio
@pytest.mark.parametrize("era", ERAS)
async def test_correlation_id_reaches_the_downstream(era: str) -> None:
    async with ready_connector(era) as (fixture, connector, _):
        await connector.call("echo", {"text": "x"}, correlation_id="corr-42", timeout=WAIT)
    assert fixture.calls[-1].meta[CORRELATION_META_KEY] == "corr-42"


@pytest.mark.anyio
@pytest.mark.parametrize("era", ERAS)
async def test_list_changed_relists_the_source_and_calls_on_change(era: str) -> None:
    async with ready_connector(era) as (fixture, connector, changes):
        added = types.Tool(name="added", description="New.", input_schema={"type": "object"})
        await fixture.set_tools([*fixture.tools[:2], added])
        await changes.until(lambda: [t.name for t in connector.tools()] == ["echo", "sleep", "added"])
        assert changes.sources == ["fx", "fx"]
        assert connector.status.tools == 3
        assert connector.status.state == "ready"


@pytest.mark.anyio
async def test_every_page_of_the_listing_is_collected() -> None:
    fixture = FixtureServer(page_size=2)
    connector = McpConnector(config(), target=lambda: fixture.server)
    changes = Changes()
    async with running(connector, changes):
        await changes.until(ready(connector))
        assert [t.name for t in connector.tools()] == [t.name for t in default_tools()]
        assert fixture.list_requests == 3


@pytest.mark.anyio
@pytest.mark.parametrize("era", ERAS)
async def test_a_call_past_its_timeout_raises_call_timeout(era: str) -> None:
    async with ready_connector(era) as (fixture, connector, _):
        with pytest.raises(CallTimeout):
            await connector.call("sleep", {}, correlation_id="c", timeout=0.05)
        fixture.release.set()
        assert connector.status.state == "ready"


@pytest.mark.anyio
@pytest.mark.parametrize("era", ERAS)
async def test_an_error_response_raises_upstream_error(era: str) -> None:
    async with ready_connector(era) as (_, connector, _):
        with pytest.raises(UpstreamError) as caught:
            await connector.call("fail", {}, correlation_id="c", timeout=WAIT)
        assert str(FAILURE_CODE) in caught.value.message
        assert connector.status.state == "ready"


@pytest.mark.anyio
@pytest.mark.parametrize("era", ERAS)
async def test_a_result_off_its_output_schema_is_an_upstream_error_not_a_connector_unavailable(era: str) -> None:
    """The SDK checks structured content against the tool's output schema after the tool ran: never "nothing sent"."""
    async with ready_connector(era) as (fixture, connector, _):
        fixture.shapes_output = {"area": -1}
        with pytest.raises(UpstreamError) as caught:
            await connector.call("shapes", {"at": [1, 2]}, correlation_id="c", timeout=WAIT)
        assert not caught.value.retriable
        assert [c.name for c in fixture.calls] == ["shapes"]
        fixture.shapes_output = None
        with pytest.raises(UpstreamError):
            await connector.call("shapes", {"at": [1, 2]}, correlation_id="c", timeout=WAIT)
        assert connector.status.state == "ready"


@pytest.mark.anyio
async def test_through_the_gateway_a_result_off_its_output_schema_is_recorded_failed(tmp_path: Path) -> None:
    fixture = FixtureServer()
    fixture.shapes_output = {"area": "large"}
    async with harness(tmp_path, fixture=fixture, modes={"fx:shapes": "allow"}) as h:
        result = await h.call("fx__shapes", {"at": [1, 2]})
        assert result.is_error
        error = error_of(result)
        assert (error["class"], error["retriable"]) == ("upstream_error", False)
        invocation = await h.only_invocation()
        assert (invocation.status, invocation.error_class) == ("failed", "upstream_error")
        assert error["invocation_id"] == invocation.id


@pytest.mark.anyio
@pytest.mark.parametrize("era", ERAS)
async def test_progress_is_forwarded_to_the_caller(era: str) -> None:
    _, target = fixture_link(era)
    connector = McpConnector(config(), target=target)
    changes = Changes()
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with running(connector, changes):
        await changes.until(ready(connector))
        result = await connector.call("progress", {}, correlation_id="c", timeout=WAIT, on_progress=on_progress)
    assert result.content == [types.TextContent(type="text", text="done")]
    assert sorted(seen) == [(1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]


@pytest.mark.anyio
@pytest.mark.parametrize("era", ERAS)
async def test_concurrent_calls_share_the_connection(era: str) -> None:
    fixture, target = fixture_link(era)
    connector = McpConnector(config(), target=target)
    changes = Changes()
    results: dict[str, str] = {}

    async def call(name: str, arguments: dict[str, Any], key: str) -> None:
        result = await connector.call(name, arguments, correlation_id=key, timeout=WAIT)
        block = result.content[0]
        assert isinstance(block, types.TextContent)
        results[key] = block.text

    async with running(connector, changes):
        await changes.until(ready(connector))
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as calls:
                for i in range(5):
                    calls.start_soon(call, "sleep", {}, f"sleep-{i}")
                for i in range(5):
                    calls.start_soon(call, "echo", {"text": str(i)}, f"echo-{i}")
                await fixture.sleep_started.wait()
                fixture.release.set()
    assert results == {**{f"sleep-{i}": "released" for i in range(5)}, **{f"echo-{i}": str(i) for i in range(5)}}
    assert sorted(c.meta[CORRELATION_META_KEY] for c in fixture.calls) == sorted(results)


@pytest.mark.anyio
async def test_a_call_while_not_connected_raises_connector_unavailable() -> None:
    fixture = FixtureServer()
    target = StreamTarget(fixture.server)
    target.refusing = True
    connector = McpConnector(config(), target=target, backoff_initial=0.01, backoff_cap=0.05)
    with pytest.raises(ConnectorUnavailable):
        await connector.call("echo", {"text": "x"}, correlation_id="c", timeout=WAIT)
    changes = Changes()
    async with running(connector, changes):
        await changes.until(down(connector))
        assert connector.tools() == []
        assert connector.status.last_error is not None
        assert "ConnectionRefusedError" in connector.status.last_error
        with pytest.raises(ConnectorUnavailable):
            await connector.call("echo", {"text": "x"}, correlation_id="c", timeout=WAIT)
    assert fixture.calls == []


@pytest.mark.anyio
@pytest.mark.parametrize("era", ["modern-streams", "legacy-streams"])
async def test_a_dead_connection_withdraws_the_tools_and_reconnects(era: str) -> None:
    _, target = fixture_link(era)
    assert isinstance(target, StreamTarget)
    connector = McpConnector(config(), target=target, backoff_initial=0.01, backoff_cap=0.05, probe_interval=0.05)
    changes = Changes()
    async with running(connector, changes):
        await changes.until(ready(connector))
        target.kill()
        await changes.until(lambda: down(connector)() and connector.tools() == [])
        with pytest.raises(ConnectorUnavailable):
            await connector.call("echo", {"text": "x"}, correlation_id="c", timeout=WAIT)
        target.revive()
        await changes.until(lambda: ready(connector)() and len(connector.tools()) == len(default_tools()))
        assert target.connections >= 2
        result = await connector.call("echo", {"text": "back"}, correlation_id="c", timeout=WAIT)
        assert not result.is_error


@pytest.mark.anyio
@pytest.mark.parametrize("era", ["modern-streams", "legacy-streams"])
async def test_a_call_cut_off_by_a_dying_connection_has_an_unknown_outcome(era: str) -> None:
    fixture, target = fixture_link(era)
    assert isinstance(target, StreamTarget)
    connector = McpConnector(config(), target=target, backoff_initial=0.01, backoff_cap=0.05)
    changes = Changes()
    async with running(connector, changes):
        await changes.until(ready(connector))
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:

                async def kill_once_started() -> None:
                    await fixture.sleep_started.wait()
                    target.kill(refuse=False)

                tg.start_soon(kill_once_started)
                with pytest.raises(UnknownOutcome):
                    await connector.call("sleep", {}, correlation_id="c", timeout=WAIT)
        # The connector noticed through the call and reconnects by itself.
        await changes.until(lambda: ready(connector)() and target.connections >= 2)


@pytest.mark.anyio
async def test_a_failing_listing_marks_the_source_down_and_is_retried() -> None:
    fixture = FixtureServer()
    fixture.listing_error = MCPError(types.INTERNAL_ERROR, "listing broke")
    connector = McpConnector(config(), target=lambda: fixture.server, backoff_initial=0.01, backoff_cap=0.05)
    changes = Changes()
    async with running(connector, changes):
        await changes.until(down(connector))
        assert connector.status.last_error is not None
        assert "listing broke" in connector.status.last_error
        assert connector.tools() == []
        fixture.listing_error = None
        await changes.until(ready(connector))
        assert len(connector.tools()) == len(default_tools())


@pytest.mark.anyio
async def test_a_listing_without_answer_times_out_and_is_retried() -> None:
    fixture = FixtureServer()
    fixture.listing_gate = anyio.Event()
    connector = McpConnector(
        config(), target=lambda: fixture.server, list_timeout=0.1, backoff_initial=0.01, backoff_cap=0.05
    )
    changes = Changes()
    async with running(connector, changes):
        await changes.until(down(connector))
        assert connector.status.last_error is not None
        assert "within 0.1s" in connector.status.last_error
        fixture.listing_gate.set()
        await changes.until(ready(connector))
        assert len(connector.tools()) == len(default_tools())


@pytest.mark.anyio
async def test_a_failing_on_change_callback_does_not_stop_the_connector() -> None:
    fixture = FixtureServer()
    connector = McpConnector(config(), target=lambda: fixture.server)
    changes = Changes()

    async def flaky(source_id: str) -> None:
        await changes(source_id)
        raise RuntimeError("listener bug")

    async with anyio.create_task_group() as tg:
        tg.start_soon(connector.run, flaky)
        await changes.until(ready(connector))
        await fixture.set_tools(fixture.tools[:1])
        await changes.until(lambda: len(connector.tools()) == 1)
        tg.cancel_scope.cancel()


# Real subprocesses ---------------------------------------------------------------------------------


def demo_children() -> list[int]:
    """Pids of this process's children running the demo notes server."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and "bastion.demo.notes" in cmdline:
            pids.append(int(entry.name))
    return pids


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ConnectorLog(logging.Handler):
    """The connector module's log records, with a wait for a condition on them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._logged = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self._logged.set()
        self._logged = anyio.Event()

    def count(self, level: int, text: str) -> int:
        return sum(1 for r in self.records if r.levelno == level and text in r.getMessage())

    async def until(self, predicate: Callable[[], bool]) -> None:
        with anyio.fail_after(WAIT):
            while not predicate():
                await self._logged.wait()


@pytest.fixture
def connector_log() -> Iterator[ConnectorLog]:
    handler = ConnectorLog()
    logger = logging.getLogger("bastion.sources.mcp.connector")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.mark.anyio
async def test_a_stdio_connector_that_exits_shows_its_status_and_stderr_once_however_often_it_is_retried(
    connector_log: ConnectorLog, capfd: pytest.CaptureFixture[str]
) -> None:
    script = "import sys; print('starting', file=sys.stderr); print('boom: missing KEY', file=sys.stderr); sys.exit(3)"
    connector = McpConnector(
        config(command=sys.executable, args=["-c", script]), backoff_initial=0.01, backoff_cap=0.02
    )
    async with running(connector, Changes()):
        await connector_log.until(lambda: connector_log.count(logging.INFO, "reconnecting") >= 4)
        last_error = connector.status.last_error
    assert last_error == "the process exited with status 3; its stderr ended with: starting | boom: missing KEY"
    assert connector_log.count(logging.WARNING, "connector fx is down") == 1
    assert capfd.readouterr().err.count("boom: missing KEY") == 1


@pytest.mark.anyio
async def test_a_stdio_connector_s_stderr_reaches_bastion_s_once_it_is_connected(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    script = "import sys; print('notes: starting up', file=sys.stderr); from bastion.demo.notes import main; main()"
    connector = McpConnector(
        config(command=sys.executable, args=["-c", script], env={"BASTION_NOTES_FILE": str(tmp_path / "n.json")})
    )
    changes = Changes()
    async with running(connector, changes):
        await changes.until(ready(connector))
    assert capfd.readouterr().err.count("notes: starting up") == 1


@pytest.mark.anyio
async def test_a_killed_stdio_downstream_is_noticed_and_respawned(tmp_path: Path, connector_log: ConnectorLog) -> None:
    connector = McpConnector(
        config(
            command=sys.executable,
            args=["-m", "bastion.demo.notes"],
            env={"BASTION_NOTES_FILE": str(tmp_path / "notes.json")},
            cwd=str(REPO_ROOT),
        ),
        backoff_initial=0.05,
        backoff_cap=0.2,
    )
    changes = Changes()
    async with running(connector, changes):
        await changes.until(ready(connector))
        assert {t.name for t in connector.tools()} == {"list_notes", "read_note", "write_note", "delete_note"}
        [first] = demo_children()
        os.kill(first, signal.SIGKILL)
        await changes.until(lambda: down(connector)() and connector.tools() == [])
        await connector_log.until(lambda: connector_log.count(logging.WARNING, "was killed by SIGKILL") == 1)
        await changes.until(lambda: ready(connector)() and len(connector.tools()) == 4)
        assert demo_children() != [first]
        result = await connector.call("write_note", {"name": "n", "text": "t"}, correlation_id="c", timeout=WAIT)
        assert not result.is_error


@pytest.mark.anyio
async def test_messages_of_megabytes_cross_a_stdio_connection_whole(tmp_path: Path) -> None:
    connector = McpConnector(
        config(
            command=sys.executable,
            args=["-m", "bastion.demo.notes"],
            env={"BASTION_NOTES_FILE": str(tmp_path / "notes.json")},
            cwd=str(REPO_ROOT),
        )
    )
    text = "0123456789abcdef" * 200_000  # 3.2 MB: many pipe reads in each direction
    changes = Changes()
    async with running(connector, changes):
        await changes.until(ready(connector))
        written = await connector.call("write_note", {"name": "big", "text": text}, correlation_id="w", timeout=WAIT)
        assert not written.is_error
        read = await connector.call("read_note", {"name": "big"}, correlation_id="r", timeout=WAIT)
    assert read.structured_content == {"name": "big", "text": text}


@asynccontextmanager
async def demo_http_server(port: int, notes: Path) -> AsyncIterator[anyio.abc.Process]:
    process = await anyio.open_process(
        [sys.executable, "-m", "bastion.demo.notes", "--transport", "http", "--port", str(port)],
        cwd=REPO_ROOT,
        env={**os.environ, "BASTION_NOTES_FILE": str(notes)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()


@pytest.mark.anyio
async def test_a_killed_http_downstream_is_noticed_and_picked_up_again(tmp_path: Path) -> None:
    port = free_port()
    notes = tmp_path / "notes.json"
    connector = McpConnector(
        config(transport="http", url=f"http://127.0.0.1:{port}/mcp"), backoff_initial=0.05, backoff_cap=0.2
    )
    changes = Changes()
    async with running(connector, changes):
        async with demo_http_server(port, notes) as server:
            await changes.until(ready(connector), timeout=30)
            assert len(connector.tools()) == 4
            server.kill()
            await changes.until(lambda: down(connector)() and connector.tools() == [])
        async with demo_http_server(port, notes):
            await changes.until(lambda: ready(connector)() and len(connector.tools()) == 4, timeout=30)
            result = await connector.call("list_notes", {}, correlation_id="c", timeout=WAIT)
            assert not result.is_error
            assert result.meta is None


@pytest.mark.anyio
async def test_the_pypi_time_server_lists_over_stdio() -> None:
    connector = McpConnector(config(command=sys.executable, args=["-m", "mcp_server_time"]))
    changes = Changes()
    async with running(connector, changes):
        await changes.until(ready(connector), timeout=30)
        assert {t.name for t in connector.tools()} == {"get_current_time", "convert_time"}
        result = await connector.call("get_current_time", {"timezone": "UTC"}, correlation_id="c", timeout=WAIT)
        assert not result.is_error
        assert result.structured_content is not None
