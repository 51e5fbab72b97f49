"""Steps of a manifest action: invocations recorded as children of the manifest's invocation (`parent_id`)."""

from __future__ import annotations

import pytest

from bastion.ledger import OpenLedger
from tests.ledger_contract.samples import make_invocation

pytestmark = pytest.mark.anyio


async def test_a_step_is_read_back_with_its_parent_and_an_ordinary_call_without(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1, status="executing"), ["planned", "approved", "executing"])
    step = make_invocation(2, status="executing", parent_id="inv-0001")
    await ledger.invocations.record(step, ["planned", "approved", "executing"])

    stored = await ledger.invocations.get("inv-0002")
    assert stored is not None and stored.parent_id == "inv-0001"
    parent = await ledger.invocations.get("inv-0001")
    assert parent is not None and parent.parent_id is None


async def test_listing_by_parent_gives_exactly_that_invocations_steps_newest_first(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    for number in (1, 5):
        await ledger.invocations.record(make_invocation(number, status="executing"), ["planned"])
    for number, parent in ((2, "inv-0001"), (3, "inv-0001"), (6, "inv-0005"), (4, None)):
        await ledger.invocations.record(make_invocation(number, status="completed", parent_id=parent), ["planned"])

    steps = await another.invocations.list(parent_id="inv-0001")
    assert [i.id for i in steps] == ["inv-0003", "inv-0002"]
    assert [i.id for i in await ledger.invocations.list(parent_id="inv-0005", status="completed")] == ["inv-0006"]
    assert await ledger.invocations.list(parent_id="inv-0004") == []
