"""The SQLite ledger on real files: round trips, transitions, decisions, expiry, races, change notification,
recovery, redaction at rest, migrations."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from bastion.errors import ApprovalExpired, ChangesLost, ConfigError, Conflict, NotFound
from bastion.ledger import OpenLedger, Redactor, open_ledger, sqlite_path
from bastion.ledger.sqlite.feed import KEPT
from bastion.ledger.sqlite.schema import SCHEMA_VERSION, migrate
from bastion.models import Invocation, Status
from bastion.pipeline.seams import Ledger

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
async def ledger(tmp_path: Path) -> AsyncIterator[OpenLedger]:
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as opened:
        yield opened


def read_pragma(path: Path, pragma: str) -> Any:
    with sqlite3.connect(path) as db:
        value = db.execute(f"PRAGMA {pragma}").fetchone()[0]
    db.close()
    return value


# -- round trips -------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_sqlite_ledger_satisfies_the_gateway_ledger_protocol(tmp_path: Path) -> None:
    ledger: Ledger = await open_ledger(tmp_path / "ledger.db", redactor=Redactor())
    assert await ledger.invocations.get("missing") is None
    assert isinstance(ledger, OpenLedger)
    await ledger.close()


@pytest.mark.anyio
async def test_record_then_get_round_trips_every_field(ledger: OpenLedger) -> None:
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
    await ledger.invocations.record(invocation, ["planned", "pending"])
    stored = await ledger.invocations.get(invocation.id)
    assert stored == invocation
    assert stored is not None
    assert stored.created_at.tzinfo is not None
    assert stored.created_at.utcoffset() == timedelta(0)


@pytest.mark.anyio
async def test_timestamps_come_back_as_the_same_instant_in_utc(ledger: OpenLedger) -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2026, 11, 21, 12, 0, 0, 123456, tzinfo=plus_two)
    await ledger.invocations.record(
        make_invocation(created_at=local, expires_at=datetime(2026, 11, 21, 10, 5)), ["planned"]
    )
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.created_at == local
    assert stored.created_at.tzinfo == UTC
    assert stored.expires_at == datetime(2026, 11, 21, 10, 5, tzinfo=UTC)  # naive means UTC


@pytest.mark.anyio
async def test_get_of_an_unknown_id_is_none(ledger: OpenLedger) -> None:
    assert await ledger.invocations.get("nope") is None
    assert await ledger.invocations.events("nope") == []


@pytest.mark.anyio
async def test_record_appends_its_events_in_order_with_one_timestamp(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(status="denied"), ["planned", "denied"], {"reason": "policy"})
    events = await ledger.invocations.events("inv-0001")
    assert [(event.seq, event.kind) for event in events] == [(1, "planned"), (2, "denied")]
    assert events[0].at == events[1].at
    assert [event.detail for event in events] == [{}, {"reason": "policy"}]


@pytest.mark.anyio
async def test_recording_the_same_id_twice_is_a_conflict(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(), ["planned"])
    with pytest.raises(Conflict):
        await ledger.invocations.record(make_invocation(status="approved"), ["planned", "approved"])
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.status == "pending"
    assert len(await ledger.invocations.events("inv-0001")) == 1


# -- transitions -------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_transition_sets_status_fields_and_appends_the_next_event(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(status="executing"), ["planned", "approved", "executing"])
    expiry = T0 + timedelta(hours=1)
    updated = await ledger.invocations.transition(
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
    assert await ledger.invocations.get("inv-0001") == updated
    events = await ledger.invocations.events("inv-0001")
    assert [(event.seq, event.kind, event.detail) for event in events][-1] == (4, "failed", {"attempt": 1})
    assert events[-1].at == updated.updated_at


@pytest.mark.anyio
async def test_transition_can_name_its_event_and_leaves_unset_fields_alone(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(status="unknown", error_class="timeout", owner="a"), ["planned"])
    updated = await ledger.invocations.transition(
        "inv-0001", from_statuses=["unknown"], to="completed", event="reconciled"
    )
    assert updated is not None
    assert (updated.status, updated.error_class, updated.owner) == ("completed", "timeout", "a")
    assert [event.kind for event in await ledger.invocations.events("inv-0001")] == ["planned", "reconciled"]


@pytest.mark.anyio
async def test_transition_from_a_wrong_status_returns_none_and_appends_nothing(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(), ["planned", "pending"])
    assert (
        await ledger.invocations.transition("inv-0001", from_statuses=["executing", "approved"], to="completed") is None
    )
    assert await ledger.invocations.transition("missing", from_statuses=["pending"], to="approved") is None
    assert await ledger.invocations.transition("inv-0001", from_statuses=[], to="approved") is None
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.status == "pending"
    assert len(await ledger.invocations.events("inv-0001")) == 2


@pytest.mark.anyio
async def test_finish_records_the_outcome_of_an_executing_invocation_once(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1, status="executing"), ["planned", "approved", "executing"])
    result = {"content": [{"type": "text", "text": f"token={CANARY}"}]}
    assert await ledger.invocations.finish(
        "inv-0001", "failed", result=result, error_class="upstream_error", error_message="no"
    )
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert (stored.status, stored.error_class, stored.error_message) == ("failed", "upstream_error", "no")
    assert CANARY not in json.dumps(stored.result)
    assert not await ledger.invocations.finish("inv-0001", "completed")  # no longer executing: nothing changes
    kinds = [event.kind for event in await ledger.invocations.events("inv-0001")]
    assert kinds == ["planned", "approved", "executing", "failed"]


@pytest.mark.anyio
async def test_transition_refuses_fields_it_does_not_own(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(), ["planned"])
    with pytest.raises(ValueError, match="status"):
        await ledger.invocations.transition(
            "inv-0001", from_statuses=["pending"], to="approved", fields={"status": "x"}
        )
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.status == "pending"


@pytest.mark.anyio
async def test_racing_decisions_from_two_connections_have_exactly_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with (
        await open_ledger(path, redactor=Redactor()) as first,
        await open_ledger(path, redactor=Redactor()) as second,
    ):
        for number in range(1, 21):
            await first.invocations.record(make_invocation(number), ["planned", "pending"])
        outcomes: dict[tuple[int, Status], Invocation | None] = {}

        async def decide(ledger: OpenLedger, number: int, to: Status) -> None:
            pending: tuple[Status, ...] = ("pending",)
            outcomes[number, to] = await ledger.invocations.transition(
                f"inv-{number:04d}", from_statuses=pending, to=to
            )

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
            stored = await second.invocations.get(f"inv-{number:04d}")
            assert stored is not None
            assert stored.status == winner.status
            kinds = [event.kind for event in await first.invocations.events(f"inv-{number:04d}")]
            assert kinds == ["planned", "pending", winner.status]


@pytest.mark.anyio
async def test_a_cancelled_write_is_all_or_nothing_and_leaves_the_ledger_usable(ledger: OpenLedger) -> None:
    with anyio.CancelScope() as scope:
        scope.cancel()
        await ledger.invocations.record(make_invocation(1), ["planned", "pending"])
    await ledger.invocations.record(make_invocation(2), ["planned"])
    first = await ledger.invocations.get("inv-0001")
    assert len(await ledger.invocations.events("inv-0001")) == (0 if first is None else 2)
    assert await ledger.invocations.get("inv-0002") is not None


# -- listing -----------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_list_filters_and_returns_newest_first(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned"])
    await ledger.invocations.record(make_invocation(2, source_id="github", session_id="session-b"), ["planned"])
    await ledger.invocations.record(make_invocation(3, status="denied"), ["planned", "denied"])
    await ledger.invocations.record(make_invocation(4, session_id="session-b"), ["planned"])
    # Same created_at as number 4: insertion order breaks the tie.
    await ledger.invocations.record(make_invocation(5, created_at=T0 + timedelta(seconds=4)), ["planned"])

    async def ids(**filters: Any) -> list[str]:
        return [invocation.id for invocation in await ledger.invocations.list(**filters)]

    assert await ids() == ["inv-0005", "inv-0004", "inv-0003", "inv-0002", "inv-0001"]
    assert await ids(status="pending") == ["inv-0005", "inv-0004", "inv-0002", "inv-0001"]
    assert await ids(status="denied") == ["inv-0003"]
    assert await ids(source_id="github") == ["inv-0002"]
    assert await ids(session_id="session-b") == ["inv-0004", "inv-0002"]
    assert await ids(status="pending", session_id="session-a", source_id="fs") == ["inv-0005", "inv-0001"]
    assert await ids(limit=2) == ["inv-0005", "inv-0004"]
    assert await ids(status="expired") == []
    with pytest.raises(ValueError, match="limit"):
        await ledger.invocations.list(limit=-1)
    assert await ledger.invocations.count() == 5
    assert await ledger.invocations.count("pending") == 4
    assert await ledger.invocations.count("completed") == 0


# -- redaction at rest -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_secrets_never_reach_the_database_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = await open_ledger(path, redactor=Redactor())
    invocation = make_invocation(
        args={"note": f"use {CANARY}", "api_key": "plain-secret-value", "list": [f"Bearer {CANARY}"]},
        error_message=f"failed with token={CANARY}",
    )
    await ledger.invocations.record(invocation, ["planned", "pending"], {"why": CANARY})
    await ledger.invocations.transition(
        invocation.id,
        from_statuses=["pending"],
        to="failed",
        detail={"header": f"Authorization: Bearer {CANARY}"},
        fields={"result": {"text": json.dumps({"secret": CANARY})}, "error_message": f"x {CANARY}"},
    )
    stored = await ledger.invocations.get(invocation.id)
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
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor(max_bytes=1024)) as ledger:
        await ledger.invocations.record(make_invocation(status="executing"), ["planned"])
        result = {"content": [{"type": "text", "text": "x" * 100_000}]}
        updated = await ledger.invocations.transition(
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
    ledger = await open_ledger(path, redactor=Redactor())
    assert sqlite_path(ledger.url) == path
    await ledger.close()
    await ledger.close()  # closing twice is harmless
    assert read_pragma(path, "user_version") == SCHEMA_VERSION


@pytest.mark.anyio
async def test_an_empty_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.touch()
    async with await open_ledger(path, redactor=Redactor()) as ledger:
        await ledger.invocations.record(make_invocation(), ["planned"])
    assert read_pragma(path, "user_version") == SCHEMA_VERSION
    async with await open_ledger(path, redactor=Redactor()) as reopened:
        assert await reopened.invocations.count() == 1


@pytest.mark.anyio
async def test_two_connections_opening_a_new_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    opened: list[OpenLedger] = []

    async def open_one() -> None:
        opened.append(await open_ledger(path, redactor=Redactor()))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(open_one)
            group.start_soon(open_one)
    await opened[0].invocations.record(make_invocation(), ["planned"])
    assert await opened[1].invocations.count() == 1
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
        await open_ledger(path, redactor=Redactor())
    assert str(path) in refused.value.message


@pytest.mark.anyio
async def test_a_file_that_is_not_a_database_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConfigError) as refused:
        await open_ledger(path, redactor=Redactor())
    assert str(path) in refused.value.message


@pytest.mark.anyio
async def test_the_ledger_runs_in_wal_mode(ledger: OpenLedger) -> None:
    assert read_pragma(sqlite_path(ledger.url), "journal_mode") == "wal"


@pytest.mark.anyio
async def test_the_events_table_is_append_only(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(), ["planned"])
    with sqlite3.connect(sqlite_path(ledger.url)) as db:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("UPDATE events SET kind = 'denied'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("DELETE FROM events")
    db.close()
    assert [event.kind for event in await ledger.invocations.events("inv-0001")] == ["planned"]


@pytest.mark.anyio
async def test_a_version_1_file_upgrades_to_version_2_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        await migrate(db, to_version=1)
        await db.execute(
            "INSERT INTO invocations (id, status, policy_key, tool, source_id, action_id, risk, mode, mode_source,"
            " session_id, args, args_hash, created_at, updated_at)"
            " VALUES ('old-1', 'completed', 'fs:read', 'fs__read', 'fs', 'read', 'read', 'allow', 'org',"
            " 'session-a', '{\"path\":\"/x\"}', ?, '2026-11-21T10:00:00.000000+00:00',"
            " '2026-11-21T10:00:01.000000+00:00')",
            ("0" * 64,),
        )
        await db.execute(
            "INSERT INTO events (invocation_id, seq, kind, at) VALUES ('old-1', 1, 'planned', ?)",
            ("2026-11-21T10:00:00.000000+00:00",),
        )
    finally:
        await db.close()
    assert read_pragma(path, "user_version") == 1

    async with await open_ledger(path, redactor=Redactor()) as ledger:
        old = await ledger.invocations.get("old-1")
        assert old is not None
        assert (old.status, old.args, old.drift) == ("completed", {"path": "/x"}, None)
        assert [event.kind for event in await ledger.invocations.events("old-1")] == ["planned"]
        await ledger.invocations.record(make_invocation(drift=["- old", "+ new"]), ["planned", "pending"])
        assert await ledger.invocations.count() == 2
    assert read_pragma(path, "user_version") == SCHEMA_VERSION


@pytest.mark.anyio
async def test_a_version_3_file_upgrades_its_events_to_one_history_keeping_them(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with aiosqlite.connect(path, isolation_level=None) as old:
        await migrate(old, to_version=3)
    with sqlite3.connect(path, isolation_level=None) as db:
        db.executemany(
            "INSERT INTO invocations (id, status, policy_key, tool, source_id, action_id, risk, mode, mode_source,"
            " session_id, args_hash, created_at, updated_at) VALUES (?, ?, 'fs:read', 'fs__read',"
            " 'fs', 'read', 'read', 'allow', 'org', 'session-a', ?, '2026-11-21T10:00:00.000000+00:00',"
            " '2026-11-21T10:00:01.000000+00:00')",
            [("old-1", "completed", "a" * 64), ("old-2", "pending", "b" * 64)],
        )
        db.executemany(
            "INSERT INTO events (invocation_id, seq, kind, at, detail) VALUES (?, ?, ?, ?, ?)",
            [
                ("old-1", 1, "planned", "2026-11-21T10:00:00.000000+00:00", "{}"),
                ("old-2", 1, "pending", "2026-11-21T10:00:00.500000+00:00", "{}"),
                ("old-1", 2, "completed", "2026-11-21T10:00:01.000000+00:00", '{"n":1}'),
            ],
        )
    db.close()

    async with await open_ledger(path, redactor=Redactor()) as ledger:
        kept = await ledger.invocations.events("old-1")
        assert [(e.seq, e.kind, e.detail) for e in kept] == [(1, "planned", {}), (2, "completed", {"n": 1})]
        history = await ledger.changes.since(0)
        assert [(c.invocation_id, c.kind) for c in history] == [
            ("old-1", "planned"),
            ("old-2", "pending"),
            ("old-1", "completed"),
        ]
        await ledger.invocations.record(make_invocation(1), ["planned", "pending"])
        assert [event.kind for event in await ledger.invocations.events("inv-0001")] == ["planned", "pending"]
        assert (await ledger.changes.since(history[-1].id))[0].invocation_id == "inv-0001"
    assert read_pragma(path, "user_version") == SCHEMA_VERSION
    with sqlite3.connect(path) as db:
        hashes = dict(db.execute("SELECT id, args_hash FROM invocations WHERE id LIKE 'old-%'").fetchall())
        triggers = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute("DELETE FROM events WHERE invocation_id = 'old-1'")
    db.close()
    assert hashes == {"old-1": "", "old-2": "b" * 64}, "unkeyed hashes are dropped but where an approval needs one"
    assert triggers == {"events_no_update", "events_no_delete"}


@pytest.mark.anyio
async def test_migrating_to_a_version_this_bastion_does_not_know_is_refused(tmp_path: Path) -> None:
    db = await aiosqlite.connect(tmp_path / "ledger.db", isolation_level=None)
    try:
        with pytest.raises(ValueError, match="to_version"):
            await migrate(db, to_version=SCHEMA_VERSION + 1)
    finally:
        await db.close()


@pytest.mark.anyio
async def test_the_drift_diff_round_trips_through_record_get_and_list(ledger: OpenLedger) -> None:
    diff = ['-  "description": "Write a file"', '+  "description": "Write a file, then mail it to ü@x"']
    await ledger.invocations.record(make_invocation(1, drift=diff), ["planned", "pending"])
    await ledger.invocations.record(make_invocation(2), ["planned", "pending"])
    await ledger.invocations.record(make_invocation(3, drift=[]), ["planned", "pending"])
    first = await ledger.invocations.get("inv-0001")
    assert first is not None
    assert first.drift == diff
    assert [invocation.drift for invocation in await ledger.invocations.list()] == [[], None, diff]


@pytest.mark.anyio
async def test_count_filters_by_status_and_session(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned", "pending"])
    await ledger.invocations.record(make_invocation(2, session_id="session-b"), ["planned", "pending"])
    await ledger.invocations.record(make_invocation(3, status="denied"), ["planned", "denied"])
    await ledger.invocations.record(make_invocation(4, status="denied", session_id="session-b"), ["planned", "denied"])
    await ledger.invocations.record(make_invocation(5, session_id="session-b"), ["planned", "pending"])
    assert await ledger.invocations.count() == 5
    assert await ledger.invocations.count("pending") == 3
    assert await ledger.invocations.count(session_id="session-b") == 3
    assert await ledger.invocations.count("pending", session_id="session-b") == 2
    assert await ledger.invocations.count("denied", session_id="session-a") == 1
    assert await ledger.invocations.count(session_id="nobody") == 0


# -- decisions and expiry ----------------------------------------------------------------------------------

EXPIRY = T0 + timedelta(minutes=5)
BEFORE_EXPIRY = T0 + timedelta(minutes=1)


async def record_pending(ledger: OpenLedger, number: int = 1, **overrides: Any) -> str:
    invocation = make_invocation(number, **({"expires_at": EXPIRY} | overrides))
    await ledger.invocations.record(invocation, ["planned", "pending"])
    return invocation.id


@pytest.mark.anyio
async def test_approving_a_pending_invocation_records_who_and_why(ledger: OpenLedger) -> None:
    invocation_id = await record_pending(ledger)
    approved = await ledger.invocations.decide(
        invocation_id, approve=True, principal="alice", note="looks fine", now=BEFORE_EXPIRY
    )
    assert (approved.status, approved.error_class, approved.updated_at) == ("approved", None, BEFORE_EXPIRY)
    assert await ledger.invocations.get(invocation_id) == approved
    events = await ledger.invocations.events(invocation_id)
    assert [(event.kind, event.detail) for event in events][-1] == ("approved", {"by": "alice", "note": "looks fine"})
    assert events[-1].at == BEFORE_EXPIRY


@pytest.mark.anyio
async def test_denying_records_the_reason_as_an_approval_denied_error(ledger: OpenLedger) -> None:
    with_reason = await record_pending(ledger, 1)
    without_reason = await record_pending(ledger, 2)
    denied = await ledger.invocations.decide(
        with_reason, approve=False, principal="bob", note="wrong file", now=BEFORE_EXPIRY
    )
    assert (denied.status, denied.error_class) == ("denied", "approval_denied")
    assert denied.error_message is not None
    assert "bob" in denied.error_message
    assert "wrong file" in denied.error_message
    last = (await ledger.invocations.events(with_reason))[-1]
    assert (last.kind, last.detail) == ("denied", {"by": "bob", "reason": "wrong file"})

    anonymous = await ledger.invocations.decide(
        without_reason, approve=False, principal=None, note=None, now=BEFORE_EXPIRY
    )
    assert (anonymous.status, anonymous.error_class) == ("denied", "approval_denied")
    assert anonymous.error_message is not None
    assert ":" not in anonymous.error_message


@pytest.mark.anyio
async def test_an_invocation_without_expiry_can_be_decided_at_any_time(ledger: OpenLedger) -> None:
    invocation_id = await record_pending(ledger, expires_at=None)
    later = T0 + timedelta(days=365)
    decided = await ledger.invocations.decide(invocation_id, approve=True, principal="alice", note=None, now=later)
    assert decided.status == "approved"


@pytest.mark.anyio
async def test_deciding_an_unknown_invocation_is_not_found(ledger: OpenLedger) -> None:
    with pytest.raises(NotFound) as missing:
        await ledger.invocations.decide("nope", approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    assert missing.value.invocation_id == "nope"


@pytest.mark.anyio
async def test_deciding_twice_is_a_conflict_that_names_the_current_status(ledger: OpenLedger) -> None:
    invocation_id = await record_pending(ledger)
    await ledger.invocations.decide(invocation_id, approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    for approve in (True, False):
        with pytest.raises(Conflict, match="approved") as conflict:
            await ledger.invocations.decide(
                invocation_id, approve=approve, principal="bob", note=None, now=BEFORE_EXPIRY
            )
        assert conflict.value.invocation_id == invocation_id
    stored = await ledger.invocations.get(invocation_id)
    assert stored is not None
    assert stored.status == "approved"
    assert [event.kind for event in await ledger.invocations.events(invocation_id)] == [
        "planned",
        "pending",
        "approved",
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("now", [EXPIRY, EXPIRY + timedelta(seconds=1)])
async def test_deciding_at_or_after_expiry_marks_it_expired_and_raises(ledger: OpenLedger, now: datetime) -> None:
    invocation_id = await record_pending(ledger)
    with pytest.raises(ApprovalExpired) as expired:
        await ledger.invocations.decide(invocation_id, approve=True, principal="alice", note=None, now=now)
    assert expired.value.invocation_id == invocation_id
    stored = await ledger.invocations.get(invocation_id)
    assert stored is not None
    assert (stored.status, stored.error_class, stored.updated_at) == ("expired", "approval_expired", now)
    assert [event.kind for event in await ledger.invocations.events(invocation_id)] == ["planned", "pending", "expired"]
    with pytest.raises(Conflict, match="expired"):
        await ledger.invocations.decide(invocation_id, approve=False, principal="alice", note=None, now=BEFORE_EXPIRY)


@pytest.mark.anyio
async def test_two_ledgers_deciding_at_once_have_exactly_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with (
        await open_ledger(path, redactor=Redactor()) as first,
        await open_ledger(path, redactor=Redactor()) as second,
    ):
        ids = [await record_pending(first, number) for number in range(1, 11)]
        outcomes: dict[tuple[str, bool], Invocation | Conflict] = {}

        async def decide(ledger: OpenLedger, invocation_id: str, approve: bool) -> None:
            try:
                outcomes[invocation_id, approve] = await ledger.invocations.decide(
                    invocation_id, approve=approve, principal="x", note=None, now=BEFORE_EXPIRY
                )
            except Conflict as conflict:
                outcomes[invocation_id, approve] = conflict

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for invocation_id in ids:
                    group.start_soon(decide, first, invocation_id, True)
                    group.start_soon(decide, second, invocation_id, False)

        for invocation_id in ids:
            results = [outcomes[invocation_id, True], outcomes[invocation_id, False]]
            winners = [result for result in results if isinstance(result, Invocation)]
            losers = [result for result in results if isinstance(result, Conflict)]
            assert (len(winners), len(losers)) == (1, 1)
            assert losers[0].invocation_id == invocation_id
            kinds = [event.kind for event in await second.invocations.events(invocation_id)]
            assert kinds == ["planned", "pending", winners[0].status]


@pytest.mark.anyio
async def test_expire_due_expires_only_pending_invocations_past_their_expiry(ledger: OpenLedger) -> None:
    now = T0 + timedelta(minutes=10)
    await record_pending(ledger, 1, expires_at=now)
    await record_pending(ledger, 2, expires_at=now - timedelta(minutes=1))
    await record_pending(ledger, 3, expires_at=now + timedelta(microseconds=1))
    await record_pending(ledger, 4, expires_at=None)
    await ledger.invocations.record(make_invocation(5, status="approved", expires_at=T0), ["planned", "approved"])

    expired = await ledger.invocations.expire_due(now)
    assert [invocation.id for invocation in expired] == ["inv-0002", "inv-0001"]
    for invocation in expired:
        assert (invocation.status, invocation.error_class, invocation.updated_at) == (
            "expired",
            "approval_expired",
            now,
        )
        assert invocation.error_message is not None
        assert [event.kind for event in await ledger.invocations.events(invocation.id)] == [
            "planned",
            "pending",
            "expired",
        ]
    statuses = {invocation.id: invocation.status for invocation in await ledger.invocations.list()}
    assert statuses == {
        "inv-0001": "expired",
        "inv-0002": "expired",
        "inv-0003": "pending",
        "inv-0004": "pending",
        "inv-0005": "approved",
    }
    assert await ledger.invocations.expire_due(now) == []


@pytest.mark.anyio
async def test_next_expiry_is_the_earliest_expiry_of_a_pending_invocation(ledger: OpenLedger) -> None:
    assert await ledger.invocations.next_expiry() is None
    await record_pending(ledger, 1, expires_at=None)
    assert await ledger.invocations.next_expiry() is None
    await ledger.invocations.record(make_invocation(2, status="approved", expires_at=T0), ["planned", "approved"])
    await record_pending(ledger, 3, expires_at=EXPIRY)
    await record_pending(ledger, 4, expires_at=EXPIRY - timedelta(seconds=30))
    assert await ledger.invocations.next_expiry() == EXPIRY - timedelta(seconds=30)
    await ledger.invocations.decide("inv-0004", approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    assert await ledger.invocations.next_expiry() == EXPIRY


# -- the change feed ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_feed_announces_every_event_in_id_order_with_its_invocation_and_status(ledger: OpenLedger) -> None:
    start = ledger.changes.cursor
    await ledger.invocations.record(make_invocation(1), ["planned", "pending"])
    await ledger.invocations.decide("inv-0001", approve=True, principal="a", note=None, now=T0)
    changes = await ledger.changes.next(start)
    assert [(c.invocation_id, c.kind, c.status) for c in changes] == [
        ("inv-0001", "planned", None),
        ("inv-0001", "pending", "pending"),
        ("inv-0001", "approved", "approved"),
    ]
    assert [c.id for c in changes] == sorted(c.id for c in changes)
    assert ledger.changes.cursor == changes[-1].id
    assert await ledger.changes.since(start) == list(changes)
    assert await ledger.changes.since(changes[0].id, limit=1) == [changes[1]]


@pytest.mark.anyio
async def test_every_waiter_wakes_when_the_same_ledger_commits(ledger: OpenLedger) -> None:
    woken: list[int] = []
    cursor = ledger.changes.cursor

    async def wait(number: int) -> None:
        await ledger.changes.next(cursor)
        woken.append(number)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(wait, 1)
            group.start_soon(wait, 2)
            await anyio.wait_all_tasks_blocked()
            await ledger.invocations.record(make_invocation(), ["planned", "pending"])
    assert sorted(woken) == [1, 2]


@pytest.mark.anyio
async def test_a_commit_between_reading_and_waiting_is_not_missed(ledger: OpenLedger) -> None:
    cursor = ledger.changes.cursor  # taken before reading what we wait on
    await ledger.invocations.record(make_invocation(), ["planned", "pending"])  # lands before we start waiting
    with anyio.fail_after(10):
        changes = await ledger.changes.next(cursor)
    assert {c.invocation_id for c in changes} == {"inv-0001"}


@pytest.mark.anyio
async def test_a_write_that_changes_nothing_is_no_news(ledger: OpenLedger) -> None:
    cursor = ledger.changes.cursor
    assert await ledger.invocations.expire_due(T0) == []
    assert ledger.changes.cursor == cursor
    await ledger.invocations.record(make_invocation(expires_at=T0), ["planned", "pending"])
    assert len(await ledger.invocations.expire_due(T0)) == 1
    assert [c.kind for c in await ledger.changes.next(cursor)] == ["planned", "pending", "expired"]


@pytest.mark.anyio
async def test_a_waiter_that_fell_too_far_behind_is_told_to_re_read(ledger: OpenLedger) -> None:
    cursor = ledger.changes.cursor
    for number in range(1, KEPT // 2 + 2):
        await ledger.invocations.record(make_invocation(number), ["planned", "pending"])
    with pytest.raises(ChangesLost):
        await ledger.changes.next(cursor)
    assert len(await ledger.changes.since(cursor, limit=KEPT + 10)) == 2 * (KEPT // 2 + 1)


@pytest.mark.anyio
async def test_a_waiter_wakes_when_another_connection_commits_while_the_feed_runs(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with (
        await open_ledger(path, redactor=Redactor()) as ledger,
        await open_ledger(path, redactor=Redactor()) as other,
    ):
        invocation_id = await record_pending(ledger)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                await group.start(ledger.changes.run)
                cursor = ledger.changes.cursor
                group.start_soon(
                    partial(other.invocations.decide, invocation_id, approve=True, principal="a", note=None, now=T0)
                )
                changes = await ledger.changes.next(cursor)
                group.cancel_scope.cancel()
        assert [(c.invocation_id, c.status) for c in changes] == [(invocation_id, "approved")]


DECIDE_IN_ANOTHER_PROCESS = """
import sys
from datetime import UTC, datetime
from pathlib import Path

import anyio

from bastion.ledger import Redactor, open_ledger


async def main() -> None:
    async with await open_ledger(Path(sys.argv[1]), redactor=Redactor()) as ledger:
        await ledger.invocations.decide(sys.argv[2], approve=True, principal="cli", note=None, now=datetime.now(UTC))


anyio.run(main)
"""


@pytest.mark.anyio
async def test_a_waiter_wakes_when_another_process_decides(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with await open_ledger(path, redactor=Redactor()) as ledger:
        invocation_id = await record_pending(ledger, expires_at=None)
        command = [sys.executable, "-c", DECIDE_IN_ANOTHER_PROCESS, str(path), invocation_id]
        with anyio.fail_after(60):
            async with anyio.create_task_group() as processes, anyio.create_task_group() as watching:
                await watching.start(ledger.changes.run)
                cursor = ledger.changes.cursor
                processes.start_soon(anyio.run_process, command)
                changes = await ledger.changes.next(cursor)
                watching.cancel_scope.cancel()
        assert [(c.invocation_id, c.status) for c in changes] == [(invocation_id, "approved")]


# -- recovery after a restart ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_recover_marks_work_of_stopped_processes_unknown_and_reports_what_never_started(
    ledger: OpenLedger,
) -> None:
    rows: list[tuple[Status, str | None]] = [
        ("executing", "gone"),
        ("executing", "alive"),
        ("executing", None),
        ("approved", "gone"),
        ("approved", "alive"),
        ("approved", None),
        ("pending", "gone"),
        ("pending", "alive"),
        ("completed", "gone"),
    ]
    for number, (status, owner) in enumerate(rows, start=1):
        await ledger.invocations.record(make_invocation(number, status=status, owner=owner), ["planned", status])
    asked: list[str] = []

    def instance_alive(owner: str) -> bool:
        asked.append(owner)
        return owner == "alive"

    report = await ledger.invocations.recover(instance_alive)
    assert sorted(asked) == ["alive", "gone"]
    assert report.unknown == ["inv-0001", "inv-0003"]
    assert report.approved == ["inv-0004", "inv-0006"]
    assert report.pending == 2
    for invocation_id in report.unknown:
        stored = await ledger.invocations.get(invocation_id)
        assert stored is not None
        assert (stored.status, stored.error_class) == ("unknown", "unknown_outcome")
        last = (await ledger.invocations.events(invocation_id))[-1]
        assert last.kind == "unknown"
        assert set(last.detail) == {"reason"}
    kept = [status for status, _ in rows]
    kept[0] = kept[2] = "unknown"
    assert [invocation.status for invocation in reversed(await ledger.invocations.list())] == kept
    assert (await ledger.invocations.recover(instance_alive)).unknown == []


@pytest.mark.anyio
async def test_exactly_one_of_two_claimers_gets_an_approved_invocation(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with (
        await open_ledger(path, redactor=Redactor()) as first,
        await open_ledger(path, redactor=Redactor()) as second,
    ):
        await first.invocations.record(make_invocation(1, status="approved", owner="gone"), ["planned", "approved"])
        await first.invocations.record(make_invocation(2), ["planned", "pending"])
        claims: dict[str, Invocation | None] = {}

        async def claim(ledger: OpenLedger, owner: str) -> None:
            claims[owner] = await ledger.invocations.claim("inv-0001", owner=owner)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(claim, first, "one")
                group.start_soon(claim, second, "two")

        winners = [(owner, won) for owner, won in claims.items() if won is not None]
        assert len(winners) == 1
        owner, won = winners[0]
        assert (won.status, won.owner) == ("executing", owner)
        assert [event.kind for event in await first.invocations.events("inv-0001")] == [
            "planned",
            "approved",
            "executing",
        ]
        assert await first.invocations.claim("inv-0002", owner="one") is None
        assert await first.invocations.claim("missing", owner="one") is None


# -- writes on the event loop ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_write_waits_off_the_loop_while_another_connection_holds_the_lock(ledger: OpenLedger) -> None:
    """The writer never waits on the event loop: when another connection holds the write lock, writes queue in
    a worker thread (the loop keeps serving reads) and commit, in order, once the lock is released."""
    holder = sqlite3.connect(sqlite_path(ledger.url), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(partial(ledger.invocations.record, make_invocation(1), ["planned"]))
                group.start_soon(partial(ledger.invocations.record, make_invocation(2), ["planned", "pending"]))
                await anyio.wait_all_tasks_blocked()
                assert await ledger.invocations.get("inv-0001") is None
                assert await ledger.invocations.count() == 0
                holder.execute("COMMIT")
    finally:
        holder.close()
    assert [event.kind for event in await ledger.invocations.events("inv-0001")] == ["planned"]
    assert [event.kind for event in await ledger.invocations.events("inv-0002")] == ["planned", "pending"]
    await ledger.invocations.record(make_invocation(3), ["planned"])  # back on the loop, and still without waiting
    assert await ledger.invocations.count() == 3


@pytest.mark.anyio
async def test_a_write_that_fails_inside_its_transaction_rolls_back_and_keeps_the_writer_usable(
    ledger: OpenLedger,
) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned"])
    with pytest.raises(Conflict):
        await ledger.invocations.record(make_invocation(1), ["planned"])
    await ledger.invocations.record(make_invocation(2), ["planned"])
    assert await ledger.invocations.count() == 2
    assert len(await ledger.invocations.events("inv-0001")) == 1


@pytest.mark.anyio
async def test_writes_leave_checkpoints_to_watch(ledger: OpenLedger) -> None:
    """Commits on the loop only append to the WAL; `watch` copies them into the database file (the fsyncs)
    once enough have piled up, on aiosqlite's thread."""
    database = sqlite_path(ledger.url)
    await ledger.backend.database.checkpoint()
    size_before = database.stat().st_size
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            await group.start(partial(ledger.changes.run, interval=3600))
            for number in range(1, 101):
                await ledger.invocations.record(make_invocation(number, args={"blob": "x" * 2000}), ["planned"])
            assert database.stat().st_size == size_before  # nothing checkpointed on the loop
            for number in range(101, 201):
                await ledger.invocations.record(make_invocation(number, args={"blob": "x" * 2000}), ["planned"])
            # The 200th commit woke `watch`, which queued the checkpoint on aiosqlite's thread; this read
            # queues behind it.
            await anyio.wait_all_tasks_blocked()
            assert await ledger.invocations.count() == 200
            group.cancel_scope.cancel()
    assert database.stat().st_size > size_before + 200 * 2000


WRITE_IN_ANOTHER_PROCESS = """
import sys
from datetime import UTC, datetime

import anyio

from bastion.ledger import OpenLedger, Redactor, open_ledger, sqlite_path
from bastion.models import Invocation


async def main() -> None:
    now = datetime.now(UTC)
    async with await open_ledger(__import__("pathlib").Path(sys.argv[1]), redactor=Redactor()) as ledger:
        print("ready", flush=True)
        sys.stdin.readline()  # "go": both processes write from here on
        for number in range(int(sys.argv[2])):
            invocation = Invocation(
                id=f"other-{number:04d}", status="executing", policy_key="fs:read", tool="fs__read",
                source_id="fs", action_id="read", risk="read", mode="allow", mode_source="inferred",
                session_id="other", args={}, args_hash="0" * 64, created_at=now, updated_at=now,
            )
            await ledger.invocations.record(invocation, ["planned", "approved", "executing"])
            await ledger.invocations.finish(invocation.id, "completed", result={"n": number})


anyio.run(main)
"""


@pytest.mark.anyio
async def test_two_processes_writing_at_once_lose_nothing(ledger: OpenLedger) -> None:
    """Each process writes on its event loop while the lock is free and waits in a worker thread while
    the other holds it: every write of both lands, none fails with `database is locked`."""
    writes = 500
    command = [sys.executable, "-c", WRITE_IN_ANOTHER_PROCESS, str(sqlite_path(ledger.url)), str(writes)]
    with anyio.fail_after(120):
        async with await anyio.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as other:
            assert other.stdin is not None and other.stdout is not None
            assert (await BufferedByteReceiveStream(other.stdout).receive_until(b"\n", 100)) == b"ready"
            await other.stdin.send(b"go\n")
            for number in range(1, writes + 1):
                await ledger.invocations.record(
                    make_invocation(number, status="executing"), ["planned", "approved", "executing"]
                )
                assert await ledger.invocations.finish(f"inv-{number:04d}", "completed", result={"n": number})
            assert await other.wait() == 0
    assert await ledger.invocations.count("completed") == 2 * writes
    assert len(await ledger.invocations.events("other-0499")) == len(await ledger.invocations.events("inv-0500")) == 4
