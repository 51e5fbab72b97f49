"""Approvers' decisions and expiry: who decided and why, conflicts naming the status, expiry on decide and by the
sweeper, and racing decisions from two connections with exactly one winner."""

from __future__ import annotations

from datetime import datetime, timedelta

import anyio
import pytest

from bastion.errors import ApprovalExpired, Conflict, NotFound
from bastion.ledger import OpenLedger
from bastion.models import Invocation, Status
from tests.ledger_contract.samples import BEFORE_EXPIRY, EXPIRY, T0, add_pending, make_invocation

pytestmark = pytest.mark.anyio


async def test_approving_a_pending_invocation_records_who_and_why(ledger: OpenLedger) -> None:
    invocation_id = await add_pending(ledger)
    approved = await ledger.invocations.decide(
        invocation_id, approve=True, principal="alice", note="looks fine", now=BEFORE_EXPIRY
    )
    assert (approved.status, approved.error_class, approved.updated_at) == ("approved", None, BEFORE_EXPIRY)
    assert await ledger.invocations.get(invocation_id) == approved
    events = await ledger.invocations.events(invocation_id)
    signed = events[-1].detail.pop("signed")  # bastion.ledger.decisions
    assert [(event.kind, event.detail) for event in events][-1] == (
        "approved",
        {"by": "alice", "note": "looks fine", "scope": "once"},
    )
    assert set(signed) == {"key", "signature"}
    assert events[-1].at == BEFORE_EXPIRY


async def test_denying_records_the_reason_as_an_approval_denied_error(ledger: OpenLedger) -> None:
    with_reason = await add_pending(ledger, 1)
    without_reason = await add_pending(ledger, 2)
    denied = await ledger.invocations.decide(
        with_reason, approve=False, principal="bob", note="wrong file", now=BEFORE_EXPIRY
    )
    assert (denied.status, denied.error_class) == ("denied", "approval_denied")
    assert denied.error_message is not None
    assert "bob" in denied.error_message
    assert "wrong file" in denied.error_message
    last = (await ledger.invocations.events(with_reason))[-1]
    assert set(last.detail.pop("signed")) == {"key", "signature"}
    assert (last.kind, last.detail) == ("denied", {"by": "bob", "reason": "wrong file"})

    anonymous = await ledger.invocations.decide(
        without_reason, approve=False, principal=None, note=None, now=BEFORE_EXPIRY
    )
    assert (anonymous.status, anonymous.error_class) == ("denied", "approval_denied")
    assert anonymous.error_message is not None
    assert ":" not in anonymous.error_message


async def test_an_invocation_without_expiry_can_be_decided_at_any_time(ledger: OpenLedger) -> None:
    invocation_id = await add_pending(ledger, expires_at=None)
    later = T0 + timedelta(days=365)
    decided = await ledger.invocations.decide(invocation_id, approve=True, principal="alice", note=None, now=later)
    assert decided.status == "approved"


async def test_deciding_an_unknown_invocation_is_not_found(ledger: OpenLedger) -> None:
    with pytest.raises(NotFound) as missing:
        await ledger.invocations.decide("nope", approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    assert missing.value.invocation_id == "nope"


async def test_deciding_twice_is_a_conflict_that_names_the_current_status(ledger: OpenLedger) -> None:
    invocation_id = await add_pending(ledger)
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


@pytest.mark.parametrize("status", ["approved", "executing", "completed", "denied", "failed", "expired", "unknown"])
async def test_only_a_pending_invocation_can_be_decided(ledger: OpenLedger, status: Status) -> None:
    await ledger.invocations.record(make_invocation(status=status, expires_at=EXPIRY), ["planned", status])
    with pytest.raises(Conflict, match=status):
        await ledger.invocations.decide("inv-0001", approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.status == status


@pytest.mark.parametrize("now", [EXPIRY, EXPIRY + timedelta(seconds=1)])
async def test_deciding_at_or_after_expiry_marks_it_expired_and_raises(ledger: OpenLedger, now: datetime) -> None:
    invocation_id = await add_pending(ledger)
    with pytest.raises(ApprovalExpired) as expired:
        await ledger.invocations.decide(invocation_id, approve=True, principal="alice", note=None, now=now)
    assert expired.value.invocation_id == invocation_id
    stored = await ledger.invocations.get(invocation_id)
    assert stored is not None
    assert (stored.status, stored.error_class, stored.updated_at) == ("expired", "approval_expired", now)
    assert [event.kind for event in await ledger.invocations.events(invocation_id)] == ["planned", "pending", "expired"]
    with pytest.raises(Conflict, match="expired"):
        await ledger.invocations.decide(invocation_id, approve=False, principal="alice", note=None, now=BEFORE_EXPIRY)


async def test_expire_due_expires_only_pending_invocations_past_their_expiry(ledger: OpenLedger) -> None:
    now = T0 + timedelta(minutes=10)
    await add_pending(ledger, 1, expires_at=now)
    await add_pending(ledger, 2, expires_at=now - timedelta(minutes=1))
    await add_pending(ledger, 3, expires_at=now + timedelta(microseconds=1))
    await add_pending(ledger, 4, expires_at=None)
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


async def test_next_expiry_is_the_earliest_expiry_of_a_pending_invocation(ledger: OpenLedger) -> None:
    assert await ledger.invocations.next_expiry() is None
    await add_pending(ledger, 1, expires_at=None)
    assert await ledger.invocations.next_expiry() is None
    await ledger.invocations.record(make_invocation(2, status="approved", expires_at=T0), ["planned", "approved"])
    await add_pending(ledger, 3, expires_at=EXPIRY)
    await add_pending(ledger, 4, expires_at=EXPIRY - timedelta(seconds=30))
    assert await ledger.invocations.next_expiry() == EXPIRY - timedelta(seconds=30)
    await ledger.invocations.decide("inv-0004", approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    assert await ledger.invocations.next_expiry() == EXPIRY


# -- races between connections -------------------------------------------------------------------------------


async def test_racing_transitions_from_two_connections_have_exactly_one_winner(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    for number in range(1, 21):
        await ledger.invocations.record(make_invocation(number), ["planned", "pending"])
    outcomes: dict[tuple[int, Status], Invocation | None] = {}

    async def decide(connection: OpenLedger, number: int, to: Status) -> None:
        pending: tuple[Status, ...] = ("pending",)
        outcomes[number, to] = await connection.invocations.transition(
            f"inv-{number:04d}", from_statuses=pending, to=to
        )

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for number in range(1, 21):
                group.start_soon(decide, ledger, number, "approved")
                group.start_soon(decide, another, number, "denied")

    for number in range(1, 21):
        approved, denied = outcomes[number, "approved"], outcomes[number, "denied"]
        assert (approved is None) != (denied is None)
        winner = approved or denied
        assert winner is not None
        stored = await another.invocations.get(f"inv-{number:04d}")
        assert stored is not None
        assert stored.status == winner.status
        kinds = [event.kind for event in await ledger.invocations.events(f"inv-{number:04d}")]
        assert kinds == ["planned", "pending", winner.status]


async def test_two_connections_deciding_at_once_have_exactly_one_winner(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    ids = [await add_pending(ledger, number) for number in range(1, 11)]
    outcomes: dict[tuple[str, bool], Invocation | Conflict] = {}

    async def decide(connection: OpenLedger, invocation_id: str, approve: bool) -> None:
        try:
            outcomes[invocation_id, approve] = await connection.invocations.decide(
                invocation_id, approve=approve, principal="x", note=None, now=BEFORE_EXPIRY
            )
        except Conflict as conflict:
            outcomes[invocation_id, approve] = conflict

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for invocation_id in ids:
                group.start_soon(decide, ledger, invocation_id, True)
                group.start_soon(decide, another, invocation_id, False)

    for invocation_id in ids:
        results = [outcomes[invocation_id, True], outcomes[invocation_id, False]]
        winners = [result for result in results if isinstance(result, Invocation)]
        losers = [result for result in results if isinstance(result, Conflict)]
        assert (len(winners), len(losers)) == (1, 1)
        assert losers[0].invocation_id == invocation_id
        kinds = [event.kind for event in await another.invocations.events(invocation_id)]
        assert kinds == ["planned", "pending", winners[0].status]


async def test_a_decision_racing_the_sweeper_at_expiry_either_decides_or_expires_never_both(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    ids = [await add_pending(ledger, number) for number in range(1, 11)]
    decided: dict[str, Invocation | ApprovalExpired | Conflict] = {}
    swept: list[str] = []

    async def decide(invocation_id: str) -> None:
        try:
            decided[invocation_id] = await ledger.invocations.decide(
                invocation_id, approve=True, principal="alice", note=None, now=EXPIRY - timedelta(microseconds=1)
            )
        except (ApprovalExpired, Conflict) as refused:
            decided[invocation_id] = refused

    async def sweep() -> None:
        for _ in ids:
            swept.extend(invocation.id for invocation in await another.invocations.expire_due(EXPIRY))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for invocation_id in ids[::2]:
                group.start_soon(decide, invocation_id)
            group.start_soon(sweep)
            for invocation_id in ids[1::2]:
                group.start_soon(decide, invocation_id)

    for invocation_id in ids:
        stored = await ledger.invocations.get(invocation_id)
        assert stored is not None
        kinds = [event.kind for event in await ledger.invocations.events(invocation_id)]
        if isinstance(decided[invocation_id], Invocation):
            assert (stored.status, kinds, invocation_id in swept) == (
                "approved",
                ["planned", "pending", "approved"],
                False,
            )
        else:
            assert isinstance(decided[invocation_id], Conflict)
            assert (stored.status, kinds, invocation_id in swept) == (
                "expired",
                ["planned", "pending", "expired"],
                True,
            )
