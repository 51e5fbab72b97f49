"""Calls that wait for a human, and the drift guard, driven through a real client against an in-process Bastion."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from bastion.config import ApprovalSettings, ToolOverride, ToolPin
from bastion.models import Invocation, utcnow
from tests.downstream import FixtureServer
from tests.harness import Harness, harness
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

FAST = ApprovalSettings(heartbeat_seconds=0.05, expiry_seconds=300)


async def approved_call(h: Harness, name: str) -> tuple[Invocation, types.CallToolResult]:
    """Call `name`, approve it (as alice) once it is held, and return the held invocation and what the call gave."""
    outcome: list[types.CallToolResult] = []
    async with anyio.create_task_group() as tg:

        async def call() -> None:
            outcome.append(await h.call(name))

        tg.start_soon(call)
        (pending,) = await wait_pending(h)
        await h.ledger.invocations.decide(pending.id, approve=True, principal="alice", note=None, now=utcnow())
    (result,) = outcome
    return pending, result


async def wait_pending(h: Harness, count: int = 1) -> list[Invocation]:
    """Wait (bounded) until `count` invocations are pending."""
    with anyio.fail_after(10):
        while True:
            found = await h.ledger.invocations.list(status="pending")
            if len(found) >= count:
                return found
            with anyio.move_on_after(0.1):
                await h.ledger.changes.next(h.ledger.changes.cursor)


async def kinds(h: Harness, invocation_id: str) -> list[str]:
    return [e.kind for e in await h.ledger.invocations.events(invocation_id)]


async def test_a_write_call_blocks_with_heartbeats_until_approved_and_returns_the_real_result(
    tmp_path: Path,
) -> None:
    heartbeats: list[tuple[float, str | None]] = []
    heard = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heartbeats.append((progress, message))
        if len(heartbeats) >= 2:
            heard.set()

    outcome: list[types.CallToolResult] = []
    async with harness(tmp_path, approvals=FAST, mode="legacy") as h:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                outcome.append(await h.call("fx__progress", progress=on_progress))

            tg.start_soon(call)
            (pending,) = await wait_pending(h)
            assert (pending.mode, pending.mode_source) == ("require_approval", "inferred")
            assert pending.expires_at is not None
            with anyio.fail_after(10):
                await heard.wait()
            assert h.fixture.calls == []
            await h.ledger.invocations.decide(pending.id, approve=True, principal="alice", note="fine", now=utcnow())
        (result,) = outcome
        assert not result.is_error
        assert isinstance(result.content[0], types.TextContent)
        assert result.content[0].text == "done"
        assert pending.id in (heartbeats[0][1] or "")
        values = [v for v, _ in heartbeats]
        assert values == sorted(values)
        assert len(values) >= 5  # heartbeats, then the downstream's own three steps
        done = await h.ledger.invocations.get(pending.id)
        assert done is not None
        assert done.status == "completed"
        assert await kinds(h, pending.id) == ["planned", "pending", "approved", "executing", "completed"]


async def test_a_denied_call_returns_approval_denied_with_the_reason(tmp_path: Path) -> None:
    outcome: list[types.CallToolResult] = []
    async with harness(tmp_path, approvals=FAST) as h:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                outcome.append(await h.call("fx__progress"))

            tg.start_soon(call)
            (pending,) = await wait_pending(h)
            await h.ledger.invocations.decide(
                pending.id, approve=False, principal="bob", note="not today", now=utcnow()
            )
        error = error_of(outcome[0])
        assert error["class"] == "approval_denied"
        assert "not today" in error["message"]
        assert h.fixture.calls == []
        assert await kinds(h, pending.id) == ["planned", "pending", "denied"]


async def test_an_undecided_call_expires(tmp_path: Path) -> None:
    async with harness(tmp_path, approvals=ApprovalSettings(heartbeat_seconds=0.05, expiry_seconds=0.3)) as h:
        error = error_of(await h.call("fx__progress"))
        assert error["class"] == "approval_expired"
        invocation = await h.only_invocation()
        assert invocation.status == "expired"
        assert await kinds(h, invocation.id) == ["planned", "pending", "expired"]
        assert h.fixture.calls == []


async def test_an_approval_after_the_host_gave_up_still_runs_and_keeps_the_result(tmp_path: Path) -> None:
    async with harness(tmp_path, approvals=FAST) as h:
        with anyio.move_on_after(0.5):
            await h.call("fx__progress")
        (pending,) = await h.ledger.invocations.list(status="pending")
        await h.ledger.invocations.decide(pending.id, approve=True, principal="alice", note=None, now=utcnow())
        with anyio.fail_after(10):
            while (current := await h.ledger.invocations.get(pending.id)) is None or current.status != "completed":
                with anyio.move_on_after(0.1):
                    await h.ledger.changes.next(h.ledger.changes.cursor)
        lookup = await h.call("bastion__invocation", {"invocation_id": pending.id})
        assert not lookup.is_error
        assert lookup.structured_content is not None
        assert lookup.structured_content["status"] == "completed"
        assert lookup.structured_content["result"]["content"][0]["text"] == "done"
        assert [c.name for c in h.fixture.calls] == ["progress"]


async def test_the_desk_outlives_a_ledger_locked_past_its_patience_and_settles_calls_after(tmp_path: Path) -> None:
    """Another process holds the ledger's write lock longer than the busy timeout while `HeldCalls` sweeps expiries:
    `HeldCalls` says so and tries again (it used to end, and the gateway with it), and once the lock is let go a held
    call is approved and runs."""
    refused = anyio.Event()

    class Refusals(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "could not be looked at in the ledger" in record.getMessage():
                refused.set()

    desk_log = logging.getLogger("bastion.pipeline.approvals")
    handler = Refusals(logging.WARNING)
    desk_log.addHandler(handler)
    try:
        async with harness(tmp_path, approvals=FAST) as h:
            lock = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
            try:
                lock.execute("BEGIN IMMEDIATE")
                with anyio.fail_after(30):  # the idle sweep comes within 5 s, then waits 5 s for the lock
                    await refused.wait()
            finally:
                lock.execute("ROLLBACK")
                lock.close()
            _, result = await approved_call(h, "fx__progress")
    finally:
        desk_log.removeHandler(handler)
    assert not result.is_error
    assert [c.name for c in h.fixture.calls] == ["progress"]


async def test_the_invocation_tool_is_listed_never_gated_and_refuses_unknown_ids(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        tools = {t.name: t for t in (await h.client.list_tools()).tools}
        assert "bastion__invocation" in tools
        assert error_of(await h.call("bastion__invocation", {"invocation_id": "nope"}))["class"] == "not_found"
        assert await h.ledger.invocations.list() == []


async def test_the_pending_limit_refuses_and_records_why(tmp_path: Path) -> None:
    limited = ApprovalSettings(heartbeat_seconds=0.05, max_pending_per_session=1)
    async with harness(tmp_path, approvals=limited) as h, anyio.create_task_group() as tg:
        tg.start_soon(h.call, "fx__progress")
        (first,) = await wait_pending(h)
        error = error_of(await h.call("fx__progress", {"another": "call"}))  # the same arguments would be a retry
        assert error["class"] == "pending_limit"
        refused = await h.ledger.invocations.get(error["invocation_id"])
        assert refused is not None
        assert (refused.status, refused.error_class) == ("denied", "pending_limit")
        await h.ledger.invocations.decide(first.id, approve=False, principal="alice", note=None, now=utcnow())


async def test_the_rate_limit_refuses_and_records_why(tmp_path: Path) -> None:
    async with harness(tmp_path, per_minute=2) as h:
        for _ in range(2):
            assert not (await h.call("fx__echo", {"text": "x"})).is_error
        error = error_of(await h.call("fx__echo", {"text": "x"}))
        assert error["class"] == "rate_limited"
        assert error["retriable"] is True
        assert f"retry in {error['retry_after']} s" in error["message"]  # the wait, also in whole seconds
        refused = await h.ledger.invocations.get(error["invocation_id"])
        assert refused is not None
        assert (refused.status, refused.error_class) == ("denied", "rate_limited")


async def test_the_rate_limit_is_one_budget_for_every_gateway_sharing_the_ledger(tmp_path: Path) -> None:
    """Two gateways on one ledger file (two instances on one machine): the session's calls count together."""
    async with harness(tmp_path, per_minute=2) as first, harness(tmp_path, per_minute=2) as second:
        assert not (await first.call("fx__echo", {"text": "x"})).is_error
        assert not (await second.call("fx__echo", {"text": "x"})).is_error
        for h in (first, second):
            assert error_of(await h.call("fx__echo", {"text": "x"}))["class"] == "rate_limited"


# -- drift -------------------------------------------------------------------------------------------


async def relist(h: Harness, tools: list[types.Tool]) -> None:
    """Change the downstream's tools, let it send list_changed, and wait for Bastion to re-list."""
    changed = anyio.Event()

    async def on_change() -> None:
        changed.set()

    h.gateway.on_catalog_changed(on_change)
    await h.fixture.set_tools(tools)
    with anyio.fail_after(10):
        await changed.wait()


def changed_tool(h: Harness, name: str, **update: Any) -> list[types.Tool]:
    return [t.model_copy(update=update) if t.name == name else t for t in h.fixture.tools]


async def blocked_mode(h: Harness, tool: str, arguments: dict[str, Any]) -> Invocation:
    """Call a tool that should now wait for approval; return its pending invocation and deny it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.call, tool, arguments)
        (pending,) = await wait_pending(h)
        await h.ledger.invocations.decide(pending.id, approve=False, principal="t", note=None, now=utcnow())
    return pending


async def test_a_changed_description_turns_allow_into_require_approval_until_accepted(tmp_path: Path) -> None:
    async with harness(tmp_path, approvals=FAST) as h:
        assert not (await h.call("fx__echo", {"text": "a"})).is_error
        await relist(h, changed_tool(h, "echo", description="Now also emails your files somewhere."))
        pending = await blocked_mode(h, "fx__echo", {"text": "b"})
        assert (pending.mode, pending.mode_source) == ("require_approval", "drift")
        assert pending.drift is not None
        assert any("emails your files" in line for line in pending.drift)
        (pin,) = [p for p in await h.ledger.pins.pins("fx") if p.action_id == "echo"]
        assert pin.drift is not None
        await h.ledger.pins.accept_drift(source_id="fx", action_id="echo", principal="alice")
        assert not (await h.call("fx__echo", {"text": "c"})).is_error
        assert (await h.ledger.invocations.list())[0].mode_source == "inferred"


async def test_flipping_read_only_to_false_under_the_same_name_reads_as_drift(tmp_path: Path) -> None:
    async with harness(tmp_path, approvals=FAST) as h:
        flipped = types.ToolAnnotations(read_only_hint=False)
        await relist(h, changed_tool(h, "echo", annotations=flipped))
        pending = await blocked_mode(h, "fx__echo", {"text": "b"})
        assert (pending.mode, pending.mode_source) == ("require_approval", "drift")
        assert pending.drift is not None
        assert any("readOnlyHint" in line for line in pending.drift)


async def test_drift_never_loosens_deny(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await relist(h, changed_tool(h, "fail", description="Harmless now, promise.", annotations=None))
        error = error_of(await h.call("fx__fail"))
        assert error["class"] == "policy_denied"
        assert (await h.only_invocation()).mode == "deny"


async def test_an_explicit_pin_in_the_connector_file_is_checked(tmp_path: Path) -> None:
    pinned = {"echo": ToolOverride(pin=ToolPin(fingerprint="0" * 64))}
    async with harness(tmp_path, approvals=FAST, overrides=pinned) as h:
        pending = await blocked_mode(h, "fx__echo", {"text": "b"})
        assert pending.mode_source == "drift"


async def test_an_explicit_pin_added_after_first_use_is_not_cleared_by_the_first_use_pin(tmp_path: Path) -> None:
    async with harness(tmp_path, approvals=FAST) as h:
        assert not (await h.call("fx__echo", {"text": "a"})).is_error  # pinned on first use
    pinned = {"echo": ToolOverride(pin=ToolPin(fingerprint="0" * 64))}
    async with harness(tmp_path, approvals=FAST, overrides=pinned) as h:
        for text in ("b", "c"):  # the check at call time re-reads the stored pin: it must not clear this drift
            assert (await blocked_mode(h, "fx__echo", {"text": text})).mode_source == "drift"
        assert "fx__echo" not in {t.name for t in (await h.client.list_tools()).tools}  # no definition to show


async def test_a_new_tool_on_a_known_connector_waits_for_a_pin_when_asked(tmp_path: Path) -> None:
    async with harness(tmp_path, approvals=FAST, pin_new_tools="approve") as h:
        fresh = types.Tool(
            name="peek",
            description="Read something.",
            input_schema={"type": "object"},
            annotations=types.ToolAnnotations(read_only_hint=True),
        )
        await relist(h, [*h.fixture.tools, fresh])
        pending = await blocked_mode(h, "fx__peek", {})
        assert (pending.mode, pending.mode_source) == ("require_approval", "drift")
        await h.ledger.pins.accept_drift(source_id="fx", action_id=None, principal="alice")
        fixture_calls = len(h.fixture.calls)
        await h.call("fx__peek", {})
        assert len(h.fixture.calls) == fixture_calls + 1


async def test_first_use_pins_every_tool(tmp_path: Path) -> None:
    fixture = FixtureServer()
    async with harness(tmp_path, fixture=fixture) as h:
        pins = await h.ledger.pins.pins("fx")
        assert {p.action_id for p in pins} == {t.name for t in fixture.tools}
        assert all(p.pinned_by == "first-use" and p.drift is None for p in pins)
