"""The express lane: every call it takes is answered, recorded and relayed as through the SDK's server,
on stdio and over HTTP, in both protocol eras; what it cannot serve it leaves to the SDK; and it skips no check.

The downstream is a real child process (tests/wire_server.py) that Bastion runs over stdio, so the calls the lane
takes are also forwarded over the wire path (bastion.sources.mcp.forwarding). Each scenario runs twice, with
`[server] express_lane` on and off, and the two runs must agree: what the host got, and what the ledger holds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp_types import methods
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from bastion.actions import WireResult
from bastion.config import ApprovalSettings, Config, ConnectorConfig, LimitSettings, PolicyConfig, Settings
from bastion.config.models import ServerSettings
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.models import CallContext, Invocation
from bastion.pipeline.gateway import Gateway
from bastion.server.express import ExpressCall, ExpressCounts, express_call
from bastion.server.express_stdio import StdioExpressLane
from bastion.server.mcp import HostServer
from bastion.server.stdio import pipe_streams
from bastion.sources.mcp import McpConnector
from bastion.sources.mcp.wire import ResultChecks, WireCalls, WireUnreadable
from tests.processes import bastion_env, bastion_http
from tests.wire_server import HUGE

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
INVOCATION_ID = re.compile(r"\b[0-9a-f]{24}\b")
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d+)?")
MODES = {"fx:*": "allow", "fx:sleep": "require_approval", "fx:ask": "deny"}
"""Everything allowed, but `sleep` waits for an approver and `ask` is denied."""


@dataclass
class Host:
    """What a host heard besides results: progress, log lines, questions it answered."""

    progress: list[float] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)

    async def sample(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        self.asked.append("sampling")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="a haiku"), model="test-model"
        )

    async def elicit(self, context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append("elicitation")
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(f"{params.level} {params.data}")

    def client(self, target: Any, *, mode: str, answers: bool) -> Client:
        """An SDK client for this host; `answers`: it declares sampling and elicitation and answers them."""
        return Client(
            target,
            cache=None,
            mode=mode,
            sampling_callback=self.sample if answers else None,
            elicitation_callback=self.elicit if answers else None,
            logging_callback=self.log,
        )


# -- the scenario, and what is compared


def scenario(*, answers: bool) -> list[tuple[str, dict[str, Any], bool]]:
    """(tool, arguments, with progress) for every kind of answer: results, refusals of each class, relays.
    `answers`: the host answers questions (only 2025-era hosts are asked through the lane)."""
    calls: list[tuple[str, dict[str, Any], bool]] = [
        ("fx__echo", {"text": "hello"}, False),  # a result whose protocol _meta key is stripped
        ("fx__shapes", {"at": [1, 2]}, False),  # structured content, checked against the output schema
        ("fx__deep", {}, False),  # deeply nested
        ("fx__huge", {"n": HUGE}, False),  # integers beyond 64 bits, both ways
        ("fx__fail", {}, False),  # the downstream's JSON-RPC error: upstream_error
        ("fx__off_schema", {}, False),  # off its own output schema: upstream_error
        ("fx__echo", {}, False),  # invalid_arguments, nothing recorded
        ("fx__nope", {}, False),  # not_found
        ("fx__ask", {}, False),  # policy_denied
        ("fx__progress", {}, True),  # progress relayed under the host's token
        ("fx__chatty", {}, False),  # log lines relayed (2025-era: info and above)
        ("fx__sample", {"prompt": "a haiku"}, False),  # sampling: answered, or refused for a host that cannot
        ("fx__sleep", {}, False),  # held for an approver: handed back to the SDK's server
    ]
    if answers:
        calls.append(("fx__ask", {}, False))
    return calls


def held_calls(calls: Sequence[tuple[str, dict[str, Any], bool]]) -> int:
    return sum(1 for tool, _, _ in calls if tool == "fx__sleep")


def lane_answers(calls: Sequence[tuple[str, dict[str, Any], bool]], *, progress: bool = True) -> int:
    """The calls the lane answers: all but the held one and the unknown tool (the SDK's server waits for a source
    still starting before it says not_found), and, unless it relays `progress`, those that want progress."""
    return sum(1 for tool, _, wants in calls if tool not in ("fx__sleep", "fx__nope") and (progress or not wants))


async def run_scenario(
    client: Client, calls: Sequence[tuple[str, dict[str, Any], bool]], host: Host, directory: Path
) -> list[dict[str, Any]]:
    """Every call's result as the host got it (invocation ids, times and the run's `directory` aside)."""
    results = []

    async def heard(progress: float, total: float | None, message: str | None) -> None:
        host.progress.append(progress)

    for tool, arguments, progress in calls:
        with anyio.fail_after(30):
            if progress:
                result = await client.call_tool(tool, arguments, progress_callback=heard)
            else:
                result = await client.call_tool(tool, arguments)
        dumped = json.loads(result.model_dump_json(by_alias=True, exclude_none=True).replace(str(directory), "DIR"))
        results.append(_comparable(dumped))
    return results


def _comparable(value: Any) -> Any:
    """`value` without what differs between two runs by nature: invocation ids (in refusals) and timestamps."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items() if k not in ("invocation_id", "invocationId")}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    if isinstance(value, str):
        return TIMESTAMP.sub("TIME", INVOCATION_ID.sub("ID", value))
    return value


def recorded(invocations: Sequence[Invocation]) -> list[dict[str, Any]]:
    """The ledger's records in the fields both runs must agree on, in an order of their own (calls made at once
    may be recorded in either order)."""
    fields = ("tool", "status", "mode", "mode_source", "risk", "error_class", "args", "result")
    records = [_comparable(invocation.model_dump(mode="json", include=set(fields))) for invocation in invocations]
    return sorted(records, key=lambda record: json.dumps(record, sort_keys=True))


# -- Bastion over stdio, in this process (the lane's counts can be read)


def _config(tmp_path: Path, *, express: bool, modes: dict[str, str] | None = None) -> Config:
    connector = ConnectorConfig(
        id="fx", command=sys.executable, args=["-m", "tests.wire_server"], cwd=str(ROOT), env={"PYTHONPATH": str(ROOT)}
    )
    return Config(
        directory=None,
        settings=Settings(
            server=ServerSettings(express_lane=express),
            limits=LimitSettings(invocations_per_minute=1000, call_timeout_seconds=20),
            approvals=ApprovalSettings(wait_without_progress_seconds=0),
        ),
        connectors=[connector],
        policy=PolicyConfig.model_validate({"modes": modes or MODES}),
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
    )


@contextlib.contextmanager
def _pipes() -> Iterator[tuple[int, int, int, int]]:
    """(host writes, Bastion reads, Bastion writes, host reads), non-blocking."""
    bastion_in, host_out = os.pipe()
    host_in, bastion_out = os.pipe()
    for fd in (bastion_in, host_out, host_in, bastion_out):
        os.set_blocking(fd, False)
    try:
        yield host_out, bastion_in, bastion_out, host_in
    finally:
        for fd in (bastion_in, host_out, host_in, bastion_out):
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass
class StdioRun:
    client: Client
    ledger: OpenLedger
    gateway: Gateway
    counts: ExpressCounts | None


@dataclass
class StdioFront:
    """A host server serving stdio over real pipes: the host's ends of them, and what Bastion keeps."""

    ledger: OpenLedger
    gateway: Gateway
    counts: ExpressCounts | None
    host_out: int
    host_in: int


@asynccontextmanager
async def stdio_front(
    tmp_path: Path, *, express: bool, modes: dict[str, str] | None = None
) -> AsyncIterator[StdioFront]:
    """Bastion in this process serving stdio over real pipes, with the express lane or without, until the block
    ends (the host's input then ends too)."""
    config = _config(tmp_path, express=express, modes=modes)
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, [McpConnector(config.connectors[0])])
        async with gateway.running():
            front = HostServer(gateway, session_id="stdio")
            lane = StdioExpressLane(front) if express else None
            with _pipes() as (host_out, bastion_in, bastion_out, host_in):
                async with (
                    pipe_streams(bastion_in, bastion_out, lane) as (read_stream, write_stream),
                    anyio.create_task_group() as tg,
                ):
                    options = front.server.create_initialization_options()
                    tg.start_soon(front.server.run, read_stream, write_stream, options)
                    yield StdioFront(ledger, gateway, lane.counts if lane is not None else None, host_out, host_in)
                    os.close(host_out)  # end of input: the server's run ends
                    tg.cancel_scope.cancel()


@asynccontextmanager
async def stdio_bastion(
    tmp_path: Path,
    *,
    express: bool,
    mode: str,
    host: Host,
    answers: bool,
    modes: dict[str, str] | None = None,
) -> AsyncIterator[StdioRun]:
    """`stdio_front` with an SDK client as its host, its tools listed."""
    async with (
        stdio_front(tmp_path, express=express, modes=modes) as front,
        host.client(pipe_streams(front.host_in, front.host_out), mode=mode, answers=answers) as client,
    ):
        with anyio.fail_after(30):
            await client.list_tools()
        yield StdioRun(client, front.ledger, front.gateway, front.counts)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_over_stdio_every_call_is_answered_and_recorded_as_the_sdks_server_answers_it(
    tmp_path: Path, mode: str
) -> None:
    answers = mode == "legacy"  # a 2026-07-28 host that declares sampling is asked by a parked call (the SDK's)
    calls = scenario(answers=answers)
    outcomes = {}
    for express in (True, False):
        host = Host()
        directory = tmp_path / f"express-{express}"
        directory.mkdir()
        async with stdio_bastion(directory, express=express, mode=mode, host=host, answers=answers) as run:
            results = await run_scenario(run.client, calls, host, directory)
            records = recorded(await run.ledger.invocations.list(limit=1000))
            if run.counts is not None:
                assert run.counts.answered == lane_answers(calls)
                assert run.counts.handed_back == held_calls(calls)
        outcomes[express] = (results, records, host)
    (lane_results, lane_records, lane_host), (sdk_results, sdk_records, sdk_host) = outcomes[True], outcomes[False]
    assert lane_results == sdk_results
    assert lane_records == sdk_records
    assert (lane_host.progress, lane_host.logs, lane_host.asked) == (sdk_host.progress, sdk_host.logs, sdk_host.asked)
    assert lane_host.progress == [1.0, 2.0, 3.0]
    assert lane_host.logs == (["info info line", "warning warning line"] if answers else [])
    statuses = [record["status"] for record in lane_records]
    assert statuses.count("completed") >= 6 and "unknown" not in statuses
    assert any(record["status"] == "pending" for record in lane_records)  # the held call, handed back


# -- Bastion over streamable HTTP, a real process (the lane's counts come from /metrics)


def _config_dir(tmp_path: Path, *, express: bool) -> Path:
    directory = tmp_path / "config"
    (directory / "connectors").mkdir(parents=True)
    (directory / "policies").mkdir()
    (directory / "bastion.toml").write_text(
        f'[server]\nledger = "sqlite:///state/ledger.db"\nstartup_wait_seconds = 20\n'
        f"express_lane = {json.dumps(express)}\n"
        "[limits]\ninvocations_per_minute = 1000\ncall_timeout_seconds = 20\n"
        "[approvals]\nwait_without_progress_seconds = 0\n"
    )
    (directory / "connectors" / "fx.toml").write_text(
        f'command = {json.dumps(sys.executable)}\nargs = ["-m", "tests.wire_server"]\ncwd = {json.dumps(str(ROOT))}\n'
        f"env = {{ PYTHONPATH = {json.dumps(str(ROOT))} }}\n"
    )
    (directory / "policies" / "default.toml").write_text(
        "[modes]\n" + "".join(f"{json.dumps(key)} = {json.dumps(mode)}\n" for key, mode in MODES.items())
    )
    return directory


async def _express_counts(base_url: str) -> dict[str, float]:
    async with httpx2.AsyncClient() as http:
        scraped = (await http.get(f"{base_url}/metrics")).text
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if sample.name == "bastion_express_calls_total"
    }


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_over_http_every_call_is_answered_and_recorded_as_the_sdks_server_answers_it(
    tmp_path: Path, mode: str
) -> None:
    answers = mode == "legacy"
    calls = scenario(answers=answers)
    outcomes = {}
    for express in (True, False):
        host = Host()
        directory = tmp_path / f"express-{express}"
        config = _config_dir(directory, express=express)
        env = bastion_env(directory / "home")
        async with bastion_http(["--config", str(config)], env=env) as server:
            async with host.client(server.mcp_url, mode=mode, answers=answers) as client:
                with anyio.fail_after(30):
                    await client.list_tools()  # the first listing waits for the connector to list
                results = await run_scenario(client, calls, host, directory)
            counts = await _express_counts(server.base_url)
        async with await open_ledger(config / "state" / "ledger.db", redactor=Redactor()) as ledger:
            records = recorded(await ledger.invocations.list(limit=1000))
        outcomes[express] = (results, records, host, counts)
    lane, sdk = outcomes[True], outcomes[False]
    assert lane[0] == sdk[0]
    assert lane[1] == sdk[1]
    assert (lane[2].progress, lane[2].logs, lane[2].asked) == (sdk[2].progress, sdk[2].logs, sdk[2].asked)
    # A 2026-07-28 request that wants progress is answered on an event stream: the SDK's.
    assert lane[3] == {"answered": lane_answers(calls, progress=answers), "handed_back": held_calls(calls)}
    assert sdk[3] == {"answered": 0, "handed_back": 0}


# -- the wire itself


async def test_an_answer_nested_beyond_every_json_parsers_depth_ends_its_call_at_once_as_unknown(
    tmp_path: Path,
) -> None:
    wire = WireCalls()
    sent: list[bytes] = []

    async def send(line: bytes) -> None:
        sent.append(line)

    wire.attach(send)
    failures: list[BaseException] = []
    async with anyio.create_task_group() as tg:

        async def call() -> None:
            try:
                await wire.request("tools/call", {"name": "x"}, timeout=60)
            except WireUnreadable as exc:
                failures.append(exc)

        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        request_id = json.loads(sent[0])["id"]
        nested = "[" * 5000 + "]" * 5000
        line = '{"jsonrpc":"2.0","id":' + json.dumps(request_id) + ',"result":{"content":[],"deep":' + nested + "}}"
        assert wire.claims(line.encode())
    assert len(failures) == 1  # at once, not after the minute of its timeout


async def test_a_call_past_its_timeout_or_given_up_is_cancelled_at_the_downstream() -> None:
    """A call with no answer within its timeout raises TimeoutError (the gateway's `call_timeout`), and one its
    caller gives up on is cancelled too: either way the downstream is told (`notifications/cancelled`), and an
    answer that comes later is no longer taken."""
    wire = WireCalls()
    sent: list[dict[str, Any]] = []

    async def send(line: bytes) -> None:
        sent.append(json.loads(line))

    wire.attach(send)
    with anyio.fail_after(10), pytest.raises(TimeoutError):
        await wire.request("tools/call", {"name": "x"}, timeout=0.05)
    timed_out = sent[0]["id"]
    assert sent[1] == {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": timed_out}}
    assert not wire.claims(json.dumps({"jsonrpc": "2.0", "id": timed_out, "result": {}}).encode())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(wire.request, "tools/call", {"name": "y"}, timeout=60))
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    given_up = sent[2]["id"]
    assert sent[3] == {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": given_up}}


async def test_a_call_answered_after_a_log_message_returns_once_the_log_message_was_relayed() -> None:
    """A log message the process writes during a call goes to the SDK's session, the answer after it straight to
    the call: the call returns only once the session has relayed the message (`heard_log`), so its host hears it
    before the result (a TypeScript server writes both at once, and the message was lost)."""
    wire = WireCalls()
    sent: list[dict[str, Any]] = []

    async def send(line: bytes) -> None:
        sent.append(json.loads(line))

    wire.attach(send)
    returned = anyio.Event()

    async def call() -> None:
        await wire.request("tools/call", {"name": "x"}, timeout=60)
        returned.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.wait_all_tasks_blocked()
            log = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}}
            assert not wire.claims(json.dumps(log).encode())  # the session's, to relay
            assert wire.claims(json.dumps({"jsonrpc": "2.0", "id": sent[0]["id"], "result": {}}).encode())
            await anyio.wait_all_tasks_blocked()
            assert not returned.is_set()
            wire.heard_log()
            await returned.wait()


async def test_a_line_that_answers_no_call_of_the_wire_is_left_to_the_sdks_session() -> None:
    wire = WireCalls()
    assert not wire.claims(b'{"jsonrpc":"2.0","id":"bastion-1","result":{}}')  # nothing waits for it
    assert not wire.claims(b'{"jsonrpc":"2.0","id":3,"result":{}}')


# -- odd and hostile input, straight onto the stdio wire

ODD_LINES: list[bytes] = [
    b"not json at all",
    b'[{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"fx__echo","arguments":{"text":"a"}}}]',
    b'{"jsonrpc":"2.0","id":11,"method":"tools/call","params":["fx__echo"]}',
    b'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":7,"arguments":{}}}',
    b'{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"fx__echo","arguments":["a"]}}',
    b'{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"fx__echo","arguments":{"text":"a"},"task":{}}}',
    b'{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"name":"fx__echo","arguments":{"text":"a"}}}',
    b'{"jsonrpc":"1.0","id":16,"method":"tools/call","params":{"name":"fx__echo","arguments":{"text":"a"}}}',
    b'{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"fx__echo","arguments":{"text":"a\xff\xfe"}}}',
    b'{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":"fx__echo",'
    b'"arguments":{"text":"x","password":"hunter2","note":"Bearer abcdef0123456789"}}}',
    b'{"jsonrpc":"2.0","id":19,"method":"tools/call","params":{"name":"fx__echo","arguments":{"text":"x","deep":'
    + b"[" * 3000
    + b"]" * 3000
    + b"}}}",
    b'{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"fx__echo","arguments":{"text":'
    + str(HUGE).encode()
    + b"}}}",
    b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":12345}}',
    b'{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"fx__echo","arguments":{"text":"same id"}}}',
    b'{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"fx__echo","arguments":{"text":"same id"}}}',
]
"""Lines no host should send, and the lines of a careless one: each must be answered as the SDK's server answers it."""


async def _raw_session(tmp_path: Path, *, express: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Send `ODD_LINES` on an initialized 2025-era stdio connection; every answer and what the ledger recorded, each
    in an order of its own."""
    async with stdio_front(tmp_path, express=express) as front:
        host = await _RawHost.initialized(front)
        for line in ODD_LINES:
            await host.write(line + b"\n")
        await host.send({"jsonrpc": "2.0", "id": 99, "method": "ping"})
        # 11, 16 and 19 are not JSON-RPC requests the SDK can read: nobody answers them.
        expected = {12, 13, 14, 17, 18, 20, 21, 99}
        with anyio.fail_after(30):  # both calls with id 21 are answered, as the SDK answers both
            while not expected <= host.answered_ids() or host.count(21) < 2:
                await host.read()
        records = recorded(await front.ledger.invocations.list(limit=100))
    answers = [_comparable(answer) for answer in host.answers if answer.get("id") not in (1, 2, 99)]
    return sorted(answers, key=lambda a: json.dumps(a, sort_keys=True)), records


async def test_a_lone_surrogate_the_lane_reads_is_refused_as_invalid_arguments_and_nothing_is_recorded(
    tmp_path: Path,
) -> None:
    """The lane reads a line orjson refuses with the standard library, which takes a lone surrogate escape: the call
    is refused as invalid arguments (the answer itself carrying no surrogate), before anything is recorded."""
    async with stdio_front(tmp_path, express=True) as front:
        host = await _RawHost.initialized(front)
        arguments = b'{"text":"a\\ud800"}'
        await host.write(b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"fx__echo","arguments":')
        await host.write(arguments + b"}}\n")
        answer = await host.answer(5)
        assert answer["result"]["isError"] is True
        assert answer["result"]["structuredContent"]["error"]["class"] == "invalid_arguments"
        assert await front.ledger.invocations.list() == []


class _RawHost:
    """A host that writes raw lines and reads JSON-RPC answers (one a line) off Bastion's stdout."""

    def __init__(self, out_fd: int, in_fd: int) -> None:
        self._out, self._in = out_fd, in_fd
        self._buffer = b""
        self.answers: list[dict[str, Any]] = []

    @classmethod
    async def initialized(cls, front: StdioFront) -> _RawHost:
        """A host on `front`'s pipes with an initialized 2025-era connection, tools listed (the lane takes calls)."""
        await front.gateway.first_listings()
        host = cls(front.host_out, front.host_in)
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "odd", "version": "1"}}
        await host.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        await host.answer(1)
        await host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await host.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        await host.answer(2)
        return host

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            await anyio.wait_writable(self._out)
            with contextlib.suppress(BlockingIOError):
                view = view[os.write(self._out, view) :]

    async def send(self, message: dict[str, Any]) -> None:
        await self.write(json.dumps(message).encode() + b"\n")

    async def read(self) -> None:
        await anyio.wait_readable(self._in)
        with contextlib.suppress(BlockingIOError):
            self._buffer += os.read(self._in, 1 << 16)
        *lines, self._buffer = self._buffer.split(b"\n")
        self.answers += [json.loads(line) for line in lines if line.strip()]

    def count(self, request_id: int) -> int:
        return sum(1 for answer in self.answers if answer.get("id") == request_id)

    def answered_ids(self) -> set[Any]:
        return {answer.get("id") for answer in self.answers}

    async def answer(self, request_id: int) -> dict[str, Any]:
        with anyio.fail_after(30):
            while request_id not in self.answered_ids():
                await self.read()
        return next(answer for answer in self.answers if answer.get("id") == request_id)


async def test_odd_and_hostile_lines_are_answered_and_recorded_as_without_the_lane(tmp_path: Path) -> None:
    (tmp_path / "lane").mkdir()
    (tmp_path / "sdk").mkdir()
    lane_answers, lane_records = await _raw_session(tmp_path / "lane", express=True)
    sdk_answers, sdk_records = await _raw_session(tmp_path / "sdk", express=False)
    assert lane_answers == sdk_answers
    assert lane_records == sdk_records
    redacted = json.dumps([record["args"] for record in lane_records])
    assert "hunter2" not in redacted and "abcdef0123456789" not in redacted
    assert any(str(HUGE) in json.dumps(answer) for answer in lane_answers)  # read whole, never as a float


class _Moments:
    """An observer of the gateway: when a call started running, and how it ended."""

    def __init__(self) -> None:
        self.running = anyio.Event()
        self.done = anyio.Event()
        self.ended: list[Invocation] = []

    async def planned(self, invocation: Invocation) -> None:
        pass

    async def decided(self, invocation: Invocation) -> None:
        pass

    async def executing(self, invocation: Invocation) -> None:
        self.running.set()

    async def finished(self, invocation: Invocation) -> None:
        self.ended.append(invocation)
        self.done.set()


@pytest.mark.parametrize("express", [True, False], ids=["lane", "sdk"])
async def test_a_call_its_host_cancels_is_cancelled_and_recorded_unknown(tmp_path: Path, express: bool) -> None:
    host = Host()
    modes = {**MODES, "fx:sleep": "allow"}
    async with stdio_bastion(tmp_path, express=express, mode="legacy", host=host, answers=False, modes=modes) as run:
        moments = _Moments()
        run.gateway.observers.add(moments)
        async with anyio.create_task_group() as tg:
            tg.start_soon(run.client.call_tool, "fx__sleep", {})
            with anyio.fail_after(30):
                await moments.running.wait()
            tg.cancel_scope.cancel()  # the SDK's client tells Bastion: notifications/cancelled
        with anyio.fail_after(30):
            await moments.done.wait()
        (ended,) = moments.ended
        assert (ended.status, ended.error_class) == ("unknown", "unknown_outcome")
        result = await run.client.call_tool("fx__echo", {"text": "still here"})  # the session goes on
        assert not result.is_error
        if run.counts is not None:
            assert run.counts.answered == 1  # the cancelled call has no answer


async def test_the_host_is_answered_before_the_outcome_is_recorded_which_is_recorded_even_if_answering_fails(
    tmp_path: Path,
) -> None:
    """An express call's answer leaves before its outcome is recorded (the recording is off the host's wait), and
    an answer that cannot be sent (the host is gone) still leaves the outcome recorded."""
    config = _config(tmp_path, express=True)
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, [McpConnector(config.connectors[0])])
        async with gateway.running():
            context = CallContext(session_id="s")
            seen: list[tuple[str, dict[str, Any]]] = []

            async def answer(result: WireResult) -> None:
                (invocation,) = await ledger.invocations.list(session_id="s")
                seen.append((invocation.status, result.data))

            with anyio.fail_after(30):
                returned = await gateway.call_express("fx__echo", {"text": "first"}, context, answer)
            ((status, delivered),) = seen
            assert status == "executing"  # answered before the outcome was recorded
            assert delivered == returned.data and delivered["content"] == [{"type": "text", "text": "first"}]
            (recorded,) = await ledger.invocations.list(session_id="s")
            assert (recorded.status, recorded.result) == ("completed", delivered)

            async def host_gone(result: WireResult) -> None:
                raise anyio.BrokenResourceError

            with pytest.raises(anyio.BrokenResourceError), anyio.fail_after(30):
                await gateway.call_express("fx__echo", {"text": "second"}, context, host_gone)
            latest, _ = await ledger.invocations.list(session_id="s")
            assert latest.status == "completed"
            assert latest.result is not None and latest.result["content"] == [{"type": "text", "text": "second"}]


@pytest.mark.parametrize("express", [True, False], ids=["lane", "sdk"])
async def test_the_hosts_trace_context_reaches_the_downstream_without_a_tracer_provider(
    tmp_path: Path, express: bool
) -> None:
    """As the SDK's server makes a request's trace context current for its handler, the lane continues it: the
    downstream gets the host's `traceparent` and `tracestate`, spans recorded or not."""
    context = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "vendor=x"}
    async with stdio_bastion(tmp_path, express=express, mode="legacy", host=Host(), answers=False) as run:
        meta = cast(types.RequestParamsMeta, context)
        result = await run.client.call_tool("fx__trace", {}, meta=meta)
        if run.counts is not None:
            assert run.counts.answered == 1
    assert not result.is_error
    traceparent = str((result.structured_content or {}).get("traceparent"))
    assert traceparent.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"  # the host's trace, continued
    assert (result.structured_content or {}).get("tracestate") == "vendor=x"


def test_the_sdks_check_of_a_calls_params_is_kept_per_name_and_meta_whatever_the_arguments() -> None:
    """The lane asks the SDK's check of a call's params once per name and `_meta` (what the arguments hold cannot
    change its verdict): a call it refused is refused again, and one it passed passes with any arguments."""
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }

    def call(arguments: Any, **meta: Any) -> ExpressCall | None:
        params = {"name": "fx__echo", "arguments": arguments, "_meta": {**envelope, **meta}}
        return express_call(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}, modern=True, connection=None
        )

    for arguments in ({"text": "a"}, {"text": ["b"], "n": HUGE}, {}):
        accepted = call(arguments)
        assert accepted is not None and accepted.arguments == arguments
    for _ in range(2):
        assert call({"text": "a"}, progressToken=[1]) is None  # not a string or an integer: the SDK refuses it
        assert call({"text": "a"}, progressToken=1.5) is None
    assert call({"text": "a"}, progressToken=7) is not None
    assert call({"text": "a"}, progressToken=HUGE) is not None  # not kept (orjson cannot write it), still judged
    # orjson writes null, NaN and the infinities alike: each is still judged on its own, as the SDK judges it.
    for token in (None, math.nan, math.inf, None, -math.inf, math.nan):
        params = {"name": "fx__echo", "arguments": {}, "_meta": {**envelope, "progressToken": token}}
        try:
            methods.validate_client_request("tools/call", "2026-07-28", params)
            sdk_accepts = True
        except ValueError:
            sdk_accepts = False
        assert (call({}, progressToken=token) is not None) == sdk_accepts, token


def test_a_results_shape_is_refused_by_the_wire_exactly_when_the_sdks_check_refuses_it() -> None:
    """The wire checks a result with the SDK's own result surface, without the SDK's dump of it: for every protocol
    version, a result passes exactly when `validate_server_result` passes it."""
    text = {"type": "text", "text": "a"}
    results: list[dict[str, Any]] = [
        {"content": [text]},
        {"content": [text], "isError": True, "structuredContent": {"n": 1}, "_meta": {"k": "v"}},
        {"content": [text], "resultType": "complete"},
        {"content": [{"type": "image", "data": "aGk=", "mimeType": "image/png"}]},
        {"content": text},  # not a list
        {"content": [{"type": "hologram"}]},
        {"content": [{"type": "text"}]},  # no text
        {"content": [text], "isError": "yes"},
        {"content": [text], "structuredContent": [1, 2]},
        {},
    ]
    checks = ResultChecks()
    for version in KNOWN_PROTOCOL_VERSIONS:
        for raw in results:
            try:
                methods.validate_server_result("tools/call", version, raw)
                sdk_passes = True
            except ValidationError:
                sdk_passes = False
            except KeyError:  # no surface at this version: the wire checks the model instead
                continue
            try:
                checks.checked(None, raw, version)
                wire_passes = True
            except ValidationError:
                wire_passes = False
            assert wire_passes == sdk_passes, (version, raw)
    with pytest.raises(ValueError, match="known protocol version"):
        checks.checked(None, results[0], "1999-01-01")


async def test_mcp_param_headers_are_checked_as_the_sdk_checks_them(tmp_path: Path) -> None:
    """A 2026-07-28 call over HTTP whose tool routes an argument by header (`x-mcp-header`): the lane answers only
    when the request's `Mcp-Param-*` headers agree with the body, and leaves the rest to the SDK, which refuses a
    mismatch, and a request that does not accept both media types; every answer is the one the SDK gives."""
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    requests: list[tuple[str, dict[str, Any], dict[str, str]]] = [
        ("fx__routed", {"region": "eu"}, {"Mcp-Param-Region": "eu"}),  # agrees
        ("fx__routed", {"region": "eu"}, {"Mcp-Param-Region": "us"}),  # disagrees
        ("fx__routed", {"region": "eu"}, {}),  # the header is missing
        ("fx__routed", {}, {}),  # neither
        ("fx__echo", {"text": "hi"}, {}),  # a tool that routes nothing
        ("fx__echo", {"text": "hi"}, {"Mcp-Param-Region": "eu"}),  # a header for no argument: ignored
        ("fx__echo", {"text": "hi"}, {"Accept": "application/json"}),  # not both media types: refused
        ("fx__echo", {"text": "hi"}, {"Accept": "*/*"}),  # both, by the wildcard
        ("fx__echo", {"text": "hi"}, {"Accept": "application/json"}),  # refused again (the lane keeps verdicts)
    ]
    answers: dict[bool, list[tuple[int, Any]]] = {}
    counts = {}
    for express in (True, False):
        directory = tmp_path / f"express-{express}"
        config = _config_dir(directory, express=express)
        async with bastion_http(["--config", str(config)], env=bastion_env(directory / "home")) as server:
            async with Host().client(server.mcp_url, mode="auto", answers=False) as client:
                with anyio.fail_after(30):
                    await client.list_tools()  # the first listing waits for the connector's
            answers[express] = []
            async with httpx2.AsyncClient(timeout=30) as http:
                for number, (tool, arguments, extra) in enumerate(requests, start=1):
                    params = {"name": tool, "arguments": arguments, "_meta": envelope}
                    headers = {
                        "Accept": "application/json, text/event-stream",
                        "MCP-Protocol-Version": "2026-07-28",
                        "Mcp-Method": "tools/call",
                        "Mcp-Name": tool,
                        **extra,
                    }
                    body = {"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": params}
                    response = await http.post(server.mcp_url, json=body, headers=headers)
                    answers[express].append((response.status_code, _comparable(_json_of(response))))
            counts[express] = await _express_counts(server.base_url)
    assert answers[True] == answers[False]
    codes = [status for status, _ in answers[True]]
    assert codes[0] == 200 and "result" in answers[True][0][1]
    for refused in (1, 2):
        assert "error" in answers[True][refused][1] or codes[refused] >= 400, answers[True][refused]
    for accepted in (3, 4, 5, 7):
        assert codes[accepted] == 200 and "result" in answers[True][accepted][1]
    assert codes[6] == codes[8] == 406
    assert counts[True]["answered"] == 3  # the calls that send no header and need none, both media types accepted


def _json_of(response: httpx2.Response) -> Any:
    """A JSON response's body, the last message of an event stream, or the text of any other body."""
    content_type = response.headers.get("content-type", "")
    if content_type.startswith("text/event-stream"):
        data = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
        return json.loads(data[-1])
    return response.json() if content_type.startswith("application/json") else response.text
