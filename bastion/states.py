"""The invocation's state machine, defined once: each move a call's record can make, from which statuses to which.

Backends apply a move as one conditional update (the row changes only while its status is one the move starts
from, so of two racing moves exactly one wins) and take the statuses from here as parameters; they do not restate
them. `bastion.ledger.recorder.Recorder.transition` refuses a move this table does not allow before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from bastion.models import STATUSES, Status


@dataclass(frozen=True)
class Move:
    """One kind of move: from any of `from_` to any of `to`. A move without `to` leaves the status as it is: it only
    appends an event to the record."""

    name: str
    from_: tuple[Status, ...]
    to: tuple[Status, ...] = ()

    def targets(self, start: Status) -> tuple[Status, ...]:
        """Where the move goes from `start`: `to`, or `start` itself for a move that leaves the status."""
        return self.to or (start,)

    @property
    def start(self) -> Status:
        """The one status a single-status move starts from (what its conditional update compares with)."""
        assert len(self.from_) == 1, f"{self.name} starts from several statuses"
        return self.from_[0]


DECIDE: Final = Move("decide", ("pending",), ("approved", "denied"))
"""An approver's decision; the caller withdrawing its own call is a denial too."""
EXPIRE: Final = Move("expire", ("pending",), ("expired",))
CLAIM: Final = Move("claim", ("approved",), ("executing",))
FINISH: Final = Move("finish", ("executing",), ("completed", "failed", "unknown"))
"""The outcome of a call that ran (or could not start: failed)."""
RECOVER: Final = Move("recover", ("executing",), ("unknown",))
"""A call whose process stopped while it ran: its outcome cannot be known."""
RECONCILE: Final = Move("reconcile", ("unknown", "executing"), ("completed", "failed"))
"""An outcome found after the fact: by hand, by a provider's look-up, or by a rollback."""
NOTE_CHECK: Final = Move("note a check", ("unknown", "executing"))
"""A provider's look-up whose evidence is no proof the call made it: the attempt is recorded (who, how, what was
found and why it was refused), and the call stays unresolved."""

RECORD_APPROVAL: Final = Move("record an approval", ("pending",))
"""One approval of a call that needs more approvers than have approved it so far: recorded (who, signed), and the
call stays pending until the last one needed approves it (DECIDE), someone denies it, or it expires."""
NOTE_RETRY: Final = Move("note a retry", STATUSES)
"""The same call came again (same caller, action and arguments) while this one waited, ran, or had just ended: the
retry was attached to it instead of being recorded (bastion.pipeline.approvals), and the attempt is noted."""

MOVES: Final = (DECIDE, EXPIRE, CLAIM, FINISH, RECOVER, RECONCILE, NOTE_CHECK, RECORD_APPROVAL, NOTE_RETRY)

ALLOWED: Final[dict[Status, frozenset[Status]]] = {
    start: frozenset(to for move in MOVES if start in move.from_ for to in move.targets(start)) for start in STATUSES
}
"""Where each status may go; a status that goes nowhere but to itself (an event noted on it) is final."""

FINAL: Final[frozenset[Status]] = frozenset(start for start, to in ALLOWED.items() if to <= {start})
"""The statuses a call ends in: completed, failed, denied, expired."""

OPEN: Final[tuple[Status, ...]] = ("pending", "approved", "executing")
"""The statuses of a call whose outcome is still to come: Bastion itself will decide, run or record it (an `unknown`
call waits for a person instead)."""


def check(from_statuses: tuple[Status, ...] | frozenset[Status] | list[Status], to: Status) -> None:
    """ValueError, naming the moves there are, unless every status of `from_statuses` may move to `to` (none: the
    move applies to nothing, and is no error)."""
    illegal = sorted(start for start in from_statuses if to not in ALLOWED[start])
    if illegal:
        allowed = "; ".join(
            f"{start} -> {', '.join(sorted(ALLOWED[start] - {start})) or 'nothing else: it is final'}"
            for start in illegal
        )
        raise ValueError(f"an invocation cannot move from {', '.join(illegal)} to {to} ({allowed})")
