"""The pending limit: a call that waits for approval is recorded only while its session has fewer
than the limit pending, counted in the transaction that records it, so racing instances never exceed it."""

from __future__ import annotations

import anyio
import pytest

from bastion.errors import Conflict
from bastion.ledger import OpenLedger
from bastion.models import Invocation
from tests.ledger_contract.samples import add_pending, make_invocation

pytestmark = pytest.mark.anyio


async def test_a_call_under_the_limit_is_recorded_with_its_events(ledger: OpenLedger) -> None:
    invocation = make_invocation(1)
    assert (
        await ledger.invocations.record_pending(invocation, ["planned", "pending"], {"why": "drift"}, limit=1) is None
    )
    assert await ledger.invocations.get(invocation.id) == invocation
    events = await ledger.invocations.events(invocation.id)
    assert [(event.seq, event.kind, event.detail) for event in events] == [
        (1, "planned", {}),
        (2, "pending", {"why": "drift"}),
    ]


async def test_a_call_at_the_limit_records_nothing_and_says_how_many_are_pending(ledger: OpenLedger) -> None:
    await add_pending(ledger, 1)
    await add_pending(ledger, 2)
    cursor = ledger.changes.cursor
    refused = make_invocation(3)
    assert await ledger.invocations.record_pending(refused, ["planned", "pending"], None, limit=2) == 2
    assert await ledger.invocations.record_pending(refused, ["planned", "pending"], None, limit=1) == 2
    assert await ledger.invocations.get(refused.id) is None
    assert await ledger.invocations.events(refused.id) == []
    assert await ledger.changes.since(cursor) == []
    assert await ledger.invocations.count("pending", session_id="session-a") == 2


async def test_only_the_sessions_own_pending_calls_count(ledger: OpenLedger) -> None:
    await add_pending(ledger, 1, session_id="session-b")
    await add_pending(ledger, 2, session_id="session-b")
    await ledger.invocations.record(make_invocation(3, status="denied"), ["planned", "denied"])
    await ledger.invocations.record(make_invocation(4, status="approved"), ["planned", "approved"])
    await add_pending(ledger, 5)
    await ledger.invocations.decide(
        "inv-0005", approve=False, principal="bob", note=None, now=make_invocation(5).created_at
    )
    assert await ledger.invocations.record_pending(make_invocation(6), ["planned", "pending"], None, limit=1) is None
    assert await ledger.invocations.record_pending(make_invocation(7), ["planned", "pending"], None, limit=1) == 1


async def test_recording_a_pending_call_under_a_taken_id_is_a_conflict(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1, session_id="session-b"), ["planned"])
    with pytest.raises(Conflict):
        await ledger.invocations.record_pending(make_invocation(1), ["planned", "pending"], None, limit=10)
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.session_id == "session-b"
    assert len(await ledger.invocations.events("inv-0001")) == 1


async def test_racing_reservations_from_two_connections_never_exceed_the_limit(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    """Forty calls of one session ask for one of five slots at once, half through each connection: exactly five
    are recorded, and every other one is refused with the count it saw, never below the limit."""
    limit, calls = 5, 40
    outcomes: dict[int, int | Invocation | None] = {}  # no twin is looked for: never an Invocation

    async def reserve(connection: OpenLedger, number: int) -> None:
        invocation = make_invocation(number)
        outcomes[number] = await connection.invocations.record_pending(
            invocation, ["planned", "pending"], None, limit=limit
        )

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for number in range(1, calls + 1):
                group.start_soon(reserve, ledger if number % 2 else another, number)

    recorded = [number for number, outcome in outcomes.items() if outcome is None]
    assert len(recorded) == limit
    assert [outcome for outcome in outcomes.values() if outcome is not None] == [limit] * (calls - limit)
    assert await ledger.invocations.count("pending", session_id="session-a") == limit
    assert await another.invocations.count() == limit
