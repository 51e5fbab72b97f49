"""A retried held call: recording it pending looks for its twin in the same transaction (bastion.ledger.twins), and a
retry that finds one records nothing but a `retried` event on the twin, even when retries race from two
connections."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest

from bastion.ledger import OpenLedger
from bastion.models import Invocation, RetryWindow
from tests.ledger_contract.samples import BEFORE_EXPIRY, EXPIRY, T0, make_invocation

pytestmark = pytest.mark.anyio

WINDOW = RetryWindow(decided_since=T0, created_since=T0 - timedelta(hours=1))
"""Twins made in the hour before T0, or decided since T0."""


async def hold(ledger: OpenLedger, number: int, *, retries: RetryWindow | None = WINDOW, **overrides: Any) -> Any:
    invocation = make_invocation(number, **({"expires_at": EXPIRY} | overrides))
    return await ledger.invocations.record_pending(
        invocation, ["planned", "pending"], {"expires_at": str(EXPIRY)}, limit=10, retries=retries
    )


async def test_a_retry_of_a_pending_call_records_nothing_but_a_retried_event_on_it(ledger: OpenLedger) -> None:
    assert await hold(ledger, 1) is None
    before = await ledger.invocations.get("inv-0001")
    twin = await hold(ledger, 2)
    assert isinstance(twin, Invocation)
    assert twin == before, "the twin comes back as it is: its status and updated_at unmoved"
    assert await ledger.invocations.get("inv-0002") is None
    events = await ledger.invocations.events("inv-0001")
    assert [(event.kind, event.detail) for event in events] == [
        ("planned", {}),
        ("pending", {"expires_at": str(EXPIRY)}),
        ("retried", {"by": None}),
    ]
    assert (await ledger.audit.verify()).broken is None


@pytest.mark.parametrize(
    "other",
    [
        {"args_hash": "1" * 64},
        {"policy_key": "fs:read_file"},
        {"session_id": "session-b"},
        {"principal": "agent-7"},
    ],
    ids=["arguments", "action", "anonymous-session", "principal"],
)
async def test_a_call_that_differs_in_arguments_action_or_caller_is_recorded_anew(
    ledger: OpenLedger, other: dict[str, Any]
) -> None:
    await hold(ledger, 1)
    assert await hold(ledger, 2, **other) is None
    assert [event.kind for event in await ledger.invocations.events("inv-0001")] == ["planned", "pending"]


async def test_a_principal_retries_across_sessions_and_an_anonymous_caller_only_within_its_own(
    ledger: OpenLedger,
) -> None:
    await hold(ledger, 1, principal="agent-7", session_id="session-a")
    twin = await hold(ledger, 2, principal="agent-7", session_id="session-b")
    assert isinstance(twin, Invocation)
    assert twin.id == "inv-0001"
    assert (await ledger.invocations.events(twin.id))[-1].detail == {"by": "agent-7"}
    await hold(ledger, 3, session_id="session-a")
    assert await hold(ledger, 4, session_id="session-b") is None, "another anonymous session is another caller"


async def test_only_held_calls_are_twins(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1, status="completed", mode="allow"), ["planned", "completed"])
    assert await hold(ledger, 2) is None


async def test_without_a_window_nothing_is_looked_for(ledger: OpenLedger) -> None:
    await hold(ledger, 1)
    assert await hold(ledger, 2, retries=None) is None


async def test_a_decided_twin_attaches_only_while_its_decision_is_in_the_window(ledger: OpenLedger) -> None:
    await hold(ledger, 1)
    await ledger.invocations.decide("inv-0001", approve=False, principal="bob", note="no", now=BEFORE_EXPIRY)
    late = RetryWindow(decided_since=BEFORE_EXPIRY + timedelta(seconds=1), created_since=WINDOW.created_since)
    assert await hold(ledger, 2, retries=late) is None
    twin = await hold(ledger, 3)
    assert isinstance(twin, Invocation)
    assert (twin.id, twin.status, twin.error_class) == ("inv-0002", "pending", None), "the newest twin wins"
    await ledger.invocations.decide("inv-0002", approve=True, principal="bob", note=None, now=BEFORE_EXPIRY)
    twin = await hold(ledger, 4)
    assert isinstance(twin, Invocation)
    assert (twin.id, twin.status) == ("inv-0002", "approved")


async def test_a_twin_made_before_the_window_looks_back_is_not_found(ledger: OpenLedger) -> None:
    await hold(ledger, 1)
    short = RetryWindow(decided_since=T0, created_since=T0 + timedelta(seconds=2))
    assert await hold(ledger, 2, retries=short) is None


async def test_retries_racing_from_two_connections_record_one_call(ledger: OpenLedger, another: OpenLedger) -> None:
    """Twenty identical calls of one session arrive at once, half through each connection: exactly one is recorded,
    every other one gets it back, each retry is noted once, and the chain verifies."""
    calls = 20
    outcomes: dict[int, Any] = {}

    async def send(connection: OpenLedger, number: int) -> None:
        outcomes[number] = await hold(connection, number)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for number in range(1, calls + 1):
                group.start_soon(send, ledger if number % 2 else another, number)

    recorded = [number for number, outcome in outcomes.items() if outcome is None]
    assert len(recorded) == 1
    (first,) = await ledger.invocations.list()
    assert first.id == f"inv-{recorded[0]:04d}"
    assert {outcome.id for outcome in outcomes.values() if outcome is not None} == {first.id}
    kinds = [event.kind for event in await another.invocations.events(first.id)]
    assert kinds == ["planned", "pending"] + ["retried"] * (calls - 1)
    assert (await ledger.audit.verify()).broken is None
