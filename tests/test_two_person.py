"""Two-person approval, end to end: a host's call that policy marks `approvers = 2` waits for two distinct approvers
(never its caller), each deciding through the REST API with their own token. The first approval is recorded and
announced ("1 of 2"), the call stays pending; the second runs it, once. The same approver twice is refused, a
deny from either ends it, its expiry is not extended, standing grants are refused, and `bastion audit verify`
finds both signed approvals."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest

from bastion.config import ApprovalSettings, Settings
from bastion.errors import ChangesLost
from bastion.ledger.anchors import trusted_keys
from bastion.ledger.verify import verify_signed
from bastion.models import Invocation
from tests.approvers import Bastion, live, structured
from tests.sse import SseEvent, sse_events
from tests.test_api import WAIT

pytestmark = pytest.mark.anyio

TWO = {"fx:echo": 2}


@asynccontextmanager
async def two_person(tmp_path: Path, *, expiry_seconds: float = 300) -> AsyncIterator[Bastion]:
    settings = Settings(approvals=ApprovalSettings(expiry_seconds=expiry_seconds))
    async with live(tmp_path, approvers=TWO, settings=settings) as bastion:
        yield bastion


async def _pending(bastion: Bastion) -> Invocation:
    """The one call waiting for approvers, once it waits (re-read on every change of the ledger)."""
    while True:
        cursor = bastion.ledger.changes.cursor
        found = await bastion.ledger.invocations.list(status="pending")
        if found:
            return found[0]
        with contextlib.suppress(ChangesLost):
            await bastion.ledger.changes.next(cursor)


async def _call(bastion: Bastion, agent: dict[str, str], results: list[types.CallToolResult]) -> None:
    async with bastion.client(agent) as client:
        results.append(await client.call_tool("fx__echo", {"text": "hello"}))


async def _decide(bastion: Bastion, who: dict[str, str], invocation: Invocation, verb: str) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=bastion.url, timeout=WAIT) as http:
        return await http.post(f"/api/approvals/{invocation.id}/{verb}", json={}, headers=who)


@asynccontextmanager
async def _events(bastion: Bastion, who: dict[str, str]) -> AsyncIterator[AsyncIterator[SseEvent]]:
    async with (
        httpx2.AsyncClient(base_url=bastion.url, timeout=WAIT) as http,
        http.stream("GET", "/api/events", headers=who) as response,
    ):
        assert response.status_code == 200
        yield sse_events(response)


async def _next_named(events: AsyncIterator[SseEvent], name: str) -> dict[str, Any]:
    async for event in events:
        if event.event == name:
            body: dict[str, Any] = event.body
            return body
    raise AssertionError(f"the stream ended before {name}")


async def test_two_distinct_approvers_run_the_call_once_after_a_first_approval_is_announced(tmp_path: Path) -> None:
    async with two_person(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        alice = await bastion.token("alice", "admin")
        bob = await bastion.token("bob", "admin")
        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg, _events(bastion, alice) as events:
                tg.start_soon(_call, bastion, agent, results)
                waiting = await _pending(bastion)
                requested = await _next_named(events, "approval_requested")
                assert requested["approvals"] == {"required": 2, "by": [], "summary": "0 of 2 approvals"}

                first = await _decide(bastion, alice, waiting, "approve")
                assert first.status_code == 200, first.text
                assert first.json()["status"] == "pending"
                assert first.json()["approvals"]["summary"] == "1 of 2 approvals, by alice"
                recorded = await _next_named(events, "approval_recorded")
                assert recorded["invocation"]["id"] == waiting.id
                assert recorded["approvals"]["summary"] == "1 of 2 approvals, by alice"
                assert bastion.fixture.calls == []

                listed = await _listed(bastion, bob)
                assert listed[0]["approvals"]["by"] == ["alice"]
                assert listed[0]["scopes"] == ["once"]

                second = await _decide(bastion, bob, waiting, "approve")
                assert second.status_code == 200, second.text
                decided = await _next_named(events, "approval_decided")
                assert decided["invocation"]["status"] == "approved"
        (result,) = results
        assert not result.is_error, result.content
        assert [call.name for call in bastion.fixture.calls] == ["echo"]
        events_of = await bastion.ledger.invocations.events(waiting.id)
        kinds = [e.kind for e in events_of]
        assert kinds == ["planned", "pending", "approval_recorded", "approved", "executing", "completed"]
        assert [events_of[2].detail["by"], events_of[3].detail["by"]] == ["alice", "bob"]
        report = await verify_signed(bastion.ledger.audit, [], trusted_keys(bastion.ledger.key_path, []))
        assert report.broken is None
        assert report.decisions == 1


async def _listed(bastion: Bastion, who: dict[str, str]) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=bastion.url, timeout=WAIT) as http:
        answer = await http.get("/api/approvals", headers=who)
    assert answer.status_code == 200
    found: list[dict[str, Any]] = answer.json()["approvals"]
    return found


async def test_the_same_approver_twice_and_the_caller_are_refused(tmp_path: Path) -> None:
    async with two_person(tmp_path) as bastion:
        alice = await bastion.token("alice", "admin")
        bob = await bastion.token("bob", "admin")
        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call, bastion, bob, results)  # bob's own call: bob is its caller
                waiting = await _pending(bastion)
                assert (await _decide(bastion, alice, waiting, "approve")).status_code == 200
                again = await _decide(bastion, alice, waiting, "approve")
                assert again.status_code == 403
                assert again.json()["error"]["class"] == "forbidden"
                own = await _decide(bastion, bob, waiting, "approve")
                assert own.status_code == 403
                assert own.json()["error"]["class"] == "forbidden"
                assert (await bastion.ledger.invocations.get(waiting.id)) == await _still_pending(bastion, waiting)
                carol = await bastion.token("carol", "admin")
                assert (await _decide(bastion, carol, waiting, "approve")).status_code == 200
        (result,) = results
        assert not result.is_error
        assert len(bastion.fixture.calls) == 1


async def _still_pending(bastion: Bastion, invocation: Invocation) -> Invocation | None:
    found = await bastion.ledger.invocations.get(invocation.id)
    assert found is not None and found.status == "pending"
    return found


async def test_a_deny_after_the_first_approval_ends_the_call(tmp_path: Path) -> None:
    async with two_person(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        alice = await bastion.token("alice", "admin")
        bob = await bastion.token("bob", "admin")
        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call, bastion, agent, results)
                waiting = await _pending(bastion)
                assert (await _decide(bastion, alice, waiting, "approve")).status_code == 200
                assert (await _decide(bastion, bob, waiting, "deny")).json()["status"] == "denied"
                late = await _decide(bastion, bob, waiting, "approve")
                assert late.status_code == 409
        (result,) = results
        assert structured(result)["error"]["class"] == "approval_denied"
        assert bastion.fixture.calls == []


async def test_the_first_approval_does_not_extend_the_expiry(tmp_path: Path) -> None:
    async with two_person(tmp_path, expiry_seconds=2) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        alice = await bastion.token("alice", "admin")
        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call, bastion, agent, results)
                waiting = await _pending(bastion)
                assert (await _decide(bastion, alice, waiting, "approve")).status_code == 200
                recorded = await bastion.ledger.invocations.get(waiting.id)
                assert recorded is not None and recorded.expires_at == waiting.expires_at
        (result,) = results  # the call returned once the sweeper expired it
        assert structured(result)["error"]["class"] == "approval_expired"
        expired = await bastion.ledger.invocations.get(waiting.id)
        assert expired is not None and expired.status == "expired"
        assert bastion.fixture.calls == []


async def test_a_two_person_call_takes_no_standing_grant(tmp_path: Path) -> None:
    async with two_person(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        alice = await bastion.token("alice", "admin")
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call, bastion, agent, [])
                waiting = await _pending(bastion)
                async with httpx2.AsyncClient(base_url=bastion.url, timeout=WAIT) as http:
                    refused = await http.post(
                        f"/api/approvals/{waiting.id}/approve", json={"scope": "always"}, headers=alice
                    )
                assert refused.status_code == 422
                assert "2 distinct approvers" in refused.json()["error"]["message"]
                await _still_pending(bastion, waiting)
                tg.cancel_scope.cancel()
