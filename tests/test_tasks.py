"""MCP tasks (SEP-2663) for calls that wait for approval: a 2026-07-28 host that declares the extension gets
a task handle at once, polls it with `tasks/get` and may withdraw it with `tasks/cancel`; other hosts keep blocking.

The host is the SDK's own client, over streamable HTTP on loopback (and over stdio to a `bastion serve` process),
declaring the extension with a `ClientExtension` that claims the `task` result shape; `tasks/*` go through its
session's `send_request`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict

from bastion.server.tasks import EXTENSION_ID
from tests.approvers import Bastion, live, structured
from tests.processes import bastion_command
from tests.test_api import WAIT
from tests.test_e2e_approvals import decide_from_another_process, one, watching

pytestmark = pytest.mark.anyio


class TaskHandle(types.Result):
    """`CreateTaskResult`: what a call answered with a task returns."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    poll_interval_ms: int | None = None


class TaskState(types.Result):
    """`GetTaskResult`: a task's status and, once completed, the call's result."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskRequestParams(types.RequestParams):
    task_id: str


class GetTask(types.Request[TaskRequestParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskRequestParams
    name_param: ClassVar[str | None] = "taskId"


class CancelTask(types.Request[TaskRequestParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskRequestParams
    name_param: ClassVar[str | None] = "taskId"


async def _unresolved(handle: TaskHandle, context: ClaimContext) -> types.CallToolResult:
    raise AssertionError("these tests drive their tasks by hand (allow_claimed=True)")


class Tasks(ClientExtension):
    """The host side of the extension, as far as these tests need: declare it and accept task handles."""

    identifier = EXTENSION_ID

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=_unresolved)]


@asynccontextmanager
async def host(bastion: Bastion, headers: dict[str, str], *, with_tasks: bool = True) -> AsyncIterator[Client]:
    """A 2026-07-28 host over streamable HTTP, declaring the tasks extension (or not)."""
    async with (
        httpx2.AsyncClient(headers=headers, timeout=WAIT) as http,
        Client(
            streamable_http_client(f"{bastion.url}/mcp", http_client=http),
            mode="2026-07-28",
            cache=None,
            extensions=[Tasks()] if with_tasks else None,
        ) as client,
    ):
        await client.list_tools()
        yield client


async def call_as_task(client: Client, name: str, arguments: dict[str, Any]) -> TaskHandle | types.CallToolResult:
    answer = await client.session.call_tool(name, arguments, allow_claimed=True)
    assert isinstance(answer, TaskHandle | types.CallToolResult), answer
    return answer


async def get_task(client: Client, task_id: str) -> TaskState:
    return await client.session.send_request(GetTask(params=TaskRequestParams(task_id=task_id)), TaskState)


async def decide(bastion: Bastion, invocation_id: str, verdict: Literal["approve", "deny"]) -> None:
    admin = await bastion.token(f"approver-{verdict}", "admin")
    async with httpx2.AsyncClient(base_url=bastion.url, headers=admin, timeout=WAIT) as api:
        response = await api.post(f"/api/approvals/{invocation_id}/{verdict}")
        assert response.status_code == 200, response.text


async def settled(bastion: Bastion, client: Client, task_id: str) -> TaskState:
    """Poll the task, waking on each change of the ledger, until it is no longer working."""
    with anyio.fail_after(WAIT):
        while True:
            cursor = bastion.ledger.changes.cursor
            state = await get_task(client, task_id)
            if state.status != "working":
                return state
            await bastion.ledger.changes.next(cursor)


async def test_a_call_needing_approval_returns_a_task_that_completes_with_the_result_once_approved(
    tmp_path: Any,
) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        async with host(bastion, agent) as client:
            with anyio.fail_after(WAIT):
                handle = await call_as_task(client, "fx__echo", {"text": "hello"})
            assert isinstance(handle, TaskHandle)
            assert handle.status == "working"
            (pending,) = await bastion.ledger.invocations.list(status="pending")
            assert handle.task_id == pending.id
            assert (await get_task(client, handle.task_id)).status == "working"

            await decide(bastion, handle.task_id, "approve")
            done = await settled(bastion, client, handle.task_id)
            # Too late to take back: acknowledged, and the task stays as it ended.
            await client.session.send_request(
                CancelTask(params=TaskRequestParams(task_id=handle.task_id)), types.EmptyResult
            )
            assert (await get_task(client, handle.task_id)).status == "completed"
        assert done.status == "completed"
        assert done.result is not None
        result = types.CallToolResult.model_validate(done.result)
        assert not result.is_error
        assert structured(result) == {"echo": {"text": "hello"}}
        assert [(c.name, c.arguments) for c in bastion.fixture.calls] == [("echo", {"text": "hello"})]


async def test_a_call_sent_again_is_the_same_task_and_one_approval_runs_it_once_for_every_host(tmp_path: Any) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        outcome: list[types.CallToolResult] = []
        async with host(bastion, agent) as client, host(bastion, agent, with_tasks=False) as blocking:
            first = await call_as_task(client, "fx__echo", {"text": "hello"})
            again = await call_as_task(client, "fx__echo", {"text": "hello"})
            assert isinstance(first, TaskHandle)
            assert isinstance(again, TaskHandle)
            assert again.task_id == first.task_id
            async with anyio.create_task_group() as tg:

                async def wait_blocking() -> None:
                    outcome.append(await blocking.call_tool("fx__echo", {"text": "hello"}))

                tg.start_soon(wait_blocking)
                await bastion.wait_until(
                    lambda: _retried(bastion, first.task_id, 2)  # the second task, then the blocking host
                )
                await decide(bastion, first.task_id, "approve")
            done = await settled(bastion, client, first.task_id)
        assert done.status == "completed"
        (result,) = outcome
        assert structured(result) == {"echo": {"text": "hello"}}
        assert [c.name for c in bastion.fixture.calls] == ["echo"]
        assert [i.id for i in await bastion.ledger.invocations.list()] == [first.task_id]


async def _retried(bastion: Bastion, invocation_id: str, times: int) -> bool:
    kinds = [event.kind for event in await bastion.ledger.invocations.events(invocation_id)]
    return kinds.count("retried") >= times


async def test_a_denied_call_s_task_completes_with_the_approval_denied_error_result(tmp_path: Any) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        async with host(bastion, agent) as client:
            handle = await call_as_task(client, "fx__echo", {"text": "hello"})
            assert isinstance(handle, TaskHandle)
            await decide(bastion, handle.task_id, "deny")
            done = await settled(bastion, client, handle.task_id)
        # SEP-2663: a tool result with isError is `completed`; `failed` is for JSON-RPC errors only.
        assert done.status == "completed"
        assert done.result is not None
        result = types.CallToolResult.model_validate(done.result)
        assert result.is_error
        assert structured(result)["error"]["class"] == "approval_denied"
        assert bastion.fixture.calls == []


async def test_another_agent_s_token_cannot_read_or_cancel_the_task(tmp_path: Any) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        other = await bastion.token("other-agent", "agent")
        async with host(bastion, agent) as client:
            handle = await call_as_task(client, "fx__echo", {"text": "hello"})
            assert isinstance(handle, TaskHandle)
        async with host(bastion, other) as intruder:
            with pytest.raises(MCPError) as refused:
                await get_task(intruder, handle.task_id)
            assert refused.value.code == types.INVALID_PARAMS
            with pytest.raises(MCPError) as cancelled:
                await intruder.session.send_request(
                    CancelTask(params=TaskRequestParams(task_id=handle.task_id)), types.EmptyResult
                )
            assert cancelled.value.code == types.INVALID_PARAMS
            with pytest.raises(MCPError) as unknown:
                await get_task(intruder, "no-such-task")
            assert unknown.value.code == types.INVALID_PARAMS
        untouched = await bastion.ledger.invocations.get(handle.task_id)
        assert untouched is not None and untouched.status == "pending"


async def test_cancelling_a_pending_task_withdraws_the_call_and_the_task_says_cancelled(tmp_path: Any) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        async with host(bastion, agent) as client:
            handle = await call_as_task(client, "fx__echo", {"text": "hello"})
            assert isinstance(handle, TaskHandle)
            await client.session.send_request(
                CancelTask(params=TaskRequestParams(task_id=handle.task_id)), types.EmptyResult
            )
            done = await settled(bastion, client, handle.task_id)
        assert done.status == "cancelled"
        withdrawn = await bastion.ledger.invocations.get(handle.task_id)
        assert withdrawn is not None and withdrawn.status == "denied"
        assert bastion.fixture.calls == []


async def test_an_allowed_call_returns_its_plain_result_to_a_host_declaring_tasks(tmp_path: Any) -> None:
    async with live(tmp_path, modes={"fx:echo": "allow"}) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        async with host(bastion, agent) as client:
            answer = await call_as_task(client, "fx__echo", {"text": "hello"})
        assert isinstance(answer, types.CallToolResult)
        assert structured(answer) == {"echo": {"text": "hello"}}


async def test_the_server_declares_the_tasks_extension(tmp_path: Any) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        async with host(bastion, agent) as client:
            discovered = types.DiscoverResult.model_validate(await client.session.send_discover("2026-07-28"))
        assert discovered.capabilities.extensions is not None
        assert EXTENSION_ID in discovered.capabilities.extensions


async def test_a_host_without_the_extension_still_gets_approval_pending(tmp_path: Any) -> None:
    async with live(tmp_path) as bastion:
        bastion.gateway.held.wait_without_progress_seconds = 0
        agent = await bastion.token("ci-agent", "agent")
        async with host(bastion, agent, with_tasks=False) as client:
            with anyio.fail_after(WAIT):
                result = await client.call_tool("fx__echo", {"text": "hello"})
        assert result.is_error
        assert structured(result)["error"]["class"] == "approval_pending"


async def test_a_host_without_the_extension_still_blocks_until_the_decision(tmp_path: Any) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        results: list[types.CallToolResult] = []

        async def blocking_call() -> None:
            async with host(bastion, agent, with_tasks=False) as client:
                results.append(await client.call_tool("fx__echo", {"text": "hello"}))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(blocking_call)
                (pending,) = await bastion.pending(1)
                await decide(bastion, pending.id, "approve")
        (result,) = results
        assert not result.is_error
        assert structured(result) == {"echo": {"text": "hello"}}


async def test_a_task_outlives_the_bastion_process_that_created_it(tmp_path: Any) -> None:
    async with live(tmp_path) as first:
        agent = await first.token("ci-agent", "agent")
        async with host(first, agent) as client:
            handle = await call_as_task(client, "fx__echo", {"text": "hello"})
        assert isinstance(handle, TaskHandle)
    async with live(tmp_path) as second:  # the same ledger, read by a new process
        async with host(second, agent) as client:
            assert (await get_task(client, handle.task_id)).status == "working"
            await decide(second, handle.task_id, "deny")
            done = await settled(second, client, handle.task_id)
        assert done.status == "completed"
        assert done.result is not None
        assert structured(types.CallToolResult.model_validate(done.result))["error"]["class"] == "approval_denied"


async def test_a_2025_11_25_host_is_not_served_tasks(tmp_path: Any) -> None:
    async with live(tmp_path) as bastion:
        bastion.gateway.held.wait_without_progress_seconds = 0
        agent = await bastion.token("ci-agent", "agent")
        async with bastion.client(agent) as client:  # a legacy (handshake) session
            with anyio.fail_after(WAIT):
                result = await client.call_tool("fx__echo", {"text": "hello"})
            assert structured(result)["error"]["class"] == "approval_pending"
            with pytest.raises(MCPError) as refused:
                await get_task(client, structured(result)["error"]["invocation_id"])
            assert refused.value.code == types.METHOD_NOT_FOUND


async def test_a_host_over_stdio_gets_a_task_that_an_approval_from_another_process_completes(
    configured: tuple[Path, Path, dict[str, str]],
) -> None:
    config, notes, env = configured
    argv = bastion_command("serve", "--config", str(config))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    arguments = {"name": "todo", "text": "call mum"}
    async with (
        Client(params, mode="2026-07-28", cache=None, extensions=[Tasks()]) as client,
        watching(config) as ledger,
    ):
        await client.list_tools()
        with anyio.fail_after(WAIT):
            handle = await call_as_task(client, "notes__write_note", arguments)
        assert isinstance(handle, TaskHandle)
        assert handle.task_id == (await one(ledger, "pending")).id
        assert (await get_task(client, handle.task_id)).status == "working"
        code, output = await decide_from_another_process(config, env, "approve", handle.task_id)
        assert code == 0, output
        with anyio.fail_after(WAIT):
            while (done := await get_task(client, handle.task_id)).status == "working":
                with anyio.move_on_after(0.5):  # the ledger's change feed wakes this on the other process's commit
                    await ledger.changes.next(ledger.changes.cursor)
    assert done.status == "completed"
    assert done.result is not None
    assert not types.CallToolResult.model_validate(done.result).is_error
    assert json.loads(notes.read_text())["todo"] == "call mum"
