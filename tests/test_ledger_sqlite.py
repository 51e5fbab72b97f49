"""What only the SQLite ledger has: one file (and its WAL) on disk, its pragmas, migrations and append-only
triggers, the key file beside it, writes that never wait on the event loop, checkpoints, and several processes
sharing the file. Everything every backend must do is in the ledger contract (tests/ledger_contract/)."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import anyio.lowlevel
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from bastion.errors import ConfigError
from bastion.ledger import OpenLedger, Redactor, key_path_for, open_ledger, sqlite_path
from bastion.ledger.keys import load_or_create_key
from bastion.ledger.sqlite import SqliteBackend
from bastion.ledger.sqlite import tokens as token_table
from bastion.ledger.sqlite.feed import SqliteFeed
from bastion.ledger.sqlite.limits import forget_counts
from bastion.ledger.sqlite.schema import SCHEMA_VERSION, migrate
from bastion.models import Pin, Principal
from bastion.policies import canonical_json
from tests.ledger_contract.samples import CANARY, T0, add_pending, make_invocation, observation
from tests.old_ledgers import OLD_ROW, sqlite_ledger_at


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[OpenLedger]:
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as opened:
        yield opened


def read_pragma(path: Path, pragma: str) -> Any:
    with sqlite3.connect(path) as db:
        value = db.execute(f"PRAGMA {pragma}").fetchone()[0]
    db.close()
    return value


def ledger_bytes(ledger: OpenLedger) -> bytes:
    """Everything on disk for the ledger: the file, its WAL and its shared-memory index."""
    database = sqlite_path(ledger.url)
    return b"".join(file.read_bytes() for file in database.parent.iterdir() if file.name.startswith(database.name))


# -- what is on disk --------------------------------------------------------------------------------------------


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
        to="denied",
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
async def test_tool_definitions_are_stored_verbatim_on_disk(ledger: OpenLedger) -> None:
    """Pins hold what an upstream published, not secrets: a credential-shaped default stays as it is."""
    definition = {"inputSchema": {"type": "object", "properties": {"token": {"type": "string", "default": CANARY}}}}
    await ledger.pins.save_pin(Pin(source_id="fs", action_id="write_file", pinned=observation(1, **definition)))
    assert CANARY.encode() in ledger_bytes(ledger)


@pytest.mark.anyio
async def test_a_token_secret_is_stored_only_as_its_hash(ledger: OpenLedger) -> None:
    secret = await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)

    stored = ledger_bytes(ledger)
    assert secret.encode() not in stored
    assert secret.removeprefix("bst_").encode() not in stored
    assert hashlib.sha256(secret.encode()).hexdigest().encode() in stored


@pytest.mark.anyio
async def test_authenticate_is_one_lookup_on_the_secret_hash_index(ledger: OpenLedger) -> None:
    db = await aiosqlite.connect(sqlite_path(ledger.url))
    try:
        plan = list(await db.execute_fetchall("EXPLAIN QUERY PLAN " + token_table.AUTHENTICATE, ("0" * 64,)))
    finally:
        await db.close()
    assert len(plan) == 1
    assert "USING INDEX tokens_secret_hash" in plan[0][3]


# -- the file and its migrations --------------------------------------------------------------------------------


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


_OLD_ROW_WITH_ARGS = OLD_ROW.format(extra=", args", values=', \'{"path":"/x"}\'')


@pytest.mark.anyio
async def test_a_version_1_file_upgrades_to_version_2_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 1) as db:
        db.execute(_OLD_ROW_WITH_ARGS)
        db.execute(
            "INSERT INTO events (invocation_id, seq, kind, at) VALUES ('old-1', 1, 'planned', ?)",
            ("2026-11-21T10:00:00.000000+00:00",),
        )
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
async def test_a_version_2_file_upgrades_keeping_its_rows_and_gains_tokens(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 2) as db:
        db.execute(_OLD_ROW_WITH_ARGS)
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "tokens" not in tables

    async with await open_ledger(path, redactor=Redactor()) as ledger:
        old = await ledger.invocations.get("old-1")
        assert old is not None
        assert (old.status, old.args) == ("completed", {"path": "/x"})
        assert not await ledger.tokens.has_tokens()
        secret = await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)
        assert await ledger.tokens.authenticate(secret) == Principal(name="ci-agent", role="agent")

    assert read_pragma(path, "user_version") == SCHEMA_VERSION


@pytest.mark.anyio
async def test_a_version_3_file_upgrades_its_events_to_one_history_keeping_them(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with sqlite_ledger_at(path, 3) as db:
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
    assert triggers == {"events_no_update", "events_no_delete", "record_events_no_update", "record_events_no_delete"}


@pytest.mark.anyio
async def test_migrating_to_a_version_this_bastion_does_not_know_is_refused(tmp_path: Path) -> None:
    db = await aiosqlite.connect(tmp_path / "ledger.db", isolation_level=None)
    try:
        with pytest.raises(ValueError, match="to_version"):
            await migrate(db, to_version=SCHEMA_VERSION + 1)
    finally:
        await db.close()


# -- the key of the argument hashes -----------------------------------------------------------------------------
ARGUMENTS = {"path": "/etc/hosts", "password": "123456"}


@pytest.mark.anyio
async def test_the_key_is_created_beside_the_file_for_its_owner_only_and_reused_on_reopen(tmp_path: Path) -> None:
    database = tmp_path / "state" / "ledger.db"
    async with await open_ledger(database, redactor=Redactor()) as ledger:
        hashed = ledger.invocations.hash_args(ARGUMENTS)
        await ledger.invocations.record(make_invocation(args=ARGUMENTS, args_hash=hashed), ["planned", "pending"])
        on_disk = ledger_bytes(ledger)
    key = key_path_for(database)
    assert key == tmp_path / "state" / "ledger.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    text = key.read_text(encoding="ascii")
    assert len(bytes.fromhex(text.strip())) == 32
    assert text.strip().encode() not in on_disk, "the key is never in the database"
    assert hashlib.sha256(canonical_json(ARGUMENTS)).hexdigest().encode() not in on_disk

    async with await open_ledger(f"sqlite:///{database}", redactor=Redactor()) as reopened:
        assert reopened.invocations.hash_args(ARGUMENTS) == hashed
        stored = await reopened.invocations.get("inv-0001")
        assert stored is not None
        assert reopened.invocations.args_match(ARGUMENTS, stored.args_hash)
    assert key.read_text(encoding="ascii") == text


@pytest.mark.anyio
@pytest.mark.parametrize("content", ["", "not hex at all", "ab" * 31, "ab" * 33, "zz" * 32])
async def test_a_corrupt_key_file_is_a_config_error_naming_the_fix_and_is_left_alone(
    tmp_path: Path, content: str
) -> None:
    database = tmp_path / "ledger.db"
    key = key_path_for(database)
    key.write_text(content, encoding="ascii")
    with pytest.raises(ConfigError) as refused:
        await open_ledger(database, redactor=Redactor())
    assert str(key) in refused.value.message
    assert "delete it" in refused.value.message
    assert key.read_text(encoding="ascii") == content
    assert not database.exists()


@pytest.mark.anyio
async def test_a_key_that_cannot_be_read_is_a_config_error(tmp_path: Path) -> None:
    database = tmp_path / "ledger.db"
    key_path_for(database).mkdir()
    with pytest.raises(ConfigError) as refused:
        await open_ledger(database, redactor=Redactor())
    assert str(key_path_for(database)) in refused.value.message


@pytest.mark.anyio
async def test_a_key_readable_by_others_works_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    database = tmp_path / "ledger.db"
    async with await open_ledger(database, redactor=Redactor()) as ledger:
        hashed = ledger.invocations.hash_args(ARGUMENTS)
    key_path_for(database).chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="bastion.ledger.keys"):
        async with await open_ledger(database, redactor=Redactor()) as reopened:
            assert reopened.invocations.hash_args(ARGUMENTS) == hashed
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert str(key_path_for(database)) in caplog.records[0].getMessage()


@pytest.mark.anyio
async def test_openers_creating_the_key_at_once_agree_on_one(tmp_path: Path) -> None:
    """Several threads (as several processes would) find no key and create one at once: all end up with the one
    that landed first, and no draft is left behind."""
    key = key_path_for(tmp_path / "ledger.db")
    found: list[bytes] = []

    async def load() -> None:
        found.append(await anyio.to_thread.run_sync(load_or_create_key, key))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for _ in range(8):
                group.start_soon(load)
    assert len(set(found)) == 1
    assert found[0] == bytes.fromhex(key.read_text(encoding="ascii"))
    assert [file.name for file in tmp_path.iterdir()] == ["ledger.key"]


# -- several processes ------------------------------------------------------------------------------------------


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
        invocation_id = await add_pending(ledger, expires_at=None)
        command = [sys.executable, "-c", DECIDE_IN_ANOTHER_PROCESS, str(path), invocation_id]
        with anyio.fail_after(60):
            async with anyio.create_task_group() as processes, anyio.create_task_group() as watching:
                await watching.start(ledger.changes.run)
                cursor = ledger.changes.cursor
                processes.start_soon(anyio.run_process, command)
                changes = await ledger.changes.next(cursor)
                watching.cancel_scope.cancel()
        assert [(c.invocation_id, c.status) for c in changes] == [(invocation_id, "approved")]


# -- writes on the event loop -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_write_waits_off_the_loop_while_another_connection_holds_the_lock(ledger: OpenLedger) -> None:
    """The writer never waits on the event loop: when another connection holds the write lock, writes queue in
    a worker thread (the loop keeps serving reads) and commit, in order, once the lock is released."""
    cursor = ledger.changes.cursor
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
    with anyio.fail_after(10):  # every one of them announced by the change feed
        changes = await ledger.changes.next(cursor)
    assert {change.invocation_id for change in changes} == {"inv-0001", "inv-0002", "inv-0003"}


@pytest.mark.anyio
async def test_a_write_queued_behind_a_waiting_worker_runs_on_the_loop_once_the_writer_is_free(
    ledger: OpenLedger,
) -> None:
    """Only a write that meets another connection's lock waits in a worker thread: one queued behind it runs on the
    event loop once the writer is its own, so one busy moment does not send a busy server's writes to threads."""
    assert isinstance(ledger.backend, SqliteBackend)
    database = ledger.backend.database
    ran_on: dict[str, int] = {}

    def noting(name: str) -> Callable[[sqlite3.Connection], None]:
        def work(conn: sqlite3.Connection) -> None:
            ran_on[name] = threading.get_ident()

        return work

    holder = sqlite3.connect(sqlite_path(ledger.url), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(database.write, noting("met the lock"))
                await anyio.wait_all_tasks_blocked()  # waiting in a worker for the lock
                group.start_soon(database.write, noting("queued behind it"))
                await anyio.wait_all_tasks_blocked()  # waiting for the writer
                holder.execute("COMMIT")
    finally:
        holder.close()
    assert ran_on["met the lock"] != threading.get_ident()
    assert ran_on["queued behind it"] == threading.get_ident()


@pytest.mark.anyio
async def test_writes_leave_checkpoints_to_watch(ledger: OpenLedger) -> None:
    """Commits on the loop only append to the WAL; `watch` copies them into the database file (the fsyncs)
    once enough have piled up, on aiosqlite's thread."""
    database = sqlite_path(ledger.url)
    assert isinstance(ledger.backend, SqliteBackend) and isinstance(ledger.changes, SqliteFeed)
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


@pytest.mark.anyio
async def test_rate_counts_of_keys_that_stopped_coming_back_are_forgotten(tmp_path: Path) -> None:
    """The feed's upkeep deletes counts older than the window (a key admitted once never deletes its own)."""
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
        assert isinstance(ledger.backend, SqliteBackend)
        await ledger.limits.admit("gone", per_minute=5, now=T0)
        await ledger.limits.admit("still-here", per_minute=5, now=T0 + timedelta(seconds=100))
        await forget_counts(ledger.backend.database, T0 + timedelta(seconds=120))
        db = sqlite3.connect(sqlite_path(ledger.url))
        try:
            assert db.execute("SELECT key FROM rate_counts").fetchall() == [("still-here",)]
        finally:
            db.close()


@pytest.mark.anyio
async def test_commits_are_read_back_after_they_yield_only_while_a_listener_waits_for_news(ledger: OpenLedger) -> None:
    """A listener that waits for news is told of a commit once its task yields; one that does not is told only when
    it asks (`tell_now`), of all of them at once, and the feed still announces every one in order."""
    assert isinstance(ledger.backend, SqliteBackend)
    database = ledger.backend.database
    waits = False
    told: list[int] = []

    def listener(conn: sqlite3.Connection) -> None:
        told.append(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])

    database.on_commit(listener, waiting=lambda: waits)
    start = ledger.changes.cursor
    for number in (1, 2):
        await ledger.invocations.record(make_invocation(number), ["planned"])
        await anyio.lowlevel.checkpoint()
    assert told == []  # nobody waited: nothing read back on the way
    database.tell_now()
    database.tell_now()  # nothing new: not told twice
    assert told == [2]
    waits = True
    await ledger.invocations.record(make_invocation(3), ["planned"])
    await anyio.lowlevel.checkpoint()
    assert told == [2, 3]
    changes = await ledger.changes.next(start)
    assert [change.invocation_id for change in changes] == ["inv-0001", "inv-0002", "inv-0003"]
