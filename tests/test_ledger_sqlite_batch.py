"""Writes that may wait (a call's outcome) share the event loop's next turn's SQLite transaction, and a write that
does not wait takes them along in its own (bastion.ledger.sqlite.database). A write that may be deferred (the outcome
of a call answered while others run) waits longer, for a write that may not (the next call's intent), or a moment;
a read, or closing, commits it first.

Each write keeps its own outcome: one that fails is rolled back alone, one cancelled before the transaction began
writes nothing, one cancelled after it keeps its write and is cancelled at its next await. The turns are those of
asyncio's loop (a checkpoint yields one): a task created now runs its first step in the next turn, and a callback
scheduled during a turn runs in the turn after it."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from bastion.errors import Conflict, LedgerUnavailable
from bastion.ledger.sqlite.database import SqliteDatabase


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SqliteDatabase]:
    database = await SqliteDatabase.open(tmp_path / "ledger.db")
    await database.write(lambda conn: conn.execute("CREATE TABLE scratch (value TEXT UNIQUE)"), events=False)
    try:
        yield database
    finally:
        await database.close()


def insert(value: str, *, then_fail: bool = False) -> Callable[[sqlite3.Connection], str]:
    def work(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO scratch (value) VALUES (?)", (value,))
        if then_fail:
            raise Conflict(f"{value} refused after its insert")
        return value

    return work


async def stored(db: SqliteDatabase) -> list[str]:
    return [row[0] for row in await db.fetchall("SELECT value FROM scratch ORDER BY value")]


@pytest.mark.anyio
async def test_writes_of_one_turn_share_one_transaction_and_each_gets_its_own_result(db: SqliteDatabase) -> None:
    before = db.uncheckpointed
    assert await asyncio.gather(*(db.write(insert(value), may_wait=True) for value in "abc")) == ["a", "b", "c"]
    assert db.uncheckpointed == before + 1  # one commit
    await db.write(insert("d"), may_wait=True)
    await db.write(insert("e"), may_wait=True)
    assert db.uncheckpointed == before + 3  # one each, one after the other
    assert await stored(db) == ["a", "b", "c", "d", "e"]


@pytest.mark.anyio
async def test_a_write_that_does_not_wait_runs_in_its_callers_step_and_takes_the_waiting_ones_along(
    db: SqliteDatabase,
) -> None:
    before = db.uncheckpointed
    waiting = [asyncio.get_running_loop().create_task(db.write(insert(value), may_wait=True)) for value in "ab"]
    await anyio.lowlevel.checkpoint()  # both wait for the next turn
    assert await db.write(insert("c")) == "c"  # no await before it ran: a, b and c in one transaction
    assert db.uncheckpointed == before + 1
    assert await asyncio.gather(*waiting) == ["a", "b"]
    assert await stored(db) == ["a", "b", "c"]


@pytest.mark.anyio
async def test_a_failing_write_is_rolled_back_alone_and_its_caller_gets_its_error(db: SqliteDatabase) -> None:
    outcomes = await asyncio.gather(
        db.write(insert("a"), may_wait=True),
        db.write(insert("b", then_fail=True), may_wait=True),
        db.write(insert("a"), may_wait=True),  # the unique value again: an IntegrityError, raised to its caller
        db.write(insert("c"), may_wait=True),
        return_exceptions=True,
    )
    assert outcomes[0] == "a" and outcomes[3] == "c"
    assert isinstance(outcomes[1], Conflict)
    assert isinstance(outcomes[2], sqlite3.IntegrityError)
    assert await stored(db) == ["a", "c"]


@pytest.mark.anyio
async def test_a_failure_that_ends_the_transaction_fails_every_write_of_it_and_the_next_ones_are_stored(
    db: SqliteDatabase,
) -> None:
    def ending(conn: sqlite3.Connection) -> str:  # as SQLite does on a full disk: the whole transaction is gone
        conn.execute("INSERT INTO scratch (value) VALUES ('ending')")
        conn.execute("ROLLBACK")
        raise sqlite3.OperationalError("database or disk is full")

    with anyio.fail_after(30):  # (a write left without its outcome would wait for ever)
        outcomes = await asyncio.gather(
            db.write(insert("a"), may_wait=True),
            db.write(insert("b", then_fail=True), may_wait=True),
            db.write(ending, may_wait=True),
            db.write(insert("c"), may_wait=True),
            return_exceptions=True,
        )
    assert all(isinstance(outcome, LedgerUnavailable) for outcome in outcomes), outcomes
    assert await stored(db) == []
    assert await db.write(insert("d")) == "d"
    assert await stored(db) == ["d"]


@pytest.mark.anyio
async def test_a_write_cancelled_before_its_transaction_writes_nothing(db: SqliteDatabase) -> None:
    kept = asyncio.get_running_loop().create_task(db.write(insert("kept"), may_wait=True))
    cancelled = asyncio.get_running_loop().create_task(db.write(insert("cancelled"), may_wait=True))
    await anyio.lowlevel.checkpoint()  # both wait for the transaction the next turn begins
    cancelled.cancel()
    assert await kept == "kept"
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert await stored(db) == ["kept"]


@pytest.mark.anyio
async def test_a_write_cancelled_after_its_transaction_keeps_its_outcome_and_is_cancelled_at_its_next_await(
    db: SqliteDatabase,
) -> None:
    seen: list[str] = []

    async def caller() -> None:
        seen.append(await db.write(insert("written"), may_wait=True))
        await anyio.lowlevel.checkpoint()
        seen.append("not reached")

    task = asyncio.get_running_loop().create_task(caller())
    await anyio.lowlevel.checkpoint()  # the write waits for the next turn's transaction
    await anyio.lowlevel.checkpoint()  # that turn commits it, then this task cancels the caller before it resumes
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["written"]
    assert await stored(db) == ["written"]


@pytest.mark.anyio
async def test_a_deferred_write_waits_past_the_turn_for_a_write_that_may_not_and_shares_its_commit(
    db: SqliteDatabase,
) -> None:
    before = db.uncheckpointed
    deferred = asyncio.get_running_loop().create_task(db.write(insert("a"), may_defer=True))
    for _ in range(3):  # turns go by: it waits on
        await anyio.lowlevel.checkpoint()
    assert not deferred.done() and db.uncheckpointed == before
    assert await db.write(insert("b"), may_wait=True) == "b"  # the next turn's transaction takes it along
    assert await deferred == "a"
    assert db.uncheckpointed == before + 1
    assert await stored(db) == ["a", "b"]


@pytest.mark.anyio
async def test_a_deferred_write_alone_commits_by_itself_soon(db: SqliteDatabase) -> None:
    before = db.uncheckpointed
    with anyio.fail_after(5):
        assert await db.write(insert("a"), may_defer=True) == "a"
    assert db.uncheckpointed == before + 1
    assert await stored(db) == ["a"]


@pytest.mark.anyio
async def test_a_read_commits_the_deferred_writes_first(db: SqliteDatabase) -> None:
    deferred = asyncio.get_running_loop().create_task(db.write(insert("a"), may_defer=True))
    await anyio.lowlevel.checkpoint()  # queued
    assert await stored(db) == ["a"]
    assert deferred.done() and deferred.result() == "a"


@pytest.mark.anyio
async def test_closing_commits_the_deferred_writes(tmp_path: Path) -> None:
    database = await SqliteDatabase.open(tmp_path / "ledger.db")
    await database.write(lambda conn: conn.execute("CREATE TABLE scratch (value TEXT UNIQUE)"), events=False)
    deferred = asyncio.get_running_loop().create_task(database.write(insert("a"), may_defer=True))
    await anyio.lowlevel.checkpoint()  # queued
    await database.close()
    assert deferred.done() and deferred.result() == "a"
    with sqlite3.connect(tmp_path / "ledger.db") as ledger:
        assert ledger.execute("SELECT value FROM scratch").fetchall() == [("a",)]


@pytest.mark.anyio
async def test_a_read_on_the_writer_does_not_split_the_writes_of_its_turn(db: SqliteDatabase) -> None:
    """A read on the writer (the change feed's poll) takes the writer within its own step: writes queued meanwhile
    still share one transaction (they once each took one, queued behind the read's hold of the writer)."""
    before = db.uncheckpointed
    loop = asyncio.get_running_loop()
    reading = loop.create_task(db.data_version())
    writes = [loop.create_task(db.write(insert(value), may_wait=True)) for value in "abc"]
    await asyncio.gather(reading, *writes)
    assert db.uncheckpointed == before + 1
    assert await stored(db) == ["a", "b", "c"]
