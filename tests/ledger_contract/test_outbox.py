"""The webhook outbox: one message per webhook and event, claimed before sending so two instances never
send the same one at once, kept until delivered, retried when told, given up when told."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bastion.ledger import OpenLedger
from tests.ledger_contract.samples import T0

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=30)


async def test_a_message_is_enqueued_once_per_target_and_event(ledger: OpenLedger) -> None:
    assert await ledger.outbox.last_event("hook-a") is None
    assert await ledger.outbox.enqueue("hook-a", 7, '{"n":7}', now=T0) is True
    assert await ledger.outbox.enqueue("hook-a", 7, '{"n":7}', now=T0) is False
    assert await ledger.outbox.enqueue("hook-b", 7, '{"n":7}', now=T0) is True
    assert await ledger.outbox.enqueue("hook-a", 9, '{"n":9}', now=T0) is True
    assert await ledger.outbox.last_event("hook-a") == 9
    assert await ledger.outbox.last_event("hook-b") == 7


async def test_claimed_messages_are_not_claimed_again_until_their_claim_lapses(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    for event_id in (1, 2, 3):
        await ledger.outbox.enqueue("hook", event_id, f'{{"n":{event_id}}}', now=T0)
    assert await ledger.outbox.next_due("hook") == T0
    first = await ledger.outbox.claim("hook", now=T0, until=T0 + LEASE, limit=2)
    assert [(item.event_id, item.body, item.attempts) for item in first] == [(1, '{"n":1}', 0), (2, '{"n":2}', 0)]
    second = await another.outbox.claim("hook", now=T0, until=T0 + LEASE, limit=10)
    assert [item.event_id for item in second] == [3]
    assert await another.outbox.claim("hook", now=T0 + timedelta(seconds=1), until=T0 + LEASE, limit=10) == []
    lapsed = await another.outbox.claim("hook", now=T0 + LEASE, until=T0 + 2 * LEASE, limit=10)
    assert [item.event_id for item in lapsed] == [1, 2, 3]


async def test_a_delivered_message_is_never_claimed_again_and_a_failed_one_is_retried_when_told(
    ledger: OpenLedger,
) -> None:
    await ledger.outbox.enqueue("hook", 1, "{}", now=T0)
    await ledger.outbox.enqueue("hook", 2, "{}", now=T0)
    await ledger.outbox.enqueue("hook", 3, "{}", now=T0)
    one, two, three = await ledger.outbox.claim("hook", now=T0, until=T0 + LEASE, limit=10)
    await ledger.outbox.delivered(one.id, now=T0)
    await ledger.outbox.retry(two.id, at=T0 + timedelta(seconds=4), error="HTTP 503")
    await ledger.outbox.retry(three.id, at=None, error="HTTP 410: gave up")
    assert await ledger.outbox.next_due("hook") == T0 + timedelta(seconds=4)
    assert await ledger.outbox.claim("hook", now=T0 + timedelta(seconds=3), until=T0 + LEASE, limit=10) == []
    (again,) = await ledger.outbox.claim("hook", now=T0 + timedelta(seconds=4), until=T0 + LEASE, limit=10)
    assert (again.event_id, again.attempts) == (2, 1)
    await ledger.outbox.delivered(again.id, now=T0 + timedelta(seconds=4))
    assert await ledger.outbox.next_due("hook") is None
    assert await ledger.outbox.claim("hook", now=T0 + timedelta(days=1), until=T0 + timedelta(days=2), limit=10) == []


async def test_the_outbox_outlives_the_connection(ledger: OpenLedger, another: OpenLedger) -> None:
    await ledger.outbox.enqueue("hook", 5, "{}", now=T0)
    assert await another.outbox.last_event("hook") == 5
    (item,) = await another.outbox.claim("hook", now=T0, until=T0 + LEASE, limit=1)
    assert item.event_id == 5


async def test_each_target_is_claimed_and_due_on_its_own(ledger: OpenLedger) -> None:
    """Each webhook has its own sender: what one claims or waits for says nothing of another's."""
    await ledger.outbox.enqueue("slow", 1, "{}", now=T0)
    await ledger.outbox.enqueue("fast", 1, "{}", now=T0 + timedelta(seconds=5))
    (slow,) = await ledger.outbox.claim("slow", now=T0, until=T0 + LEASE, limit=10)
    assert slow.target == "slow"
    assert await ledger.outbox.claim("fast", now=T0, until=T0 + LEASE, limit=10) == []
    assert await ledger.outbox.next_due("fast") == T0 + timedelta(seconds=5)
    assert await ledger.outbox.next_due("slow") == T0 + LEASE  # its claim lapses then
    (fast,) = await ledger.outbox.claim("fast", now=T0 + timedelta(seconds=5), until=T0 + LEASE, limit=10)
    assert fast.target == "fast"
