"""The call pipeline, driven through a real MCP client against an in-process Bastion.

Real parts: the SDK client, Bastion's host server and gateway, a real SQLite ledger file, and an
in-process downstream MCP server (tests/downstream.py) behind a real McpConnector.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
import pytest

from bastion.actions import WireResult
from bastion.config import Profile, ToolOverride
from bastion.errors import InvalidArguments
from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.models import CallContext, Invocation, utcnow
from bastion.pipeline.catalog import new_invocation_id
from bastion.pipeline.observer import Observers
from bastion.pipeline.outcomes import Outcomes
from bastion.sources.mcp.connector import CORRELATION_META_KEY
from tests.downstream import FixtureServer
from tests.harness import Harness, harness

pytestmark = pytest.mark.anyio


def error_of(result: types.CallToolResult) -> dict[str, Any]:
    """The error of a refusal: in `_meta` always, and in `structuredContent` too unless the tool declares an
    outputSchema (which the error would break)."""
    assert result.is_error
    assert result.meta is not None
    error: dict[str, Any] = result.meta["io.bastion/error"]
    if result.structured_content is not None:
        assert result.structured_content["error"] == error
    return error


async def test_allowed_call_runs_and_is_recorded_completed_with_its_correlation_id(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        result = await h.call("fx__echo", {"text": "hi"})
        assert not result.is_error
        invocation = await h.only_invocation()
        assert (invocation.status, invocation.mode, invocation.mode_source) == ("completed", "allow", "inferred")
        assert invocation.policy_key == "fx:echo"
        assert h.fixture.calls[0].meta[CORRELATION_META_KEY] == invocation.id
        kinds = [e.kind for e in await h.ledger.invocations.events(invocation.id)]
        assert kinds == ["planned", "approved", "executing", "completed"]


async def test_the_invocation_is_durable_before_the_call_reaches_the_downstream(tmp_path: Path) -> None:
    async with harness(tmp_path, modes={"fx:sleep": "allow"}) as h, anyio.create_task_group() as tg:
        tg.start_soon(h.call, "fx__sleep")
        with anyio.fail_after(10):
            await h.fixture.sleep_started.wait()
        invocation = await h.only_invocation()
        assert invocation.status == "executing"
        assert [e.kind for e in await h.ledger.invocations.events(invocation.id)] == [
            "planned",
            "approved",
            "executing",
        ]
        h.fixture.release.set()


async def test_denied_call_is_recorded_and_never_reaches_the_downstream(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        error = error_of(await h.call("fx__fail"))
        assert error["class"] == "policy_denied"
        assert h.fixture.calls == []
        invocation = await h.only_invocation()
        assert error["invocation_id"] == invocation.id
        assert (invocation.status, invocation.mode, invocation.risk) == ("denied", "deny", "danger")
        assert invocation.risk_source == "destructiveHint"
        assert [e.kind for e in await h.ledger.invocations.events(invocation.id)] == ["planned", "denied"]


async def test_invalid_arguments_are_refused_before_anything_is_recorded(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        assert error_of(await h.call("fx__echo", {"text": 3}))["class"] == "invalid_arguments"
        assert error_of(await h.call("fx__shapes", {"at": [1, 2], "extra": 1}))["class"] == "invalid_arguments"
        assert await h.ledger.invocations.list() == []
        assert h.fixture.calls == []


async def test_text_that_is_not_unicode_is_refused_as_invalid_arguments_before_anything_is_recorded(
    tmp_path: Path,
) -> None:
    """A lone surrogate can be neither stored nor sent: it is refused before any record, never recorded as an
    outcome to check downstream (an agent could fill the list of unresolved calls with them)."""
    async with harness(tmp_path, modes={"fx:echo": "allow"}) as h:
        for arguments in ({"text": "a\ud800b"}, {"text": "ok", "note\udc00": "key"}):
            with pytest.raises(InvalidArguments, match="lone UTF-16 surrogate") as refused:
                await h.gateway.call("fx__echo", arguments, CallContext(session_id="s"))
            assert "\ud800" not in refused.value.message and "\udc00" not in refused.value.message
        assert await h.ledger.invocations.list() == []
        assert h.fixture.calls == []


async def test_org_wildcard_and_session_profile_decide_the_mode(tmp_path: Path) -> None:
    profiles = {"nightly": Profile(modes={"fx:echo": "deny"})}
    async with harness(tmp_path, modes={"fx:*": "allow"}, profiles=profiles, profile="nightly") as h:
        assert error_of(await h.call("fx__echo", {"text": "x"}))["class"] == "policy_denied"
        assert not (await h.call("fx__progress")).is_error
        by_tool = {i.tool: i for i in await h.ledger.invocations.list()}
        assert (by_tool["fx__echo"].mode_source, by_tool["fx__echo"].profile) == ("profile", "nightly")
        assert (by_tool["fx__progress"].mode, by_tool["fx__progress"].mode_source) == ("allow", "org")


async def test_an_unknown_mode_value_fails_safe_to_deny(tmp_path: Path) -> None:
    async with harness(tmp_path, modes={"fx:echo": "alow"}) as h:
        assert error_of(await h.call("fx__echo", {"text": "x"}))["class"] == "policy_denied"
        invocation = await h.only_invocation()
        assert (invocation.mode, invocation.mode_source) == ("deny", "unknown_mode:alow")


async def test_a_downstream_timeout_after_sending_is_recorded_unknown(tmp_path: Path) -> None:
    async with harness(tmp_path, modes={"fx:sleep": "allow"}, call_timeout=0.2) as h:
        error = error_of(await h.call("fx__sleep"))
        assert error["class"] == "timeout"
        invocation = await h.only_invocation()
        assert (invocation.status, invocation.error_class) == ("unknown", "timeout")
        h.fixture.release.set()


async def test_a_downstream_error_is_recorded_failed(tmp_path: Path) -> None:
    async with harness(tmp_path, modes={"fx:fail": "allow"}) as h:
        assert error_of(await h.call("fx__fail"))["class"] == "upstream_error"
        invocation = await h.only_invocation()
        assert (invocation.status, invocation.error_class) == ("failed", "upstream_error")


async def test_hidden_tools_are_neither_listed_nor_callable(tmp_path: Path) -> None:
    async with harness(tmp_path, overrides={"echo": ToolOverride(hidden=True)}) as h:
        names = {t.name for t in (await h.client.list_tools()).tools}
        assert "fx__echo" not in names
        assert "fx__shapes" in names
        assert error_of(await h.call("fx__echo", {"text": "x"}))["class"] == "not_found"


async def test_disabled_sources_are_hidden_and_refused(tmp_path: Path) -> None:
    async with harness(tmp_path, disabled=["off"]) as h:
        assert all(not t.name.startswith("off__") for t in (await h.client.list_tools()).tools)
        assert error_of(await h.call("off__anything"))["class"] == "source_disabled"
        assert [s.state for s in h.gateway.statuses() if s.source_id == "off"] == ["disabled"]


async def test_upstream_definitions_reach_the_host_verbatim(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        tools = {t.name: t for t in (await h.client.list_tools()).tools}
        upstream = next(t for t in h.fixture.tools if t.name == "shapes")
        seen = tools["fx__shapes"]
        for field in ("title", "description", "input_schema", "output_schema", "annotations", "meta"):
            assert getattr(seen, field) == getattr(upstream, field), field


async def test_risk_override_in_the_connector_file_wins_over_annotations_and_is_recorded_as_the_risks_source(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path, overrides={"echo": ToolOverride(risk="danger")}) as h:
        assert error_of(await h.call("fx__echo", {"text": "x"}))["class"] == "policy_denied"
        invocation = await h.only_invocation()
        assert (invocation.risk, invocation.risk_source) == ("danger", "override")


async def test_a_downstream_list_changed_reaches_the_host_catalog(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        changed = anyio.Event()

        async def on_change() -> None:
            changed.set()

        h.gateway.on_catalog_changed(on_change)
        extra = types.Tool(name="fresh", description="new", input_schema={"type": "object"})
        await h.fixture.set_tools([*h.fixture.tools, extra])
        with anyio.fail_after(10):
            await changed.wait()
        assert "fx__fresh" in {t.name for t in (await h.client.list_tools()).tools}


async def test_a_tool_of_a_connector_that_is_down_is_connector_unavailable_not_not_found(tmp_path: Path) -> None:
    async with harness(tmp_path, downstream="streams") as h:
        assert not (await h.call("fx__echo", {"text": "up"})).is_error
        changed = anyio.Event()

        async def on_change() -> None:
            if "fx__echo" not in h.gateway.catalog.entries:
                changed.set()

        h.gateway.on_catalog_changed(on_change)
        h.target.kill()
        with anyio.fail_after(10):
            await changed.wait()
        down = error_of(await h.call("fx__echo", {"text": "down"}))
        assert (down["class"], down["retriable"]) == ("connector_unavailable", True)
        assert error_of(await h.call("fx__never_listed"))["class"] == "connector_unavailable"
        assert error_of(await h.call("elsewhere__echo"))["class"] == "not_found"
        statuses = [i.status for i in await h.ledger.invocations.list()]
        assert statuses == ["completed"], "nothing is recorded for a call that cannot be made"


async def test_a_result_nested_too_deep_for_any_parser_is_still_returned_and_recorded_completed(
    tmp_path: Path,
) -> None:
    nested = "[" * 600 + "]" * 600
    async with harness(tmp_path) as h:
        result = await h.call("fx__echo", {"text": nested})
        assert not result.is_error
        assert isinstance(result.content[0], types.TextContent) and result.content[0].text == nested
        invocation = await h.only_invocation()
        assert invocation.status == "completed"
        assert [e.kind for e in await h.ledger.invocations.events(invocation.id)][-1] == "completed"


async def test_arguments_nested_deeper_than_can_be_hashed_are_invalid_before_anything_is_recorded(
    tmp_path: Path,
) -> None:
    fixture = FixtureServer()
    fixture.tools.append(types.Tool(name="anything", input_schema={"type": "object"}))
    deep: Any = "bottom"
    for _ in range(2000):
        deep = [deep]
    async with harness(tmp_path, fixture=fixture, modes={"fx:anything": "allow"}) as h:
        with pytest.raises(InvalidArguments, match="nested"):
            await h.gateway.call("fx__anything", {"value": deep}, CallContext(session_id="s"))
        assert await h.ledger.invocations.list() == []
        assert fixture.calls == []


async def test_an_outcome_the_ledger_refuses_is_kept_and_recorded_once_the_ledger_takes_writes_again(
    tmp_path: Path,
) -> None:
    finished: list[Invocation] = []
    recorded = anyio.Event()

    class Finished:
        async def planned(self, invocation: Invocation) -> None:
            pass

        decided = executing = planned

        async def finished(self, invocation: Invocation) -> None:
            finished.append(invocation)
            recorded.set()

    async with harness(tmp_path, modes={"fx:sleep": "allow"}) as h:
        h.gateway.observers.add(Finished())
        results: list[types.CallToolResult] = []
        lock = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
        try:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    results.append(await h.call("fx__sleep"))

                tg.start_soon(call)
                with anyio.fail_after(10):
                    await h.fixture.sleep_started.wait()
                lock.execute("BEGIN IMMEDIATE")  # another process holds the write lock past the ledger's patience
                h.fixture.release.set()
            # The ledger refused the outcome (LedgerUnavailable after its busy wait); the host got its answer anyway.
            assert [r.is_error for r in results] == [False]
            assert (await h.only_invocation()).status == "executing"
            assert finished == []
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        with anyio.fail_after(30):
            await recorded.wait()
        invocation = await h.only_invocation()
        assert invocation.status == "completed" and invocation.result is not None
        assert [i.status for i in finished] == ["completed"]


async def _traced_writes(h: Harness) -> list[str]:
    """The statements the ledger's writer runs from now on, as SQLite traces them (with their values)."""
    statements: list[str] = []
    database = h.ledger.backend.database
    assert isinstance(database, SqliteDatabase)
    await database.read_on_writer(lambda conn: conn.set_trace_callback(statements.append))
    return statements


def _transactions(statements: list[str]) -> list[list[str]]:
    """The writer's statements grouped by transaction (BEGIN IMMEDIATE to COMMIT)."""
    transactions: list[list[str]] = []
    for statement in statements:
        if statement == "BEGIN IMMEDIATE":
            transactions.append([])
        elif transactions and statement != "COMMIT":
            transactions[-1].append(statement)
    return transactions


def _intents(transaction: list[str]) -> int:
    return sum(statement.lstrip().startswith("INSERT INTO invocations") for statement in transaction)


async def test_calls_that_start_while_another_runs_record_their_intents_in_one_commit(tmp_path: Path) -> None:
    """A call alone commits its intent at once; calls that start while another is in flight may wait for the loop's
    next turn to share one commit (fewer commits under concurrency), each still durable before it runs."""
    async with harness(tmp_path, modes={"fx:sleep": "allow", "fx:echo": "allow"}) as h:
        statements = await _traced_writes(h)
        context = CallContext(session_id="s", local_session=True)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.gateway.call, "fx__sleep", {}, context)
                await h.fixture.sleep_started.wait()
                alone = [t for t in _transactions(statements) if _intents(t)]
                assert [_intents(t) for t in alone] == [1]  # the first call's intent: nothing to wait for
                echoes = [h.gateway.call("fx__echo", {"text": text}, context) for text in ("a", "b", "c")]
                results = await asyncio.gather(*echoes)
                h.fixture.release.set()
        assert [result.is_error for result in results] == [False, False, False]
        assert sorted(_intents(t) for t in _transactions(statements) if _intents(t)) == [1, 3]
        assert {i.status for i in await h.ledger.invocations.list()} == {"completed"}


def _outcomes(transaction: list[str]) -> int:
    """How many outcomes (`FINISH`, traced with its values) the transaction records."""
    return sum(
        statement.lstrip().startswith("UPDATE invocations SET") and "' AND status = 'executing'" in statement
        for statement in transaction
    )


async def test_an_answered_call_records_its_outcome_with_the_next_calls_intent_while_others_run(
    tmp_path: Path,
) -> None:
    """An express call answered while another runs records its outcome off its own task, in the next call's intent
    transaction: one commit for both; a read of this process sees it at once."""
    async with harness(tmp_path, modes={"fx:sleep": "allow", "fx:echo": "allow"}) as h:
        statements = await _traced_writes(h)
        context = CallContext(session_id="s", local_session=True)
        delivered: list[WireResult] = []

        async def deliver(result: WireResult) -> None:
            delivered.append(result)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.gateway.call, "fx__sleep", {}, context)
                await h.fixture.sleep_started.wait()
                await h.gateway.call_express("fx__echo", {"text": "a"}, context, deliver)
                assert sum(_outcomes(t) for t in _transactions(statements)) == 0  # answered; its outcome waits
                await h.gateway.call_express("fx__echo", {"text": "b"}, context, deliver)
                shared = [t for t in _transactions(statements) if _intents(t) and _outcomes(t)]
                assert [(_intents(t), _outcomes(t)) for t in shared] == [(1, 1)]  # b's intent and a's outcome
                await h.gateway.call_express("fx__echo", {"text": "c"}, context, deliver)
                by_status = sorted(i.status for i in await h.ledger.invocations.list())  # the read commits c's first
                assert by_status == ["completed", "completed", "completed", "executing"]
                h.fixture.release.set()
        assert [result.data.get("isError") for result in delivered] == [False, False, False]
        assert {i.status for i in await h.ledger.invocations.list()} == {"completed"}


async def test_an_outcome_handed_over_is_recorded_when_its_recorder_is_stopped_at_once(tmp_path: Path) -> None:
    """`Outcomes.run` cancelled right after an outcome was handed over (waiting for the next call's commit): the stop
    waits for it, and the outcome is committed, not left `executing`."""
    async with harness(tmp_path, modes={}) as h:
        outcomes = Outcomes(h.ledger.invocations, Observers())
        now = utcnow()
        invocation = Invocation(
            id=new_invocation_id(), status="executing", policy_key="fx:echo", tool="fx__echo", source_id="fx",
            action_id="echo", risk="read", mode="allow", mode_source="inferred", session_id="s", args={},
            args_hash="", owner=h.gateway.instance_id, created_at=now, updated_at=now,
        )  # fmt: skip
        await outcomes.start(invocation)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(outcomes.run)
                await anyio.lowlevel.checkpoint()  # `run` is running
                await outcomes.finish(invocation, "completed", result=WireResult({"content": []}), may_defer=True)
                tg.cancel_scope.cancel()
        stored = await h.ledger.invocations.get(invocation.id)
    assert stored is not None and (stored.status, stored.result) == ("completed", {"content": []})
