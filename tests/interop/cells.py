"""One cell of the interop matrix: a host (transport, protocol version) in front of a Bastion (express lane on or
off) in front of one downstream, and what it checks: the catalog, an allowed call against the direct call, a
refusal, a held call approved, and each feature the downstream offers.

A check passes, fails with the reason, or is n/a (the downstream does not offer it). Every cell runs every check,
so one failure does not hide the others; the table shows them all.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import jsonschema
import mcp.client.session
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.session import IncomingMessage
from mcp.client.sse import sse_client
from mcp.client.subscriptions import ResourceUpdated
from mcp_types.version import LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from bastion.ledger import OpenLedger
from bastion.models import Invocation, Principal, utcnow
from bastion.pipeline.authority import decide
from tests.interop.servers import FEATURES, Call, Downstream

HOST_TRANSPORTS: Final = ("stdio", "http", "sse")
HOST_VERSIONS: Final = ("2025-06-18", "2025-11-25", "2026-07-28")
CHECKS: Final = ("list", "call", "refusal", "held", *FEATURES)
WAIT: Final = 30.0
"""The bound on every wait of a check."""
APPROVER: Final = Principal(name="interop-approver", role="admin")
ERROR_META_KEY: Final = "io.bastion/error"


@dataclass
class Expected:
    """What the direct call of a downstream gave, to compare each cell with."""

    tools: set[str]
    output_schemas: dict[str, dict[str, Any] | None]
    answer: dict[str, Any]


@dataclass
class CellResult:
    downstream: str
    transport: str
    version: str
    express: bool
    checks: dict[str, str] = field(default_factory=dict)
    """Each check: `pass`, `n/a`, or `FAIL: why`."""

    @property
    def failures(self) -> dict[str, str]:
        return {name: outcome for name, outcome in self.checks.items() if outcome.startswith("FAIL")}


class CheckFailed(AssertionError):
    """A check that did not hold; the message says what came instead."""


def expect(condition: bool, why: str) -> None:
    if not condition:
        raise CheckFailed(why)


class Ear:
    """What a host heard besides results: log messages, progress, resource updates, questions it answered."""

    def __init__(self) -> None:
        self.logs: list[str] = []
        self.progress: list[float] = []
        self.updated: list[str] = []
        self.sampled: list[str] = []
        self.elicited: list[str] = []
        self._news = anyio.Event()

    def _heard(self) -> None:
        self._news.set()
        self._news = anyio.Event()

    async def until(self, predicate: Callable[[], bool], what: str) -> None:
        try:
            with anyio.fail_after(WAIT):
                while not predicate():
                    await self._news.wait()
        except TimeoutError:
            raise CheckFailed(f"no {what} within {WAIT:g} s") from None

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(f"{params.level}: {params.data}")
        self._heard()

    async def message(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updated.append(message.params.uri)
            self._heard()

    async def heard_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append(progress)
        self._heard()

    async def sample(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        first = params.messages[0].content
        self.sampled.append(first.text if isinstance(first, types.TextContent) else str(first))
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="a sampled haiku"), model="interop-model"
        )

    async def elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.elicited.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada"})


@dataclass(frozen=True)
class Bastions:
    """Where a cell's host finds Bastion: the command that serves it over stdio, and the HTTP one already running."""

    stdio_argv: Sequence[str]
    env: dict[str, str]
    base_url: str
    ledger: OpenLedger


@asynccontextmanager
async def host(
    bastions: Bastions, transport: str, version: str, ear: Ear, *, answers: bool = False
) -> AsyncIterator[Client]:
    """An SDK client speaking `version` over `transport`; `answers`: it declares sampling and elicitation (at
    2026-07-28 the express lane leaves such hosts to the SDK's server, so the other checks use a host without)."""
    target: Any
    if transport == "stdio":
        argv = list(bastions.stdio_argv)
        target = StdioServerParameters(command=argv[0], args=argv[1:], env=bastions.env)
    elif transport == "http":
        target = f"{bastions.base_url}/mcp"
    else:
        target = sse_client(f"{bastions.base_url}/sse")
    modern = version in MODERN_PROTOCOL_VERSIONS
    client = Client(
        target,
        mode=version if modern else "legacy",
        cache=None,
        logging_callback=ear.log,
        message_handler=ear.message,
        sampling_callback=ear.sample if answers else None,
        elicitation_callback=ear.elicit if answers else None,
        log_level="debug" if modern else None,
    )
    async with _handshake(version), client:
        expect(client.protocol_version == version, f"negotiated {client.protocol_version}, not {version}")
        if not modern:
            await client.session.send_request(
                types.SetLevelRequest(params=types.SetLevelRequestParams(level="debug")), types.EmptyResult
            )
        yield client


@asynccontextmanager
async def _handshake(version: str) -> AsyncIterator[None]:
    """The SDK's client offers its newest handshake version in `initialize`; a host that speaks an older one (as many
    shipping hosts do) is this client offering that one instead (cells run one at a time)."""
    if version in MODERN_PROTOCOL_VERSIONS or version == LATEST_HANDSHAKE_VERSION:
        yield
        return
    mcp.client.session.LATEST_HANDSHAKE_VERSION = version  # type: ignore[attr-defined]
    try:
        yield
    finally:
        mcp.client.session.LATEST_HANDSHAKE_VERSION = LATEST_HANDSHAKE_VERSION  # type: ignore[attr-defined]


def resolved(call: Call, folder: Path, cell: str) -> tuple[str, dict[str, Any]]:
    """The call's tool and its arguments with `{folder}` and `{cell}` filled in."""

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{folder}", str(folder)).replace("{cell}", cell)
        if isinstance(value, list):
            return [fill(item) for item in value]
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        return value

    return call.tool, fill(call.arguments)


def answer_of(result: types.CallToolResult) -> dict[str, Any]:
    """What a host reads of a result: content and structured content (`_meta` aside)."""
    return result.model_dump(by_alias=True, mode="json", exclude_none=True, include={"content", "structured_content"})


def text_of(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


@dataclass
class Cell:
    """The checks of one cell, over one connected host (and, for sampling and elicitation, a second that answers)."""

    downstream: Downstream
    expected: Expected
    bastions: Bastions
    transport: str
    version: str
    folder: Path
    name: str
    """Unique per cell: what the cell's calls create is named after it."""

    def tool(self, action: str) -> str:
        return f"{self.downstream.id}__{action}"

    async def run(self, express: bool) -> CellResult:
        result = CellResult(self.downstream.id, self.transport, self.version, express)
        offered = self.downstream.offers.offered()
        ear = Ear()
        try:
            with anyio.fail_after(WAIT * 20):
                await self._checks(result, offered, ear)
        except Exception as exc:  # noqa: BLE001 - the host could not connect: each check not yet run fails, saying why
            for name in CHECKS:
                result.checks.setdefault(name, f"FAIL: {_said(exc)}")
        return result

    async def _checks(self, result: CellResult, offered: set[str], ear: Ear) -> None:
        async with host(self.bastions, self.transport, self.version, ear) as client:
            checks: dict[str, Callable[[], Awaitable[None]]] = {
                "list": lambda: self.listed(client),
                "call": lambda: self.allowed(client),
                "refusal": lambda: self.refusal(client),
                "held": lambda: self.held(client),
                "resources": lambda: self.resources(client),
                "subscribe": lambda: self.subscribe(client, ear),
                "prompts": lambda: self.prompts(client),
                "progress": lambda: self.progress(client, ear),
                "logging": lambda: self.logging(client, ear),
                "cancellation": lambda: self.cancellation(client, ear),
            }
            for name, check in checks.items():
                if name in FEATURES and name not in offered:
                    result.checks[name] = "n/a"
                    continue
                result.checks[name] = await _outcome(check)
        result.checks["list_changed"] = "n/a"  # none of these servers changes its tools while it runs
        if offered & {"sampling", "elicitation"}:
            answering = Ear()
            async with host(self.bastions, self.transport, self.version, answering, answers=True) as client:
                result.checks["sampling"] = await _outcome(lambda: self.sampling(client, answering))
                result.checks["elicitation"] = await _outcome(lambda: self.elicitation(client, answering))
        else:
            result.checks["sampling"] = result.checks["elicitation"] = "n/a"

    async def listed(self, client: Client) -> None:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        ours = {name for name in tools if name.startswith(f"{self.downstream.id}__")}
        wanted = {self.tool(name) for name in self.expected.tools}
        expect(ours == wanted, f"listed {sorted(ours ^ wanted)} differently from the server's own list")

    async def allowed(self, client: Client) -> None:
        name, arguments = resolved(self.downstream.allowed, self.folder, self.name)
        result = await client.call_tool(self.tool(name), arguments)
        expect(not result.is_error, f"the allowed call failed: {text_of(result)[:300]}")
        got = answer_of(result)
        expect(got == self.expected.answer, f"the result differs from the direct call's: {json.dumps(got)[:300]}")

    async def refusal(self, client: Client) -> None:
        name, arguments = resolved(self.downstream.refused, self.folder, self.name)
        result = await client.call_tool(self.tool(name), arguments)
        expect(result.is_error, "the denied call was not refused")
        error = (result.meta or {}).get(ERROR_META_KEY)
        expect(isinstance(error, dict) and error.get("class") == "policy_denied", f"refused as {error}")
        expect(text_of(result).startswith("policy_denied: "), f"the refusal reads {text_of(result)[:200]!r}")
        schema = self.expected.output_schemas.get(name)
        if schema is not None and result.structured_content is not None:
            jsonschema.validate(result.structured_content, schema)

    async def held(self, client: Client) -> None:
        name, arguments = resolved(self.downstream.held, self.folder, self.name)
        answered: list[types.CallToolResult] = []

        async def call() -> None:
            answered.append(await client.call_tool(self.tool(name), arguments, progress_callback=_ignore))

        ledger = self.bastions.ledger
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                pending = await _pending(ledger, f"{self.downstream.id}:{name}")
                await decide(ledger, pending.id, approve=True, principal=APPROVER, note="interop matrix", now=utcnow())
        (result,) = answered
        expect(not result.is_error, f"the approved call failed: {text_of(result)[:300]}")
        ran = await ledger.invocations.get(pending.id)
        expect(ran is not None and ran.status == "completed", f"the approved call is {ran and ran.status}")

    async def resources(self, client: Client) -> None:
        uri = self.downstream.offers.resource
        assert uri is not None
        contents = (await client.read_resource(uri)).contents
        expect(bool(contents) and contents[0].uri == uri, f"read {contents!r:.200}")

    async def subscribe(self, client: Client, ear: Ear) -> None:
        subscription = self.downstream.offers.subscription
        assert subscription is not None
        uri, trigger = subscription
        if self.version in MODERN_PROTOCOL_VERSIONS:
            async with client.listen(resource_subscriptions=[uri]) as events:
                await self._trigger(client, trigger)
                with anyio.fail_after(WAIT):
                    async for event in events:
                        if event == ResourceUpdated(uri):
                            break
            return
        await client.session.send_request(
            types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)), types.EmptyResult
        )
        await self._trigger(client, trigger)
        await ear.until(lambda: uri in ear.updated, f"notifications/resources/updated for {uri}")

    async def prompts(self, client: Client) -> None:
        prompt = self.downstream.offers.prompt
        assert prompt is not None
        name, arguments = prompt
        got = await client.get_prompt(self.tool(name), arguments)
        said = json.dumps(got.model_dump(mode="json"), ensure_ascii=False)
        expect(all(value in said for value in arguments.values()), f"the prompt lacks its arguments: {said[:200]}")

    async def progress(self, client: Client, ear: Ear) -> None:
        call = self.downstream.offers.progress
        assert call is not None
        name, arguments = resolved(call, self.folder, self.name)
        before = len(ear.progress)
        result = await client.call_tool(self.tool(name), arguments, progress_callback=ear.heard_progress)
        expect(not result.is_error, f"failed: {text_of(result)[:200]}")
        heard = ear.progress[before:]
        expect(len(heard) >= 3 and heard == sorted(heard), f"progress heard: {heard}")

    async def logging(self, client: Client, ear: Ear) -> None:
        call = self.downstream.offers.logging
        assert call is not None
        before = len(ear.logs)
        await self._trigger(client, call)
        await ear.until(lambda: len(ear.logs) > before, "log message")
        await self._toggle_off(client, call)

    async def cancellation(self, client: Client, ear: Ear) -> None:
        """The host gives up on a long call: the downstream is told, the ledger does not say `completed`, and the
        host's next call works."""
        call = self.downstream.offers.cancellation
        assert call is not None
        name, arguments = resolved(call, self.folder, self.name)
        before = len(ear.progress)
        with anyio.fail_after(WAIT), anyio.CancelScope() as scope:

            async def cancel_once_running(progress: float, total: float | None, message: str | None) -> None:
                await ear.heard_progress(progress, total, message)
                scope.cancel()

            await client.call_tool(self.tool(name), arguments, progress_callback=cancel_once_running)
        expect(scope.cancelled_caught and len(ear.progress) > before, "the call was not cancelled while it ran")
        ledger = self.bastions.ledger
        key = f"{self.downstream.id}:{name}"
        ended = await _ended(ledger, key)
        expect(ended.status == "unknown", f"the cancelled call is recorded {ended.status}")
        await self.allowed(client)

    async def sampling(self, client: Client, ear: Ear) -> None:
        call = self.downstream.offers.sampling
        assert call is not None
        name, arguments = resolved(call, self.folder, self.name)
        result = await client.call_tool(self.tool(name), arguments)
        expect(not result.is_error, f"failed: {text_of(result)[:200]}")
        expect(bool(ear.sampled) and "a sampled haiku" in text_of(result), f"sampled {ear.sampled}: {text_of(result)}")

    async def elicitation(self, client: Client, ear: Ear) -> None:
        call = self.downstream.offers.elicitation
        assert call is not None
        name, arguments = resolved(call, self.folder, self.name)
        result = await client.call_tool(self.tool(name), arguments)
        expect(not result.is_error, f"failed: {text_of(result)[:200]}")
        expect(bool(ear.elicited) and "Ada" in text_of(result), f"elicited {ear.elicited}: {text_of(result)[:200]}")

    async def _trigger(self, client: Client, call: Call) -> None:
        """Make the call; a toggle that says it switched its behaviour off is made again, to switch it on."""
        name, arguments = resolved(call, self.folder, self.name)
        result = await client.call_tool(self.tool(name), arguments)
        expect(not result.is_error, f"{name} failed: {text_of(result)[:200]}")
        if name in self.downstream.offers.toggles and text_of(result).startswith("Stopped"):
            await self._trigger(client, call)

    async def _toggle_off(self, client: Client, call: Call) -> None:
        if call.tool in self.downstream.offers.toggles:
            result = await client.call_tool(self.tool(call.tool), call.arguments)
            expect(text_of(result).startswith("Stopped"), f"{call.tool} did not stop: {text_of(result)[:200]}")


async def _outcome(check: Callable[[], Awaitable[None]]) -> str:
    try:
        with anyio.fail_after(WAIT * 2):
            await check()
    except Exception as exc:  # noqa: BLE001 - a check fails however it fails, and the table says how
        return f"FAIL: {_said(exc)}"
    return "pass"


def _said(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _said(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"[:400]


async def _ignore(progress: float, total: float | None, message: str | None) -> None:
    return None


async def _pending(ledger: OpenLedger, key: str) -> Invocation:
    """The invocation of `key` pending in the ledger, once it is (waiting on the ledger's change feed)."""
    while True:
        cursor = ledger.changes.cursor
        found = [i for i in await ledger.invocations.list(status="pending") if i.policy_key == key]
        if found:
            return found[0]
        await ledger.changes.next(cursor)


async def _ended(ledger: OpenLedger, key: str) -> Invocation:
    """The newest invocation of `key`, once it is no longer running."""
    with anyio.fail_after(WAIT):
        while True:
            cursor = ledger.changes.cursor
            found = [i for i in await ledger.invocations.list(limit=50) if i.policy_key == key]
            newest = max(found, key=lambda i: i.created_at) if found else None
            if newest is not None and newest.status not in ("planned", "approved", "executing"):
                return newest
            await ledger.changes.next(cursor)
