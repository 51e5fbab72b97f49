"""The invocation's state machine, defined once (bastion.states): the moves it allows, and a move it does not
refused before anything is written, on every ledger."""

from __future__ import annotations

import pytest

from bastion import states
from bastion.ledger import OpenLedger
from tests.ledger_contract.samples import add_pending

pytestmark = pytest.mark.anyio


def test_every_move_goes_where_the_table_says_and_final_statuses_go_nowhere_else() -> None:
    for move in states.MOVES:
        for start in move.from_:
            states.check((start,), move.targets(start)[0])
            assert set(move.targets(start)) <= states.ALLOWED[start]
    assert states.ALLOWED["unknown"] == {"unknown", "completed", "failed"}, "a check refused moves it nowhere"
    assert states.ALLOWED["completed"] == {"completed"}, "a retry noted on a finished call moves it nowhere"
    assert {"completed", "failed", "denied", "expired"} == states.FINAL


@pytest.mark.parametrize(
    ("start", "to"),
    [("completed", "pending"), ("denied", "approved"), ("pending", "executing"), ("approved", "failed")],
)
def test_a_move_the_table_does_not_allow_is_refused_naming_the_moves_there_are(start: str, to: str) -> None:
    with pytest.raises(ValueError, match=f"cannot move from {start} to {to}") as refused:
        states.check((start,), to)  # type: ignore[arg-type]
    assert f"{start} -> " in str(refused.value)


async def test_a_transition_the_table_does_not_allow_writes_nothing(ledger: OpenLedger) -> None:
    held = await add_pending(ledger, 1)
    before = await ledger.invocations.events(held)
    with pytest.raises(ValueError, match="cannot move from pending to completed"):
        await ledger.invocations.transition(held, from_statuses=states.DECIDE.from_, to="completed")
    assert await ledger.invocations.events(held) == before
