"""Claims and recovery after a restart: exactly one claimer runs an approved invocation, and the executing work of
instances that are gone becomes `unknown` while what they left approved is reported to run."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from bastion.ledger import OpenLedger
from bastion.models import Invocation, RecoveryReport, Status
from tests.ledger_contract.samples import make_invocation

pytestmark = pytest.mark.anyio


async def everyone_gone(owners: Sequence[str]) -> set[str]:
    return set(owners)


async def all_but_alive(owners: Sequence[str]) -> set[str]:
    return {owner for owner in owners if owner != "alive"}


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
    asked: list[list[str]] = []

    async def gone_of(owners: Sequence[str]) -> set[str]:
        asked.append(sorted(owners))
        return {owner for owner in owners if owner != "alive"}

    report = await ledger.invocations.recover(gone_of)
    assert asked == [["alive", "gone"]], "asked once, with the owners found"
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
    assert (await ledger.invocations.recover(gone_of)).unknown == []


async def test_recover_of_an_empty_ledger_finds_nothing(ledger: OpenLedger) -> None:
    assert await ledger.invocations.recover(everyone_gone) == RecoveryReport()


async def test_exactly_one_of_two_claimers_gets_an_approved_invocation(ledger: OpenLedger, another: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1, status="approved", owner="gone"), ["planned", "approved"])
    await ledger.invocations.record(make_invocation(2), ["planned", "pending"])
    claims: dict[str, Invocation | None] = {}

    async def claim(connection: OpenLedger, owner: str) -> None:
        claims[owner] = await connection.invocations.claim("inv-0001", owner=owner)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(claim, ledger, "one")
            group.start_soon(claim, another, "two")

    winners = [(owner, won) for owner, won in claims.items() if won is not None]
    assert len(winners) == 1
    owner, won = winners[0]
    assert (won.status, won.owner) == ("executing", owner)
    assert [event.kind for event in await ledger.invocations.events("inv-0001")] == [
        "planned",
        "approved",
        "executing",
    ]
    assert await ledger.invocations.claim("inv-0002", owner="one") is None
    assert await ledger.invocations.claim("missing", owner="one") is None


async def test_recovery_racing_claims_never_marks_a_live_claimers_work_unknown(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    """A live instance takes over what a gone one left approved while another instance recovers: whatever the
    order, each invocation is claimed once, by the live one, runs, and is never marked unknown."""
    ids = [f"inv-{number:04d}" for number in range(1, 21)]
    for number in range(1, 21):
        await ledger.invocations.record(
            make_invocation(number, status="approved", owner="gone"), ["planned", "approved"]
        )
    reports: list[RecoveryReport] = []
    claimed: dict[str, Invocation | None] = {}

    async def take_over(invocation_id: str) -> None:
        claimed[invocation_id] = await ledger.invocations.claim(invocation_id, owner="alive")

    async def recover() -> None:
        for _ in range(5):
            reports.append(await another.invocations.recover(all_but_alive))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for invocation_id in ids[::2]:
                group.start_soon(take_over, invocation_id)
            group.start_soon(recover)
            for invocation_id in ids[1::2]:
                group.start_soon(take_over, invocation_id)

    assert all(report.unknown == [] for report in reports)
    for invocation_id in ids:
        won = claimed[invocation_id]
        assert won is not None
        assert (won.status, won.owner) == ("executing", "alive")
        stored = await another.invocations.get(invocation_id)
        assert stored is not None
        assert (stored.status, stored.owner) == ("executing", "alive")
        kinds = [event.kind for event in await ledger.invocations.events(invocation_id)]
        assert kinds == ["planned", "approved", "executing"]
    final = await another.invocations.recover(all_but_alive)
    assert final == RecoveryReport()
