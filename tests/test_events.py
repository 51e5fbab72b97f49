"""`/api/events`: the ledger's changes as named server-sent events, resumable with Last-Event-ID; each of
the four events shown being sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.cli.remote import RemoteApi
from bastion.models import utcnow
from tests.sse import SseEvent, sse_events
from tests.test_api import WAIT, Live, invocation, live_bastion, seed

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def stream(
    live: Live, headers: dict[str, str], last_event_id: str | None
) -> AsyncIterator[AsyncIterator[SseEvent]]:
    """An open event stream (resumed after `last_event_id` when given)."""
    if last_event_id is not None:
        headers = headers | {"Last-Event-ID": last_event_id}
    async with live.http.stream("GET", "/api/events", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        yield sse_events(response)


async def take(events: AsyncIterator[SseEvent], count: int) -> list[SseEvent]:
    taken: list[SseEvent] = []
    with anyio.fail_after(WAIT):
        async for event in events:
            taken.append(event)
            if len(taken) == count:
                break
    return taken


async def test_a_stream_resumed_with_last_event_id_loses_no_event_and_repeats_none(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        await seed(live.ledger, invocation(1), invocation(2))
        async with stream(live, admin, "0") as events:
            first = await take(events, 1)
        assert [(e.event, e.body["invocation"]["id"]) for e in first] == [("approval_requested", "inv-0001")]

        # While nobody listens: another call waits, one is approved, one denied.
        await seed(live.ledger, invocation(3))
        await live.ledger.invocations.decide("inv-0001", approve=True, principal="alice", note=None, now=utcnow())
        await live.ledger.invocations.decide("inv-0002", approve=False, principal="alice", note="no", now=utcnow())

        async with stream(live, admin, first[-1].id) as events:
            rest = await take(events, 4)
        assert [(e.event, e.body["invocation"]["id"]) for e in rest] == [
            ("approval_requested", "inv-0002"),
            ("approval_requested", "inv-0003"),
            ("approval_decided", "inv-0001"),
            ("approval_decided", "inv-0002"),
        ]
        ids = [int(e.id or 0) for e in first + rest]
        assert ids == sorted(set(ids))
        assert rest[-1].body["invocation"]["status"] == "denied"


async def test_a_finished_call_is_told_as_invocation_finished_and_a_call_of_a_drifted_tool_as_drift_detected(
    tmp_path: Path,
) -> None:
    async with live_bastion(tmp_path, gateway_running=True, modes={"fx:echo": "allow"}) as live:
        admin = await live.token("alice", "admin")
        agent = await live.token("ci-agent", "agent")
        async with stream(live, admin, None) as events, agent_client(live, agent) as client:
            assert not (await client.call_tool("fx__echo", {"text": "before"})).is_error
            (finished,) = await take(events, 1)
            assert (finished.event, finished.body["invocation"]["status"]) == ("invocation_finished", "completed")

            await drift_echo(live)
            async with anyio.create_task_group() as tg:
                held: list[types.CallToolResult] = []

                async def call_drifted() -> None:
                    held.append(await client.call_tool("fx__echo", {"text": "after"}))

                tg.start_soon(call_drifted)
                drifted, requested = await take(events, 2)
                assert (drifted.event, requested.event) == ("drift_detected", "approval_requested")
                invocation = drifted.body["invocation"]
                assert (invocation["mode"], invocation["mode_source"]) == ("require_approval", "drift")
                assert any("keeps a copy" in line for line in invocation["drift"])
                await live.ledger.invocations.decide(
                    invocation["id"], approve=False, principal="alice", note=None, now=utcnow()
                )
            assert held[0].is_error
        ids = [int(e.id or 0) for e in (finished, drifted, requested)]
        assert ids == sorted(set(ids))


async def drift_echo(live: Live) -> None:
    """Change the downstream's `echo` and wait until the gateway has seen it drift from its pin."""
    changed = types.Tool(
        name="echo",
        description="Return the arguments it was given, and keeps a copy.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    )
    seen = anyio.Event()

    async def on_change() -> None:
        if live.gateway.pins.drift("fx", "echo") is not None:
            seen.set()

    live.gateway.on_catalog_changed(on_change)
    await live.fixture.set_tools([changed])
    with anyio.fail_after(WAIT):
        await seen.wait()


@asynccontextmanager
async def agent_client(live: Live, headers: dict[str, str]) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=WAIT) as http,
        Client(streamable_http_client(f"{live.url}/mcp", http_client=http), mode="legacy", cache=None) as client,
    ):
        yield client


async def test_an_agent_token_hears_only_of_its_own_calls(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        agent = await live.token("ci-agent", "agent")
        await seed(live.ledger, invocation(1, principal="someone-else"), invocation(2), invocation(3, principal=None))
        await seed(live.ledger, invocation(4))
        async with stream(live, agent, "0") as events:
            heard = await take(events, 2)
        assert [e.body["invocation"]["id"] for e in heard] == ["inv-0002", "inv-0004"]


async def test_the_event_stream_needs_a_token_and_a_numeric_last_event_id(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        assert (await live.http.get("/api/events")).status_code == 401
        for refused in ("abc", "-1", "1e3", str(2**63), "9" * 40):  # not an id, or beyond the ledger's ids
            response = await live.http.get("/api/events", headers=admin | {"Last-Event-ID": refused})
            assert response.status_code == 422, refused
            assert response.json()["error"]["class"] == "invalid_arguments"
        async with live.http.stream("GET", "/api/events", headers=admin | {"Last-Event-ID": str(2**63 - 1)}) as ok:
            assert ok.status_code == 200  # the largest id an event can have: a stream that resumes after it


async def test_the_remote_watch_is_woken_by_the_event_stream(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        await seed(live.ledger, invocation(1))
        heard: list[str] = []
        async with RemoteApi(live.url, admin["Authorization"].removeprefix("Bearer ")) as api:
            with anyio.fail_after(WAIT):
                async for name in api.events(after=0):
                    heard.append(name)
                    break
        assert heard == ["approval_requested"]
