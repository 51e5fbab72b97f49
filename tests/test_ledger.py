"""The SQLite ledger on real files: round trips, conditional transitions, races, redaction at rest, migrations."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
import pytest

from bastion.errors import ConfigError, Conflict
from bastion.gateway import Ledger
from bastion.ledger import Redactor, SqliteLedger
from bastion.ledger.schema import SCHEMA_VERSION
from bastion.models import Invocation, Status

CANARY = "ghp_" + "Zq8" * 12
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def make_invocation(number: int = 1, **overrides: Any) -> Invocation:
    fields: dict[str, Any] = {
        "id": f"inv-{number:04d}",
        "status": "pending",
        "policy_key": "fs:write_file",
        "tool": "fs__write_file",
        "source_id": "fs",
        "action_id": "write_file",
        "risk": "write",
        "mode": "require_approval",
        "mode_source": "org",
        "session_id": "session-a",
        "args": {"path": "/tmp/x", "content": "héllo ✓"},
        "args_hash": "0" * 64,
        "created_at": T0 + timedelta(seconds=number),
        "updated_at": T0 + timedelta(seconds=number),
    }
    fields.update(overrides)
    return Invocation(**fields)


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[SqliteLedger]:
    async with await SqliteLedger.open(tmp_path / "ledger.db", redactor=Redactor()) as opened:
        yield opened


def read_pragma(path: Path, pragma: str) -> Any:
    with sqlite3.connect(path) as db:
        value = db.execute(f"PRAGMA {pragma}").fetchone()[0]
    db.close()
    return value


# -- round trips -------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_sqlite_ledger_satisfies_the_gateway_ledger_protocol(tmp_path: Path) -> None:
    ledger: Ledger = await SqliteLedger.open(tmp_path / "ledger.db", redactor=Redactor())
    assert await ledger.get("missing") is None
    assert isinstance(ledger, SqliteLedger)
    await ledger.close()


@pytest.mark.anyio
async def test_record_then_get_round_trips_every_field(ledger: SqliteLedger) -> None:
    invocation = make_invocation(
        fingerprint="f" * 64,
        profile="nightly",
        principal="alice",
        args={"nested": [1, 2.5, None, True, {"ü": "ß"}], "empty": {}},
        result={"content": [{"type": "text", "text": "done"}], "isError": False},
        error_class="upstream_error",
        error_message="went wrong",
        owner="instance-1",
        expires_at=T0 + timedelta(minutes=5),
    )
    await ledger.record(invocation, ["planned", "pending"])
    stored = await ledger.get(invocation.id)
    assert stored == invocation
    assert stored is not None
    assert stored.created_at.tzinfo is not None
    assert stored.created_at.utcoffset() == timedelta(0)


@pytest.mark.anyio
async def test_timestamps_come_back_as_the_same_instant_in_utc(ledger: SqliteLedger) -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2026, 11, 21, 12, 0, 0, 123456, tzinfo=plus_two)
    await ledger.record(make_invocation(created_at=local, expires_at=datetime(2026, 11, 21, 10, 5)), ["planned"])
    stored = await ledger.get("inv-0001")
    assert stored is not None
    assert stored.created_at == local
    assert stored.created_at.tzinfo == UTC
    assert stored.expires_at == datetime(2026, 11, 21, 10, 5, tzinfo=UTC)  # naive means UTC


@pytest.mark.anyio
async def test_get_of_an_unknown_id_is_none(ledger: SqliteLedger) -> None:
    assert await ledger.get("nope") is None
    assert await ledger.events("nope") == []


@pytest.mark.anyio
async def test_record_appends_its_events_in_order_with_one_timestamp(ledger: SqliteLedger) -> None:
    await ledger.record(make_invocation(status="denied"), ["planned", "denied"], {"reason": "policy"})
    events = await ledger.events("inv-0001")
    assert [(event.seq, event.kind) for event in events] == [(1, "planned"), (2, "denied")]
    assert events[0].at == events[1].at
    assert [event.detail for event in events] == [{}, {"reason": "policy"}]


@pytest.mark.anyio
async def test_recording_the_same_id_twice_is_a_conflict(ledger: SqliteLedger) -> None:
    await ledger.record(make_invocation(), ["planned"])
    with pytest.raises(Conflict):
        await ledger.record(make_invocation(status="approved"), ["planned", "approved"])
    stored = await ledger.get("inv-0001")
    assert stored is not None
    assert stored.status == "pending"
    assert len(await ledger.events("inv-0001")) == 1


# -- transitions -------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_transition_sets_status_fields_and_appends_the_next_event(ledger: SqliteLedger) -> None:
    await ledger.record(make_invocation(status="executing"), ["planned", "approved", "executing"])
    expiry = T0 + timedelta(hours=1)
    updated = await ledger.transition(
        "inv-0001",
        from_statuses=["executing"],
        to="failed",
        detail={"attempt": 1},
        fields={
            "result": {"isError": True},
            "error_class": "upstream_error",
            "error_message": "boom",
            "owner": "instance-2",
            "expires_at": expiry,
        },
    )
    assert updated is not None
    assert (updated.status, updated.result, updated.error_class, updated.error_message) == (
        "failed",
        {"isError": True},
        "upstream_error",
        "boom",
    )
    assert (updated.owner, updated.expires_at) == ("instance-2", expiry)
    assert updated.updated_at > updated.created_at
    assert await ledger.get("inv-0001") == updated
    events = await ledger.events("inv-0001")
    assert [(event.seq, event.kind, event.detail) for event in events][-1] == (4, "failed", {"attempt": 1})
    assert events[-1].at == updated.updated_at


@pytest.mark.anyio
async def test_transition_can_name_its_event_and_leaves_unset_fields_alone(ledger: SqliteLedger) -> None:
    await ledger.record(make_invocation(status="unknown", error_class="timeout", owner="a"), ["planned"])
    updated = await ledger.transition("inv-0001", from_statuses=["unknown"], to="completed", event="reconciled")
    assert updated is not None
    assert (updated.status, updated.error_class, updated.owner) == ("completed", "timeout", "a")
    assert [event.kind for event in await ledger.events("inv-0001")] == ["planned", "reconciled"]


@pytest.mark.anyio
async def test_transition_from_a_wrong_status_returns_none_and_appends_nothing(ledger: SqliteLedger) -> None:
    await ledger.record(make_invocation(), ["planned", "pending"])
    assert await ledger.transition("inv-0001", from_statuses=["executing", "approved"], to="completed") is None
    assert await ledger.transition("missing", from_statuses=["pending"], to="approved") is None
    assert await ledger.transition("inv-0001", from_statuses=[], to="approved") is None
    stored = await ledger.get("inv-0001")
    assert stored is not None
    assert stored.status == "pending"
    assert len(await ledger.events("inv-0001")) == 2


@pytest.mark.anyio
async def test_transition_refuses_fields_it_does_not_own(ledger: SqliteLedger) -> None:
    await ledger.record(make_invocation(), ["planned"])
    with pytest.raises(ValueError, match="status"):
        await ledger.transition("inv-0001", from_statuses=["pending"], to="approved", fields={"status": "x"})
    stored = await ledger.get("inv-0001")
    assert stored is not None
    assert stored.status == "pending"


@pytest.mark.anyio
async def test_racing_decisions_from_two_connections_have_exactly_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with (
        await SqliteLedger.open(path, redactor=Redactor()) as first,
        await SqliteLedger.open(path, redactor=Redactor()) as second,
    ):
        for number in range(1, 21):
            await first.record(make_invocation(number), ["planned", "pending"])
        outcomes: dict[tuple[int, Status], Invocation | None] = {}

        async def decide(ledger: SqliteLedger, number: int, to: Status) -> None:
            pending: tuple[Status, ...] = ("pending",)
            outcomes[number, to] = await ledger.transition(f"inv-{number:04d}", from_statuses=pending, to=to)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for number in range(1, 21):
                    group.start_soon(decide, first, number, "approved")
                    group.start_soon(decide, second, number, "denied")

        for number in range(1, 21):
            approved, denied = outcomes[number, "approved"], outcomes[number, "denied"]
            assert (approved is None) != (denied is None)
            winner = approved or denied
            assert winner is not None
            stored = await second.get(f"inv-{number:04d}")
            assert stored is not None
            assert stored.status == winner.status
            kinds = [event.kind for event in await first.events(f"inv-{number:04d}")]
            assert kinds == ["planned", "pending", winner.status]


@pytest.mark.anyio
async def test_a_cancelled_write_is_all_or_nothing_and_leaves_the_ledger_usable(ledger: SqliteLedger) -> None:
    with anyio.CancelScope() as scope:
        scope.cancel()
        await ledger.record(make_invocation(1), ["planned", "pending"])
    await ledger.record(make_invocation(2), ["planned"])
    first = await ledger.get("inv-0001")
    assert len(await ledger.events("inv-0001")) == (0 if first is None else 2)
    assert await ledger.get("inv-0002") is not None


# -- listing -----------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_list_filters_and_returns_newest_first(ledger: SqliteLedger) -> None:
    await ledger.record(make_invocation(1), ["planned"])
    await ledger.record(make_invocation(2, source_id="github", session_id="session-b"), ["planned"])
    await ledger.record(make_invocation(3, status="denied"), ["planned", "denied"])
    await ledger.record(make_invocation(4, session_id="session-b"), ["planned"])
    # Same created_at as number 4: insertion order breaks the tie.
    await ledger.record(make_invocation(5, created_at=T0 + timedelta(seconds=4)), ["planned"])

    async def ids(**filters: Any) -> list[str]:
        return [invocation.id for invocation in await ledger.list(**filters)]

    assert await ids() == ["inv-0005", "inv-0004", "inv-0003", "inv-0002", "inv-0001"]
    assert await ids(status="pending") == ["inv-0005", "inv-0004", "inv-0002", "inv-0001"]
    assert await ids(status="denied") == ["inv-0003"]
    assert await ids(source_id="github") == ["inv-0002"]
    assert await ids(session_id="session-b") == ["inv-0004", "inv-0002"]
    assert await ids(status="pending", session_id="session-a", source_id="fs") == ["inv-0005", "inv-0001"]
    assert await ids(limit=2) == ["inv-0005", "inv-0004"]
    assert await ids(status="expired") == []
    with pytest.raises(ValueError, match="limit"):
        await ledger.list(limit=-1)
    assert await ledger.count() == 5
    assert await ledger.count("pending") == 4
    assert await ledger.count("completed") == 0


# -- redaction at rest -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_secrets_never_reach_the_database_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = await SqliteLedger.open(path, redactor=Redactor())
    invocation = make_invocation(
        args={"note": f"use {CANARY}", "api_key": "plain-secret-value", "list": [f"Bearer {CANARY}"]},
        error_message=f"failed with token={CANARY}",
    )
    await ledger.record(invocation, ["planned", "pending"], {"why": CANARY})
    await ledger.transition(
        invocation.id,
        from_statuses=["pending"],
        to="failed",
        detail={"header": f"Authorization: Bearer {CANARY}"},
        fields={"result": {"text": json.dumps({"secret": CANARY})}, "error_message": f"x {CANARY}"},
    )
    stored = await ledger.get(invocation.id)
    await ledger.close()

    assert stored is not None
    assert CANARY not in json.dumps(stored.model_dump(mode="json"))
    assert stored.args["api_key"] == "[REDACTED]"
    files = [file for file in tmp_path.iterdir() if file.name.startswith("ledger.db")]
    raw = b"".join(file.read_bytes() for file in files)
    assert b"[REDACTED]" in raw
    assert CANARY.encode() not in raw
    assert b"plain-secret-value" not in raw


@pytest.mark.anyio
async def test_large_results_are_stored_truncated_to_max_bytes(tmp_path: Path) -> None:
    async with await SqliteLedger.open(tmp_path / "ledger.db", redactor=Redactor(max_bytes=1024)) as ledger:
        await ledger.record(make_invocation(status="executing"), ["planned"])
        result = {"content": [{"type": "text", "text": "x" * 100_000}]}
        updated = await ledger.transition(
            "inv-0001", from_statuses=["executing"], to="completed", fields={"result": result}
        )
    assert updated is not None
    stored = json.dumps(updated.result, ensure_ascii=False, separators=(",", ":")).encode()
    assert len(stored) <= 1024
    assert "[truncated" in updated.result["content"][0]["text"]


# -- the file ----------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_new_file_is_created_with_its_directory_and_migrated(tmp_path: Path) -> None:
    path = tmp_path / "state" / "nested" / "ledger.db"
    ledger = await SqliteLedger.open(path, redactor=Redactor())
    assert ledger.path == path
    await ledger.close()
    await ledger.close()  # closing twice is harmless
    assert read_pragma(path, "user_version") == SCHEMA_VERSION


@pytest.mark.anyio
async def test_an_empty_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.touch()
    async with await SqliteLedger.open(path, redactor=Redactor()) as ledger:
        await ledger.record(make_invocation(), ["planned"])
    assert read_pragma(path, "user_version") == SCHEMA_VERSION
    async with await SqliteLedger.open(path, redactor=Redactor()) as reopened:
        assert await reopened.count() == 1


@pytest.mark.anyio
async def test_two_connections_opening_a_new_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    opened: list[SqliteLedger] = []

    async def open_one() -> None:
        opened.append(await SqliteLedger.open(path, redactor=Redactor()))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(open_one)
            group.start_soon(open_one)
    await opened[0].record(make_invocation(), ["planned"])
    assert await opened[1].count() == 1
    for ledger in opened:
        await ledger.close()
    assert read_pragma(path, "user_version") == SCHEMA_VERSION


@pytest.mark.anyio
async def test_a_ledger_from_a_newer_bastion_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(ConfigError, match="upgrade Bastion") as refused:
        await SqliteLedger.open(path, redactor=Redactor())
    assert str(path) in refused.value.message


@pytest.mark.anyio
async def test_a_file_that_is_not_a_database_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConfigError) as refused:
        await SqliteLedger.open(path, redactor=Redactor())
    assert str(path) in refused.value.message


@pytest.mark.anyio
async def test_the_ledger_runs_in_wal_mode(ledger: SqliteLedger) -> None:
    assert read_pragma(ledger.path, "journal_mode") == "wal"


@pytest.mark.anyio
async def test_the_events_table_is_append_only(ledger: SqliteLedger) -> None:
    await ledger.record(make_invocation(), ["planned"])
    with sqlite3.connect(ledger.path) as db:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("UPDATE events SET kind = 'denied'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("DELETE FROM events")
    db.close()
    assert [event.kind for event in await ledger.events("inv-0001")] == ["planned"]
