"""Recording what came of a call that was sent, whatever goes wrong while recording it.

Once a call may have left Bastion its host gets its answer, so recording the outcome must never fail the call:
a result that cannot be stored is recorded without it, saying why, and an outcome the ledger refuses (a full
disk, say) is kept and offered again until it takes, so no call that ran stays `executing`.

The outcome of a call answered while other calls run is recorded off the call's task (`may_defer`): its host has its
answer already, the task (an HTTP request's, whose connection waits for it) ends at once, and the store may commit the
outcome with the next call's intent, one commit for both (fewer commits under concurrency). Stopping waits for those
records.
"""

from __future__ import annotations

import logging
from typing import Any, Final, NoReturn

import anyio
import mcp_types as types
from anyio.abc import TaskGroup

from bastion.actions import WireResult
from bastion.errors import BastionError
from bastion.models import Admission, EventKind, Invocation, Status
from bastion.pipeline.observer import Observers
from bastion.pipeline.seams import InvocationStore

logger = logging.getLogger(__name__)

LATE_RECORD_SECONDS: Final = 5.0
"""How often an outcome the ledger refused is offered to it again."""
STARTED_EVENTS: Final[tuple[EventKind, ...]] = ("planned", "approved", "executing")
"""The first events of a call that runs at once (the allow path), recorded with its invocation."""


class Outcomes:
    """Records outcomes in the invocation store and tells the observers; retries what the store refused."""

    def __init__(self, store: InvocationStore, observers: Observers) -> None:
        self._store = store
        self._observers = observers
        self._unrecorded: dict[str, tuple[Invocation, dict[str, Any]]] = {}
        """Outcomes of calls that ran which the store refused; `run` retries them."""
        self._late = anyio.Event()
        self._background: TaskGroup | None = None
        """Where outcomes handed over by `finish(may_defer=True)` are recorded, while `run` runs."""

    async def start(
        self,
        invocation: Invocation,
        detail: dict[str, Any] | None = None,
        *,
        admission: Admission | None = None,
        may_share: bool = False,
    ) -> float | None:
        """Record a call that runs now (planned, approved, executing) and tell the observers so. With an
        `admission`, the call is first admitted against its rate limit in the same transaction: when the limit
        refuses it, nothing is recorded and the seconds until one more fits come back (None: it runs).
        `may_share`: other calls are in flight; the record may share their commit (see `InvocationStore.record`)."""
        if admission is None:
            await self._store.record(invocation, STARTED_EVENTS, detail, may_share=may_share)
        else:
            wait = await self._store.record_admitted(
                invocation, STARTED_EVENTS, detail, admission=admission, may_share=may_share
            )
            if wait is not None:
                return wait
        await self._observers.planned(invocation)
        await self._observers.decided(invocation)
        await self._observers.executing(invocation)
        return None

    async def refuse(
        self, invocation: Invocation, error: BastionError, detail: dict[str, Any] | None = None
    ) -> NoReturn:
        """Record the call as refused by `error` before anything was sent, tell the observers, and raise `error`,
        naming the invocation."""
        reason = error.message
        refused = invocation.model_copy(
            update={"status": "denied", "error_class": error.error_class, "error_message": reason, "owner": None}
        )
        await self._store.record(refused, ("planned", "denied"), {"reason": reason, **(detail or {})})
        await self._observers.planned(refused)
        await self._observers.decided(refused)
        error.invocation_id = invocation.id
        raise error

    async def finish(
        self,
        invocation: Invocation,
        status: Status,
        *,
        result: types.CallToolResult | WireResult | None = None,
        error: BastionError | None = None,
        may_defer: bool = False,
    ) -> None:
        """Record the outcome of a call that was sent, and tell the observers. Never raises. `may_defer`: the host has
        its answer and other calls run: the outcome is recorded off this task (while `run` runs; else here), and may
        share the next call's commit; on return its write is queued in the store."""
        outcome = {
            "status": status,
            "result": _dumped(result),
            "error_class": error.error_class if error is not None else None,
            "error_message": error.message if error is not None else None,
        }
        if may_defer and self._background is not None:
            self._background.start_soon(self._recorded_shielded, invocation, outcome)
            # One turn of the loop: the record's first step (up to the store's write, queued) runs before this caller
            # goes on, so a read that follows finds the write queued (a read commits what is queued first).
            await anyio.lowlevel.checkpoint()
        else:
            await self._recorded(invocation, outcome)

    async def _recorded_shielded(self, invocation: Invocation, outcome: dict[str, Any]) -> None:
        """An outcome handed over, recorded even while `run` is cancelled (a stop waits for it)."""
        with anyio.CancelScope(shield=True):
            await self._recorded(invocation, outcome, may_defer=True)

    async def _recorded(self, invocation: Invocation, outcome: dict[str, Any], *, may_defer: bool = False) -> None:
        status = outcome["status"]
        try:
            finished = await self._record(invocation.id, outcome, may_defer=may_defer)
        except BastionError as exc:
            logger.error(
                "the outcome (%s) of invocation %s could not be recorded (%s); retrying",
                status,
                invocation.id,
                exc.message,
            )
            self._unrecorded[invocation.id] = (invocation, outcome)
            self._late.set()
            return
        if finished:
            await self._observers.finished(invocation.model_copy(update=outcome))

    async def run(self) -> None:
        """Until cancelled: record the outcomes handed over by `finish(may_defer=True)`, and offer the refused ones to
        the store again until each takes. Cancelled, it returns once the outcomes handed over are recorded."""
        async with anyio.create_task_group() as background:
            self._background = background
            try:
                await self._retry_late()
            finally:
                self._background = None  # (what comes now is recorded by its caller; the group waits for the rest)

    async def _retry_late(self) -> None:
        while True:
            await self._late.wait()
            self._late = anyio.Event()
            while self._unrecorded:
                await anyio.sleep(LATE_RECORD_SECONDS)
                for invocation_id, (invocation, outcome) in list(self._unrecorded.items()):
                    try:
                        finished = await self._record(invocation_id, outcome)
                    except BastionError:
                        continue
                    del self._unrecorded[invocation_id]
                    logger.warning("the outcome of invocation %s is recorded at last", invocation_id)
                    if finished:
                        await self._observers.finished(invocation.model_copy(update=outcome))

    async def _record(self, invocation_id: str, outcome: dict[str, Any], *, may_defer: bool = False) -> bool:
        """executing -> the outcome; False (logged) when it was no longer executing. A result the store cannot
        take is left out, saying why, so the outcome itself is never lost."""
        status, error_class, error_message = outcome["status"], outcome["error_class"], outcome["error_message"]
        try:
            finished = await self._store.finish(
                invocation_id,
                status,
                result=outcome["result"],
                error_class=error_class,
                error_message=error_message,
                may_defer=may_defer,
            )
        except BastionError:
            raise
        except Exception as exc:  # a result nothing can store (a bug of ours or a pathological value)
            logger.exception("the result of invocation %s cannot be stored; recording the outcome alone", invocation_id)
            outcome["result"] = {"_not_stored": f"the result could not be stored ({type(exc).__name__})"}
            finished = await self._store.finish(
                invocation_id, status, result=outcome["result"], error_class=error_class, error_message=error_message
            )
        if not finished:
            logger.warning("invocation %s was no longer executing when its outcome came", invocation_id)
        return finished


def _dumped(result: types.CallToolResult | WireResult | None) -> dict[str, Any] | None:
    """A result as JSON: the host server's dump of a model, the JSON itself of a forwarded result."""
    if isinstance(result, WireResult):
        return result.data
    return None if result is None else result.model_dump(by_alias=True, mode="json", exclude_none=True)
