"""The change feed: every event in id order, announced to waiters in this process, including what other
connections commit while `run` runs; resumable from a cursor; and honest about what it no longer keeps."""

from __future__ import annotations

from functools import partial

import anyio
import pytest

from bastion.errors import ChangesLost
from bastion.ledger import OpenLedger, Redactor
from tests.ledger_contract.backends import Backend
from tests.ledger_contract.samples import T0, add_pending, make_invocation

pytestmark = pytest.mark.anyio


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
    assert [event.id for event in await ledger.invocations.events("inv-0001")] == [c.id for c in changes]


async def test_since_resumes_a_stream_from_any_cursor_in_pages(ledger: OpenLedger) -> None:
    start = ledger.changes.cursor
    for number in range(1, 6):
        await ledger.invocations.record(make_invocation(number), ["planned", "pending"])
    everything = await ledger.changes.since(start)
    assert len(everything) == 10
    resumed, cursor = [], start
    while page := await ledger.changes.since(cursor, limit=3):
        assert len(page) <= 3
        resumed.extend(page)
        cursor = page[-1].id
    assert resumed == everything
    assert await ledger.changes.since(everything[-1].id) == []
    assert await ledger.changes.since(everything[4].id) == everything[5:]
    assert await ledger.changes.since(start, limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        await ledger.changes.since(start, limit=-1)


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


async def test_next_waits_until_there_is_a_change_after_the_cursor(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned"])
    cursor = ledger.changes.cursor
    got: list[str] = []

    async def wait() -> None:
        got.extend(change.invocation_id for change in await ledger.changes.next(cursor))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert got == []
            await ledger.invocations.record(make_invocation(2), ["planned"])
    assert got == ["inv-0002"]


async def test_a_commit_between_reading_and_waiting_is_not_missed(ledger: OpenLedger) -> None:
    cursor = ledger.changes.cursor  # taken before reading what we wait on
    await ledger.invocations.record(make_invocation(), ["planned", "pending"])  # lands before we start waiting
    with anyio.fail_after(10):
        changes = await ledger.changes.next(cursor)
    assert {c.invocation_id for c in changes} == {"inv-0001"}


async def test_a_write_that_changes_nothing_is_no_news(ledger: OpenLedger) -> None:
    cursor = ledger.changes.cursor
    assert await ledger.invocations.expire_due(T0) == []
    assert ledger.changes.cursor == cursor
    await ledger.invocations.record(make_invocation(expires_at=T0), ["planned", "pending"])
    assert len(await ledger.invocations.expire_due(T0)) == 1
    assert [c.kind for c in await ledger.changes.next(cursor)] == ["planned", "pending", "expired"]


async def test_a_waiter_that_fell_too_far_behind_is_told_to_re_read(backend: Backend, ledger: OpenLedger) -> None:
    cursor = ledger.changes.cursor
    for number in range(1, backend.changes_kept // 2 + 2):
        await ledger.invocations.record(make_invocation(number), ["planned", "pending"])
    with pytest.raises(ChangesLost):
        await ledger.changes.next(cursor)
    assert len(await ledger.changes.since(cursor, limit=backend.changes_kept + 10)) == 2 * (
        backend.changes_kept // 2 + 1
    )
    latest = ledger.changes.cursor
    await ledger.invocations.record(make_invocation(0), ["planned"])
    assert [c.invocation_id for c in await ledger.changes.next(latest)] == ["inv-0000"]


async def test_a_waiter_wakes_when_another_connection_commits_while_the_feed_runs(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    invocation_id = await add_pending(ledger)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await group.start(ledger.changes.run)
            cursor = ledger.changes.cursor
            group.start_soon(
                partial(another.invocations.decide, invocation_id, approve=True, principal="a", note=None, now=T0)
            )
            changes = await ledger.changes.next(cursor)
            group.cancel_scope.cancel()
    assert [(c.invocation_id, c.status) for c in changes] == [(invocation_id, "approved")]


async def test_what_one_connection_commits_is_in_the_history_every_connection_reads(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    start = ledger.changes.cursor
    await ledger.invocations.record(make_invocation(1), ["planned", "pending"])
    await another.invocations.decide("inv-0001", approve=False, principal="b", note=None, now=T0)
    expected = [("inv-0001", "planned"), ("inv-0001", "pending"), ("inv-0001", "denied")]
    for connection in (ledger, another):
        assert [(c.invocation_id, c.kind) for c in await connection.changes.since(start)] == expected


async def test_a_new_connection_announces_only_what_follows_its_opening(backend: Backend, ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned", "pending"])
    async with await backend.open_another(ledger, Redactor()) as later:
        assert later.changes.cursor == ledger.changes.cursor
        cursor = later.changes.cursor
        await later.invocations.record(make_invocation(2), ["planned"])
        assert [c.invocation_id for c in await later.changes.next(cursor)] == ["inv-0002"]
        assert [c.invocation_id for c in await later.changes.since(0)] == ["inv-0001", "inv-0001", "inv-0002"]


async def test_a_waiter_resuming_from_a_cursor_ahead_of_the_feed_gets_only_what_follows_it(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    """A cursor read from storage (another connection's commits, not yet announced here) is a valid place to
    resume from: the feed waits until it has caught up and returns what follows the cursor."""
    start = ledger.changes.cursor
    await another.invocations.record(make_invocation(1), ["planned", "pending", "approved"])
    stored = await ledger.changes.since(start)
    assert [c.kind for c in stored] == ["planned", "pending", "approved"]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await group.start(ledger.changes.run)
            changes = await ledger.changes.next(stored[0].id)
            group.cancel_scope.cancel()
    assert list(changes) == stored[1:]


async def test_a_cursor_beyond_every_change_of_the_ledger_is_told_to_re_read_instead_of_waiting_forever(
    ledger: OpenLedger,
) -> None:
    """A cursor this ledger never issued (from another ledger, or from this one before it was restored from a
    backup) would wait for changes that may never come."""
    await ledger.invocations.record(make_invocation(1), ["planned"])
    newest = ledger.changes.cursor
    with anyio.fail_after(10), pytest.raises(ChangesLost):
        await ledger.changes.next(newest + 1000)
    await ledger.invocations.record(make_invocation(2), ["planned"])
    assert [c.invocation_id for c in await ledger.changes.next(newest)] == ["inv-0002"]


async def test_what_another_connection_committed_before_the_feed_ran_is_announced_when_it_runs(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    cursor = ledger.changes.cursor
    await another.invocations.record(make_invocation(1), ["planned", "pending"])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await group.start(ledger.changes.run)
            changes = await ledger.changes.next(cursor)
            group.cancel_scope.cancel()
    assert [(c.invocation_id, c.kind) for c in changes] == [("inv-0001", "planned"), ("inv-0001", "pending")]
