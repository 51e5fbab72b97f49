"""/metrics: scraped over real HTTP and read back with the Prometheus client library's own parser."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from prometheus_client.parser import text_string_to_metric_families

from bastion.models import utcnow
from tests.test_api import WAIT, live_bastion

pytestmark = pytest.mark.anyio


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape, by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_a_scrape_counts_calls_by_source_mode_and_status_and_shows_sources_and_pending(tmp_path: Path) -> None:
    async with live_bastion(tmp_path, gateway_running=True, modes={"fx:echo": "allow"}) as live:
        with anyio.fail_after(WAIT):
            async with (
                httpx2.AsyncClient(timeout=WAIT) as http,
                Client(streamable_http_client(f"{live.url}/mcp", http_client=http), mode="legacy", cache=None) as c,
            ):
                for text in ("first-argument-7f3", "second-argument-7f3"):
                    assert not (await c.call_tool("fx__echo", {"text": text})).is_error
            scrape = await live.http.get("/metrics")  # open, like /healthz: no token

        assert scrape.status_code == 200
        assert scrape.headers["content-type"].startswith("text/plain")
        found = samples(scrape.text)
        calls = frozenset({("source", "fx"), ("mode", "allow"), ("status", "completed")})
        assert found[("bastion_calls_total", calls)] == 2
        assert found[("bastion_source_up", frozenset({("source", "fx"), ("state", "ready")}))] == 1
        assert found[("bastion_pending_calls", frozenset())] == 0
        assert "argument-7f3" not in scrape.text  # counts only, never arguments


async def test_the_ledgers_commit_times_are_observed_by_backend_as_calls_are_recorded(tmp_path: Path) -> None:
    commits = ("bastion_ledger_commit_seconds_count", frozenset({("backend", "sqlite")}))
    async with live_bastion(tmp_path, gateway_running=True, modes={"fx:echo": "allow"}) as live:
        with anyio.fail_after(WAIT):
            first = samples((await live.http.get("/metrics")).text)
            async with (
                httpx2.AsyncClient(timeout=WAIT) as http,
                Client(streamable_http_client(f"{live.url}/mcp", http_client=http), mode="legacy", cache=None) as c,
            ):
                for text in ("one", "two"):
                    assert not (await c.call_tool("fx__echo", {"text": text})).is_error
            after = samples((await live.http.get("/metrics")).text)

    assert after[commits] >= first[commits] + 2  # each call's intent and outcome are committed
    assert after[("bastion_ledger_commit_seconds_sum", frozenset({("backend", "sqlite")}))] > 0
    buckets = [v for (name, _), v in after.items() if name == "bastion_ledger_commit_seconds_bucket"]
    assert max(buckets) == after[commits]  # the +Inf bucket holds every commit


async def test_a_held_call_is_counted_pending_and_its_approval_wait_is_observed_as_approved(tmp_path: Path) -> None:
    async with live_bastion(tmp_path, gateway_running=True, modes={"fx:echo": "require_approval"}) as live:
        results: list[bool] = []

        async def held_call() -> None:
            async with (
                httpx2.AsyncClient(timeout=WAIT) as http,
                Client(streamable_http_client(f"{live.url}/mcp", http_client=http), mode="legacy", cache=None) as c,
            ):
                results.append((await c.call_tool("fx__echo", {"text": "hold me"})).is_error)

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(held_call)
                while True:
                    cursor = live.ledger.changes.cursor  # before the read: a change after it ends the wait below
                    if waiting := await live.ledger.invocations.list(status="pending"):
                        break
                    await live.ledger.changes.next(cursor)
                held = samples((await live.http.get("/metrics")).text)
                assert held[("bastion_pending_calls", frozenset())] == 1
                await live.ledger.invocations.decide(
                    waiting[0].id, approve=True, principal="alice", note=None, now=utcnow()
                )
            after = samples((await live.http.get("/metrics")).text)

    assert results == [False]
    assert after[("bastion_pending_calls", frozenset())] == 0
    assert after[("bastion_approval_wait_seconds_count", frozenset({("decision", "approved")}))] == 1
    calls = frozenset({("source", "fx"), ("mode", "require_approval"), ("status", "completed")})
    assert after[("bastion_calls_total", calls)] == 1
