"""The rate limit, counted in the ledger: at most `per_minute` admissions of a key in any minute,
atomically across connections, so every instance sharing a ledger counts against one budget per session."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise

import anyio
import pytest

from bastion.ledger import OpenLedger
from bastion.models import Admission, EventKind
from tests.ledger_contract.samples import T0, make_invocation

pytestmark = pytest.mark.anyio


async def test_a_key_is_admitted_up_to_its_limit_then_told_how_long_to_wait(ledger: OpenLedger) -> None:
    for offset in range(3):
        assert await ledger.limits.admit("session-a", per_minute=3, now=T0 + timedelta(seconds=offset)) is None
    wait = await ledger.limits.admit("session-a", per_minute=3, now=T0 + timedelta(seconds=10))
    assert wait is not None
    assert 50 <= wait <= 51, "the first admission stops counting a minute after it came"
    assert await ledger.limits.admit("session-b", per_minute=3, now=T0 + timedelta(seconds=10)) is None


async def test_a_refused_admission_is_not_counted(ledger: OpenLedger) -> None:
    assert await ledger.limits.admit("session-a", per_minute=1, now=T0) is None
    for offset in range(1, 50):
        assert await ledger.limits.admit("session-a", per_minute=1, now=T0 + timedelta(seconds=offset)) is not None
    assert await ledger.limits.admit("session-a", per_minute=1, now=T0 + timedelta(seconds=61)) is None


async def test_waiting_as_long_as_told_is_enough(ledger: OpenLedger) -> None:
    now = T0 + timedelta(milliseconds=250)
    for _ in range(2):
        assert await ledger.limits.admit("session-a", per_minute=2, now=now) is None
    wait = await ledger.limits.admit("session-a", per_minute=2, now=now)
    assert wait is not None
    later = now + timedelta(seconds=wait)
    assert await ledger.limits.admit("session-a", per_minute=2, now=later - timedelta(milliseconds=1)) is not None
    assert await ledger.limits.admit("session-a", per_minute=2, now=later) is None


async def test_no_minute_ever_holds_more_than_the_limit(ledger: OpenLedger) -> None:
    """Admissions asked for every 0.7 s over three minutes: however the seconds fall, any 60-second window holds
    at most the limit, and the key is never starved for longer than a minute and a second."""
    admitted = []
    for step in range(260):
        now = T0 + timedelta(milliseconds=700 * step)
        if await ledger.limits.admit("session-a", per_minute=10, now=now) is None:
            admitted.append(now)
    for first in admitted:
        assert sum(first <= other < first + timedelta(seconds=60) for other in admitted) <= 10
    gaps = [later - earlier for earlier, later in pairwise(admitted)]
    assert max(gaps) <= timedelta(seconds=61)
    assert len(admitted) >= 30


async def test_a_limit_below_one_is_refused(ledger: OpenLedger) -> None:
    with pytest.raises(ValueError, match="per_minute"):
        await ledger.limits.admit("session-a", per_minute=0, now=T0)


async def test_racing_admissions_from_two_connections_never_exceed_the_limit(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    """Forty admissions of one key at once, half through each connection, for a limit of five: exactly five."""
    outcomes: list[float | None] = []

    async def admit(connection: OpenLedger) -> None:
        outcomes.append(await connection.limits.admit("session-a", per_minute=5, now=T0))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for number in range(40):
                group.start_soon(admit, ledger if number % 2 else another)
    assert outcomes.count(None) == 5
    assert all(wait is not None and wait > 59 for wait in outcomes if wait is not None)
    assert await another.limits.admit("session-a", per_minute=6, now=T0) is None


async def test_a_call_admitted_and_recorded_at_once_counts_and_one_refused_is_neither_counted_nor_recorded(
    ledger: OpenLedger,
) -> None:
    """`record_admitted` (the common call's one transaction): the admission and the record go together."""
    events: tuple[EventKind, ...] = ("planned", "approved", "executing")
    first = make_invocation(1, session_id="session-a")
    assert await ledger.invocations.record_admitted(first, events, admission=Admission("session-a", 1, T0)) is None
    assert (await ledger.invocations.get(first.id)) is not None
    second = make_invocation(2, session_id="session-a")
    wait = await ledger.invocations.record_admitted(
        second, events, admission=Admission("session-a", 1, T0 + timedelta(seconds=1))
    )
    assert wait is not None and 59 <= wait <= 60
    assert await ledger.invocations.get(second.id) is None
    # The first call counted against the same budget as plain admissions.
    assert await ledger.limits.admit("session-a", per_minute=1, now=T0 + timedelta(seconds=2)) is not None
    assert await ledger.limits.admit("session-a", per_minute=2, now=T0 + timedelta(seconds=2)) is None
