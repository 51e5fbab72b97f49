"""Calls that wait for a human: pending invocations, heartbeats, decisions, expiry.

A held call keeps its raw arguments in memory (the ledger only has them redacted). Decisions come
from anywhere that writes the ledger — this process, the CLI, another Bastion — and the ledger's change
feed announces them: `HeldCalls` wakes on the changes of the calls it holds, not on every commit.
An approved invocation runs in its own task group, so a host that cancels or disconnects
does not stop it; the result is kept in the ledger and handed to the host if it is still waiting.

A host that sent a progress token gets a heartbeat every `heartbeat_seconds` and waits until the end. One that
sent none gets no heartbeat, and hosts time out (the MCP Inspector at 60 s): it waits at most
`wait_without_progress_seconds`, then gets `approval_pending` naming the invocation, which stays pending.
What the agent is told names the invocation and where a human decides it, never a command that decides: an
agent with a shell could run that itself.

A host that sends a held call again (its request was cancelled or timed out, or it reconnected) while the first is
undecided or running, or soon after it ended (`retry_window_seconds`), gets the first call instead of a second one:
the ledger finds the twin in the transaction that would record the retry (bastion.ledger.twins) and notes a
`retried` event on it. The retry then waits for the same decision and run (held in this process too, with its own
copy of the arguments, so this process can run the call if the one that held it stopped), or gets what the call
ended with, from the ledger (`bastion.pipeline.recorded`): a call never runs twice because it was sent twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

import anyio
import mcp_types as types
from anyio.abc import TaskGroup, TaskStatus

from bastion import states
from bastion.errors import (
    ApprovalExpired,
    ApprovalPending,
    BastionError,
    ChangesLost,
    InvalidArguments,
    LedgerUnavailable,
    NotFound,
    PendingLimit,
    UnknownOutcome,
)
from bastion.ledger.decisions import PREVIEW
from bastion.models import APPROVERS, PLUGIN_SOURCE_ID, Invocation, Preview, RetryWindow, utcnow
from bastion.pipeline.catalog import CatalogEntry
from bastion.pipeline.observer import Observers
from bastion.pipeline.recorded import recorded_result
from bastion.pipeline.seams import ChangeFeed, InvocationStore
from bastion.sources.seam import ProgressFn

logger = logging.getLogger(__name__)

Runner = Callable[[CatalogEntry, Invocation, dict[str, Any], "Progress | None"], Awaitable[types.CallToolResult]]
"""Runs a claimed (`executing`) invocation and records its outcome; raises a BastionError on failure."""

Lookup = Callable[[str, str], CatalogEntry | None]
"""Finds the catalog entry of (source_id, action_id)."""

EXECUTING: Final = states.FINISH.from_
HELD_POLL_SECONDS = 1.0
"""While calls are held, the longest `HeldCalls` goes without looking at them all (a safety net under the feed)."""
IDLE_POLL_SECONDS = 5.0
"""How often to sweep expiries and recover the work of instances that stopped (adopting what they left approved)."""
LEDGER_RETRY_SECONDS = 1.0
"""How long `HeldCalls` waits before trying again when the ledger refused it (another process held its lock long)."""

GoneFn = Callable[[Sequence[str]], Awaitable[Collection[str]]]
"""Given instances that own invocations, those that are gone (read fresh each time)."""


PendingFn = Callable[[Invocation], Coroutine[Any, Any, None]]
"""Called (concurrently with the wait) once a held invocation is recorded pending: inline approval."""


class AwaitingInput(Exception):
    """Not a refusal: the call is pending, and its host will be asked to decide in a later request."""

    def __init__(self, invocation: Invocation) -> None:
        super().__init__(f"invocation {invocation.id} is waiting for the host's answer")
        self.invocation = invocation


class Progress:
    """Monotonic progress for one host request: heartbeats while it waits, then the downstream's own."""

    def __init__(self, send: ProgressFn) -> None:
        self._send = send
        self._base = 0.0

    async def beat(self, message: str) -> None:
        self._base += 1
        await self._send(self._base, None, message)

    async def relay(self, progress: float, total: float | None, message: str | None) -> None:
        await self._send(self._base + progress, None if total is None else self._base + total, message)


@dataclass(eq=False)
class Held:
    """A call waiting for a decision in this process."""

    invocation: Invocation
    entry: CatalogEntry
    arguments: dict[str, Any]
    progress: Progress | None
    done: anyio.Event = field(default_factory=anyio.Event)
    result: types.CallToolResult | None = None
    error: BastionError | None = None
    running: bool = False
    noticed: bool = False
    """Its decision was seen here (and told to the observers, unless `attached`)."""
    attached: bool = False
    """Held here for a retry of a call another process recorded (that process tells the observers its decision)."""

    def finish(self, *, result: types.CallToolResult | None = None, error: BastionError | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class HeldCalls:
    """Holds pending calls, notices decisions and expiries, and runs what was approved."""

    def __init__(
        self,
        store: InvocationStore,
        feed: ChangeFeed,
        *,
        runner: Runner,
        lookup: Lookup,
        owner: str,
        gone_of: GoneFn,
        heartbeat_seconds: float,
        observers: Observers,
        wait_without_progress_seconds: float = math.inf,
        config_option: str = "",
    ) -> None:
        """`config_option` is what hints append to `bastion ...` to reach this configuration (` --config DIR`)."""
        self._store = store
        self._observers = observers
        self._feed = feed
        self._gone_of = gone_of
        self._runner = runner
        self._lookup = lookup
        self.owner = owner
        self.heartbeat_seconds = heartbeat_seconds
        self.wait_without_progress_seconds = wait_without_progress_seconds
        self.config_option = config_option
        self._held: dict[str, Held] = {}
        self._added = anyio.Event()
        self._last_recovery = -math.inf

    async def hold(
        self,
        invocation: Invocation,
        entry: CatalogEntry,
        arguments: dict[str, Any],
        on_progress: ProgressFn | None,
        *,
        limit: int,
        on_pending: PendingFn | None = None,
        defer: bool = False,
        approvers: int = 1,
        preview: Preview | None = None,
        retries: RetryWindow | None = None,
    ) -> types.CallToolResult:
        """Record the invocation as pending (with its `preview`, if any, in the event's detail) and block until it
        is decided, run, expired or refused. A call that needs several distinct `approvers` says so in its `pending`
        event, in the chained history where decisions and `bastion audit verify` read it.

        Raises PendingLimit (nothing recorded) when its session already has `limit` pending invocations.
        `on_pending` runs beside the wait (and is cancelled when it ends); `defer` returns at once by
        raising AwaitingInput, and a later `resume` waits instead. With `retries`, a call that retries an earlier
        one (its twin) is not recorded: it is answered as the twin is (`_attach`).
        """
        progress = Progress(on_progress) if on_progress else None
        held = Held(invocation, entry, arguments, progress)
        self._held[invocation.id] = held
        try:
            detail: dict[str, Any] = {"expires_at": str(invocation.expires_at)}
            if approvers > 1:
                detail[APPROVERS] = approvers
            if preview is not None:
                detail[PREVIEW] = preview.model_dump(mode="json")
            pending = await self._store.record_pending(
                invocation, ("planned", "pending"), detail, limit=limit, retries=retries
            )
        except BaseException:
            self._held.pop(invocation.id, None)
            raise
        if isinstance(pending, Invocation):
            self._held.pop(invocation.id, None)
            return await self._attach(pending, entry, arguments, progress, on_pending=on_pending, defer=defer)
        if pending is None:
            await self._observers.planned(invocation)
        else:
            self._held.pop(invocation.id, None)
            raise PendingLimit(
                f"session already has {pending} invocations waiting for approval (limit {limit}); "
                "wait for decisions before asking for more",
                invocation_id=invocation.id,
            )
        self._added.set()
        return await self._wait_as_asked(held, progress, on_pending=on_pending, defer=defer)

    async def _attach(
        self,
        twin: Invocation,
        entry: CatalogEntry,
        arguments: dict[str, Any],
        progress: Progress | None,
        *,
        on_pending: PendingFn | None,
        defer: bool,
    ) -> types.CallToolResult:
        """A retry of `twin` (see the module docstring): one that ended answers what it ended with; one still
        pending, approved or running is waited for, as the call that made it waits (asked inline or deferred the
        same way while it is pending)."""
        logger.info("a retry of invocation %s (%s, %s) attaches to it", twin.id, entry.key, twin.status)
        if twin.status not in states.OPEN:
            return recorded_result(twin)
        held = self._held.get(twin.id)
        if held is None:  # recorded by another process (or one that stopped): held here too, with these arguments
            held = Held(twin, entry, arguments, progress, attached=True)
            self._held[twin.id] = held
            self._added.set()
        elif progress is not None:  # the downstream's progress goes to the newest host waiting, as on `resume`
            held.progress = progress
        pending = twin.status == "pending"
        return await self._wait_as_asked(
            held, progress, on_pending=on_pending if pending else None, defer=defer and pending
        )

    async def _wait_as_asked(
        self, held: Held, progress: Progress | None, *, on_pending: PendingFn | None, defer: bool
    ) -> types.CallToolResult:
        """Wait for a held call as its host asked: deferred (AwaitingInput), with `on_pending` beside the wait, or
        just waiting; `progress` gets this host's heartbeats."""
        if defer:
            raise AwaitingInput(held.invocation)
        if on_pending is None:
            return await self._wait(held, progress)
        async with anyio.create_task_group() as beside:
            beside.start_soon(on_pending, held.invocation)
            await self._until_done(held, progress)
            beside.cancel_scope.cancel()
        return self._outcome(held)  # outside the task group

    async def resume(self, invocation_id: str, on_progress: ProgressFn | None) -> types.CallToolResult:
        """Wait again for a call this process holds (after AwaitingInput, or a host that came back)."""
        held = self._held.get(invocation_id)
        if held is None:
            raise UnknownOutcome(
                f"invocation {invocation_id} is not held by this Bastion process; ask bastion__invocation for it",
                invocation_id=invocation_id,
            )
        held.progress = Progress(on_progress) if on_progress is not None else None
        return await self._wait(held, held.progress)

    async def _wait(self, held: Held, progress: Progress | None) -> types.CallToolResult:
        await self._until_done(held, progress)
        return self._outcome(held)

    def _outcome(self, held: Held) -> types.CallToolResult:
        """The result of a call that is done; ApprovalPending for one its host could not wait for any longer."""
        if not held.done.is_set():
            raise ApprovalPending(self.pending_message(held.invocation), invocation_id=held.invocation.id)
        if held.error is not None:
            raise held.error
        assert held.result is not None
        return held.result

    async def _until_done(self, held: Held, progress: Progress | None) -> None:
        """Wait for the outcome, sending the host (its `progress`) a heartbeat every `heartbeat_seconds`; a host that
        takes no progress waits at most `wait_without_progress_seconds` (longer only if the approved call already
        runs)."""
        if progress is None:
            with anyio.move_on_after(self.wait_without_progress_seconds):
                await held.done.wait()
            if held.running:
                await held.done.wait()
            return
        message = f"invocation {held.invocation.id} ({held.entry.key}) {self.waiting_for(held.invocation.id)}"
        while not held.done.is_set():
            with anyio.move_on_after(self.heartbeat_seconds):
                await held.done.wait()
            if not held.done.is_set():
                await progress.beat(message)

    async def name_rollbacks(self, unknown: Sequence[str]) -> None:
        """Log, for each plugin call among `unknown` (just marked so), the rollback an approver can run: Bastion never
        runs it by itself."""
        for unknown_id in unknown:
            invocation = await self._store.get(unknown_id)
            if invocation is not None and invocation.source_id == PLUGIN_SOURCE_ID:
                logger.warning(
                    "invocation %s (%s) was running when its Bastion stopped; an approver can run its rollback: "
                    "`bastion invocations rollback %s%s`, or record what came of it with `bastion invocations "
                    "reconcile`",
                    unknown_id,
                    invocation.policy_key,
                    unknown_id,
                    self.config_option,
                )

    def waiting_for(self, invocation_id: str) -> str:
        """Where a human decides this invocation, as the agent that made the call is told: no command (an agent with
        a shell is not to be steered to Bastion's own), the id its approvers find it by."""
        return f"is waiting for a human approver, who finds it among the pending calls as invocation {invocation_id}"

    def pending_message(self, invocation: Invocation) -> str:
        """What a host that cannot wait any longer is told: not refused, not run, and how to get the outcome."""
        expires = f"; it expires at {invocation.expires_at:%Y-%m-%d %H:%M:%S} UTC" if invocation.expires_at else ""
        return (
            f"invocation {invocation.id} ({invocation.tool}) is pending: it {self.waiting_for(invocation.id)}. "
            f"It is not refused and has not run; do not call {invocation.tool} again. Once it is decided (and run, "
            f"if approved), bastion__invocation with invocation_id {invocation.id} returns its outcome{expires}."
        )

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Its loop: until cancelled, settle held calls as their changes arrive, sweep expiries, and
        recover the work of stopped instances."""
        async with anyio.create_task_group() as runs:
            task_status.started()
            due: set[str] | None = None
            while True:
                try:
                    for expired in await self._store.expire_due(utcnow()):
                        logger.info("invocation %s expired without a decision", expired.id)
                    # Taken before reading the held calls' state: a decision committed while they are read is
                    # announced after it, and ends the wait below at once.
                    cursor = self._feed.cursor
                    await self._settle(runs, due)
                    await self._recover(runs)
                    due = await self._wait_for_news(cursor)
                except LedgerUnavailable as exc:  # a ledger busy or down for a while must not stop the held calls
                    logger.warning(
                        "the calls held for approval could not be looked at in the ledger (%s); trying again in %s s",
                        exc.message,
                        LEDGER_RETRY_SECONDS,
                    )
                    due = None
                    await anyio.sleep(LEDGER_RETRY_SECONDS)

    async def _settle(self, runs: TaskGroup, due: set[str] | None) -> None:
        """Run the held calls (of `due`, or all) that were approved, and answer the refused ones and those another
        process ran."""
        for invocation_id, held in list(self._held.items()):
            if held.running or (due is not None and invocation_id not in due):
                continue
            current = await self._store.get(invocation_id)
            if current is None or current.status == "pending":
                continue
            if not held.noticed:
                held.noticed = True
                if not held.attached:
                    await self._observers.decided(current)
            if current.status == "approved":
                held.running = True
                runs.start_soon(self._run_held, held, name=f"approved:{invocation_id}")
                continue
            if current.status in states.OPEN:
                continue  # another process runs it (it held the call too): its outcome arrives by the feed
            self._held.pop(invocation_id, None)
            try:
                held.finish(result=recorded_result(current))
            except BastionError as refused:
                held.finish(error=refused)

    async def _recover(self, runs: TaskGroup) -> None:
        """Now and then: mark the calls of stopped instances unknown, and run what they left approved."""
        if anyio.current_time() - self._last_recovery < IDLE_POLL_SECONDS:
            return
        self._last_recovery = anyio.current_time()
        report = await self._store.recover(self._gone_of)
        if report.unknown:
            logger.warning("%d invocation(s) of a stopped instance marked unknown", len(report.unknown))
        await self.name_rollbacks(report.unknown)
        for orphan_id in report.approved:
            orphan = await self._store.get(orphan_id)
            if orphan is not None and orphan_id not in self._held:
                runs.start_soon(self._run_orphan, orphan, name=f"orphan:{orphan_id}")

    async def _wait_for_news(self, cursor: int) -> set[str] | None:
        """Wait for changes of held calls (their ids), a new held call, an expiry or the safety-net bound;
        None means: look at every held call."""
        delay = HELD_POLL_SECONDS if self._held else IDLE_POLL_SECONDS
        next_expiry = await self._store.next_expiry()
        if next_expiry is not None:
            delay = min(delay, max(0.0, (next_expiry - utcnow()).total_seconds()) + 0.001)
        with anyio.move_on_after(delay):
            if not self._held:
                self._added = anyio.Event()
                await self._added.wait()
                return None
            try:
                changes = await self._feed.next(cursor)
            except ChangesLost:
                return None
            return {change.invocation_id for change in changes}
        return None

    async def _run_held(self, held: Held) -> None:
        invocation_id = held.invocation.id
        try:
            claimed = await self._store.claim(invocation_id, owner=self.owner)
            if claimed is None:  # another process holding it too took it first: `_settle` waits for its outcome
                held.running = False
                return
            result = await self._run_claimed(claimed, held.entry, held.arguments, held.progress)
        except BastionError as exc:
            self._held.pop(invocation_id, None)
            held.finish(error=exc)
        else:
            self._held.pop(invocation_id, None)
            held.finish(result=result)

    async def _run_orphan(self, orphan: Invocation) -> None:
        """An approved invocation whose process died before running it: run it if we still can."""
        entry = self._lookup(orphan.source_id, orphan.action_id)
        try:
            if entry is None:
                raise NotFound(f"{orphan.policy_key} is no longer in the catalog", invocation_id=orphan.id)
            await self._claim_and_run(orphan, entry, orphan.args, None)
        except BastionError as exc:
            logger.warning("approved invocation %s of a stopped process did not run: %s", orphan.id, exc.message)

    async def _claim_and_run(
        self, invocation: Invocation, entry: CatalogEntry | None, arguments: Any, progress: Progress | None
    ) -> types.CallToolResult:
        claimed = await self._store.claim(invocation.id, owner=self.owner)
        if claimed is None:
            raise UnknownOutcome(
                "another Bastion process took this approved invocation; ask bastion__invocation for its outcome",
                invocation_id=invocation.id,
            )
        return await self._run_claimed(claimed, entry, arguments, progress)

    async def _run_claimed(
        self, claimed: Invocation, entry: CatalogEntry | None, arguments: Any, progress: Progress | None
    ) -> types.CallToolResult:
        """Run an invocation this process claimed (now `executing`), after the checks of `_cannot_run`."""
        problem = self._cannot_run(claimed, entry, arguments)
        if problem is not None:
            await self._store.transition(
                claimed.id,
                from_statuses=EXECUTING,
                to="failed",
                fields={"error_class": problem.error_class, "error_message": problem.message},
            )
            raise problem
        assert entry is not None
        await self._observers.executing(claimed)
        return await self._runner(entry, claimed, arguments, progress)

    def _cannot_run(self, invocation: Invocation, entry: CatalogEntry | None, arguments: Any) -> BastionError | None:
        """The checks before an approved call runs: it still exists, its args are the approved ones, not expired."""
        if entry is None:
            return NotFound(f"{invocation.policy_key} is no longer in the catalog", invocation_id=invocation.id)
        if not isinstance(arguments, dict) or not self._store.args_match(arguments, invocation.args_hash):
            return InvalidArguments(
                "the approved arguments are not available unredacted (they held secrets the ledger does not keep, "
                "and the Bastion process that had them stopped); ask the agent to make the call again",
                invocation_id=invocation.id,
            )
        if invocation.expires_at is not None and utcnow() > invocation.expires_at + timedelta(seconds=1):
            return ApprovalExpired(f"the approval came after {invocation.expires_at}", invocation_id=invocation.id)
        return None
