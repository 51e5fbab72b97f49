"""A host that sends a held call again gets the first call, never a second one: driven through a real SDK client
against an in-process Bastion, in both protocol eras (`legacy`: 2025-11-25 over JSON-RPC streams; `auto`:
2026-07-28), counting what reaches the downstream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from bastion.config import ApprovalSettings, Config, ConnectorConfig, PolicyConfig, Settings
from bastion.ledger import OpenLedger, Redactor
from bastion.models import Invocation, utcnow
from bastion.pipeline.gateway import Gateway
from bastion.server.mcp import HostServer
from bastion.sources.mcp import McpConnector
from tests.downstream import FixtureServer
from tests.harness import Harness, harness
from tests.ledger_contract.backends import BACKENDS, Backend
from tests.test_approvals import kinds, wait_pending
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

FAST = ApprovalSettings(heartbeat_seconds=0.05, expiry_seconds=300)
ERAS = pytest.mark.parametrize("mode", ["legacy", "auto"])


def text_of(result: types.CallToolResult) -> str:
    assert not result.is_error, result.content
    (content,) = result.content
    assert isinstance(content, types.TextContent)
    return content.text


async def retried(ledger: OpenLedger, invocation_id: str, times: int = 1) -> None:
    """Wait (bounded) until `times` retries were attached to the invocation."""
    with anyio.fail_after(10):
        while [e.kind for e in await ledger.invocations.events(invocation_id)].count("retried") < times:
            with anyio.move_on_after(0.1):
                await ledger.changes.next(ledger.changes.cursor)


async def reaches(ledger: OpenLedger, invocation_id: str, status: str) -> Invocation:
    with anyio.fail_after(10):
        while (found := await ledger.invocations.get(invocation_id)) is None or found.status != status:
            with anyio.move_on_after(0.1):
                await ledger.changes.next(ledger.changes.cursor)
    return found


async def wait_pending_in(ledger: OpenLedger) -> list[Invocation]:
    with anyio.fail_after(10):
        while not (found := await ledger.invocations.list(status="pending")):
            with anyio.move_on_after(0.1):
                await ledger.changes.next(ledger.changes.cursor)
    return found


async def approve(ledger: OpenLedger, invocation_id: str) -> None:
    await ledger.invocations.decide(invocation_id, approve=True, principal="alice", note=None, now=utcnow())


async def give_up_on_a_held_call(h: Harness, name: str, arguments: dict[str, Any]) -> Invocation:
    """Send a call, and cancel the request once it is held (as a host whose request timed out): its invocation."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.call, name, arguments)
        (pending,) = await wait_pending(h)
        tg.cancel_scope.cancel()
    return pending


@ERAS
async def test_a_call_sent_again_after_the_host_gave_up_waits_for_the_first_and_the_tool_runs_once(
    tmp_path: Path, mode: str
) -> None:
    async with harness(tmp_path, approvals=FAST, mode=mode) as h:
        first = await give_up_on_a_held_call(h, "fx__progress", {"n": 1})
        outcome: list[types.CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def send_again() -> None:
                outcome.append(await h.call("fx__progress", {"n": 1}))

            tg.start_soon(send_again)
            await retried(h.ledger, first.id)
            assert h.fixture.calls == []
            await approve(h.ledger, first.id)
        assert text_of(outcome[0]) == "done"
        assert [(c.name, c.arguments) for c in h.fixture.calls] == [("progress", {"n": 1})]
        assert [i.id for i in await h.ledger.invocations.list()] == [first.id]
        assert await kinds(h, first.id) == ["planned", "pending", "retried", "approved", "executing", "completed"]
        assert (await h.ledger.audit.verify()).broken is None


@ERAS
async def test_two_hosts_waiting_on_one_call_both_get_its_one_result(tmp_path: Path, mode: str) -> None:
    async with harness(tmp_path, approvals=FAST, mode=mode) as h:
        outcome: list[types.CallToolResult] = []

        async def send() -> None:
            outcome.append(await h.call("fx__progress", {"n": 1}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            (first,) = await wait_pending(h)
            tg.start_soon(send)
            await retried(h.ledger, first.id)
            await approve(h.ledger, first.id)
        assert [text_of(result) for result in outcome] == ["done", "done"]
        assert len(h.fixture.calls) == 1


@ERAS
async def test_a_call_sent_again_after_its_denial_gets_the_denial(tmp_path: Path, mode: str) -> None:
    async with harness(tmp_path, approvals=FAST, mode=mode) as h:
        first = await give_up_on_a_held_call(h, "fx__progress", {"n": 1})
        await h.ledger.invocations.decide(first.id, approve=False, principal="bob", note="not today", now=utcnow())
        error = error_of(await h.call("fx__progress", {"n": 1}))
        assert (error["class"], error["invocation_id"]) == ("approval_denied", first.id)
        assert "not today" in error["message"]
        assert h.fixture.calls == []
        assert await kinds(h, first.id) == ["planned", "pending", "denied", "retried"]


@ERAS
async def test_a_call_sent_again_after_it_ran_gets_the_recorded_result_without_running_again(
    tmp_path: Path, mode: str
) -> None:
    async with harness(tmp_path, approvals=FAST, mode=mode) as h:
        first = await give_up_on_a_held_call(h, "fx__progress", {"n": 1})
        await approve(h.ledger, first.id)
        await reaches(h.ledger, first.id, "completed")
        assert text_of(await h.call("fx__progress", {"n": 1})) == "done"
        assert len(h.fixture.calls) == 1
        assert (await kinds(h, first.id))[-2:] == ["completed", "retried"]


async def test_a_call_sent_again_while_the_approved_call_runs_waits_for_its_outcome(tmp_path: Path) -> None:
    async with harness(tmp_path, approvals=FAST, mode="legacy") as h:
        first = await give_up_on_a_held_call(h, "fx__sleep", {})
        await approve(h.ledger, first.id)
        with anyio.fail_after(10):
            await h.fixture.sleep_started.wait()
        outcome: list[types.CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def send_again() -> None:
                outcome.append(await h.call("fx__sleep", {}))

            tg.start_soon(send_again)
            await retried(h.ledger, first.id)
            h.fixture.release.set()
        assert text_of(outcome[0]) == "released"
        assert len(h.fixture.calls) == 1


@ERAS
async def test_an_allowed_call_sent_twice_runs_twice(tmp_path: Path, mode: str) -> None:
    async with harness(tmp_path, mode=mode) as h:
        for _ in range(2):
            assert text_of(await h.call("fx__echo", {"text": "hi"})) == "hi"
        assert len(h.fixture.calls) == 2
        invocations = await h.ledger.invocations.list()
        assert [i.status for i in invocations] == ["completed", "completed"]
        for invocation in invocations:
            assert "retried" not in await kinds(h, invocation.id)


@ERAS
async def test_a_call_with_other_arguments_is_a_new_invocation(tmp_path: Path, mode: str) -> None:
    async with harness(tmp_path, approvals=FAST, mode=mode) as h, anyio.create_task_group() as tg:
        tg.start_soon(h.call, "fx__progress", {"n": 1})
        await wait_pending(h)
        tg.start_soon(h.call, "fx__progress", {"n": 2})
        first, second = await wait_pending(h, 2)
        assert first.id != second.id
        for invocation in (first, second):
            assert await kinds(h, invocation.id) == ["planned", "pending"]
            await h.ledger.invocations.decide(invocation.id, approve=False, principal="bob", note=None, now=utcnow())


async def test_once_the_window_after_its_decision_passed_the_same_call_is_held_anew(tmp_path: Path) -> None:
    closed = ApprovalSettings(heartbeat_seconds=0.05, retry_window_seconds=0)
    async with harness(tmp_path, approvals=closed) as h:
        first = await give_up_on_a_held_call(h, "fx__progress", {"n": 1})
        await h.ledger.invocations.decide(first.id, approve=False, principal="bob", note=None, now=utcnow())
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.call, "fx__progress", {"n": 1})
            (again,) = await wait_pending(h)
            assert again.id != first.id
            await h.ledger.invocations.decide(again.id, approve=False, principal="bob", note=None, now=utcnow())
        assert "retried" not in await kinds(h, first.id)


@asynccontextmanager
async def instance(ledger: OpenLedger, fixture: FixtureServer) -> AsyncIterator[Client]:
    """A Bastion instance on `ledger` (its own gateway and host server) with a 2025-era host connected to it as the
    agent `agent-7` (a caller without a token is only itself within its own session)."""
    config = Config(
        directory=None,
        settings=Settings(approvals=FAST),
        connectors=[ConnectorConfig(id="fx", command="unused")],
        policy=PolicyConfig(),
        ledger_url=ledger.url,
    )
    gateway = Gateway(config, ledger, [McpConnector(config.connectors[0], target=lambda: fixture.server)])
    async with (
        gateway.running(),
        Client(HostServer(gateway, principal="agent-7").server, cache=None, mode="legacy") as client,
    ):
        yield client


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda backend: backend.name)
async def test_the_same_call_sent_at_once_to_two_instances_is_one_invocation_run_once(
    tmp_path: Path, backend: Backend
) -> None:
    """Two Bastion instances share a ledger; one agent sends the same held call to each at the same moment: one is
    recorded, the other attaches to it, and one approval runs the tool once for both."""
    fixture = FixtureServer()
    async with AsyncExitStack() as stack:
        ledger = await stack.enter_async_context(await backend.open_fresh(tmp_path, Redactor()))
        other = await stack.enter_async_context(await backend.open_another(ledger, Redactor()))
        clients = [await stack.enter_async_context(instance(opened, fixture)) for opened in (ledger, other)]
        outcome: list[types.CallToolResult] = []

        async def send(client: Client) -> None:
            outcome.append(await client.call_tool("fx__progress", {"n": 1}))

        async with anyio.create_task_group() as tg:
            for client in clients:
                tg.start_soon(send, client)
            (only,) = await wait_pending_in(ledger)
            await retried(ledger, only.id)
            assert [e.kind for e in await ledger.invocations.events(only.id)] == ["planned", "pending", "retried"]
            await approve(other, only.id)
        assert [text_of(result) for result in outcome] == ["done", "done"]
        assert len(fixture.calls) == 1
        assert [i.id for i in await ledger.invocations.list()] == [only.id]
        assert (await ledger.audit.verify()).broken is None
