"""The change feed of a PostgreSQL ledger: every event, in id order, announced exactly once to whoever waits in this
process, whichever instance committed it.

Event ids come from a sequence, so they have gaps (an insert rolled back, a server crash) and commit out of order
(the transaction that took id 11 may commit after the one that took 12). The feed's cursor is therefore a
horizon: every event up to it that will ever commit has been announced (or came before the feed opened). Reading
what is above it, the feed announces the events that follow it without a gap; a missing id (a gap) holds back
everything after it until the transaction that took it commits (then it is announced, in its place) or is known
to have ended without it. That is known once every transaction that was running when the gap was first read
has ended (the xmin of a later snapshot reached that read's xmax: the writer took its id after writing the
invocation, so it had a transaction id by then), or, as a last resort, `GAP_GRACE` seconds later (no
transaction of a Bastion instance lives that long after taking an id, but an unrelated long transaction elsewhere
in the cluster would hold the xmin back). So each change is announced once, and an invocation's changes in the
order they happened (they change one row, one transaction after another). A transaction that was running when
the feed opened and took an id below the newest one then counts as before the opening.

This process's commits are announced as they commit (at once when they follow the horizon); other instances'
when their NOTIFY reaches `run`'s listening connection (no polling on that path). Should that connection drop,
`run` polls every `FALLBACK_POLL` seconds while it reconnects with backoff. `run` also forgets old rate counts
once a minute.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import anyio
import psycopg
from anyio.abc import TaskStatus

from bastion.errors import ChangesLost, LedgerUnavailable
from bastion.ledger.limits import WINDOW_SECONDS
from bastion.ledger.postgres.database import CHANNEL, Connection, PostgresDatabase, connect
from bastion.ledger.postgres.limits import forget_counts
from bastion.models import Change, utcnow

logger = logging.getLogger(__name__)

KEPT: Final = 4096
"""How many recent changes are kept for waiters that fall behind; one further behind gets `ChangesLost`."""
GAP_GRACE: Final = 60.0
"""Seconds after which a gap is given up whatever the snapshots say (beyond the statement and idle-in-transaction
timeouts a Bastion transaction runs under)."""
GAP_POLL: Final = 0.02
"""While a gap holds changes back, how often it is read again (its writer may have rolled back: no NOTIFY)."""
FALLBACK_POLL: Final = 0.25
"""How often the feed reads while its listening connection is down."""
IDLE_CHECK: Final = 5.0
"""With no notification for this long, the listening connection is checked (a dead one is replaced)."""
RECONNECT_MIN: Final = 0.5
RECONNECT_MAX: Final = 10.0
LISTENER_NAME: Final = "bastion-changes"
"""How the listening connection is known to the server (`application_name`)."""
_PAGE: Final = 1000

_NEWER: Final = """
    SELECT event.id, event.invocation_id, event.kind,
           pg_snapshot_xmin(snapshot.now)::text, pg_snapshot_xmax(snapshot.now)::text
    FROM (SELECT pg_current_snapshot() AS now) AS snapshot
    LEFT JOIN LATERAL (
        SELECT id, invocation_id, kind FROM events WHERE id > %s ORDER BY id LIMIT %s
    ) AS event ON true
    ORDER BY event.id
"""
_STORED: Final = "SELECT id, invocation_id, kind FROM events WHERE id > %s AND id <= %s ORDER BY id LIMIT %s"
_LAST: Final = "SELECT COALESCE(MAX(id), 0) FROM events"


@dataclass
class _Gap:
    """Ids found missing (first..last) by a read whose snapshot's xmax was `xmax`, at `seen` (anyio's clock)."""

    first: int
    last: int
    xmax: int
    seen: float


class PostgresFeed:
    """Satisfies `bastion.pipeline.seams.ChangeFeed` for one PostgreSQL ledger."""

    def __init__(self, db: PostgresDatabase, *, start: int) -> None:
        """`start`: the newest event id when the ledger was opened (changes up to it are not announced)."""
        self._db = db
        self._recent: deque[Change] = deque()
        self._cursor = start
        self._floor = start
        """Changes after this id are all kept (older ones were dropped, or came before the opening)."""
        self._arrived = anyio.Event()
        self._gaps: list[_Gap] = []
        self._blocked = False
        """Whether the last read stopped at a gap that may still fill."""
        self._reading = anyio.Lock()
        self._requested = 0
        self._satisfied = 0
        db.on_commit(self._committed)

    @classmethod
    async def open(cls, db: PostgresDatabase) -> PostgresFeed:
        row = await db.fetchone(_LAST)
        return cls(db, start=int(row[0]) if row is not None else 0)

    @property
    def cursor(self) -> int:
        """The id of the newest change announced so far."""
        return self._cursor

    async def next(self, after: int) -> Sequence[Change]:
        """The changes after id `after`, oldest first, waiting for the first of them. Raises ChangesLost when some
        of them are no longer kept, or when `after` is beyond every event of the database (a cursor of another
        ledger, or of this one before a restore: waiting would never end)."""
        if after > self._cursor:
            await self.catch_up()
            if after > self._cursor:
                row = await self._db.fetchone(_LAST)
                newest = int(row[0]) if row is not None else 0
                if after > newest:
                    raise ChangesLost(
                        f"cursor {after} is beyond the newest change of this ledger ({newest}); "
                        "re-read what you watch and continue from the feed's cursor"
                    )
        while after >= self._cursor:
            await self._news(poll=self._blocked or after > self._cursor)
        if after < self._floor:
            raise ChangesLost(f"changes after {after} are no longer kept (the oldest kept follows {self._floor})")
        return [change for change in self._recent if change.id > after]

    async def since(self, after: int, *, limit: int = 1000) -> list[Change]:
        """At most `limit` changes after id `after`, read from the database up to the horizon (so a stream that
        resumes from the last one it got misses nothing that commits later)."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        await self.catch_up()
        rows = await self._db.fetchall(_STORED, (after, self._cursor, limit))
        return [Change(id=row[0], invocation_id=row[1], kind=row[2]) for row in rows]

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled, announce what other instances commit, as their notifications arrive; when the listening
        connection drops, poll while reconnecting with backoff. `task_group.start(feed.run)` returns once it
        listens and what was committed before is announced (or, the listener failing, once it polls)."""
        started = False
        delay = RECONNECT_MIN
        forget_at = anyio.current_time()
        while True:
            try:
                listener = await connect(self._db.url, name=LISTENER_NAME)
            except psycopg.Error as exc:
                logger.warning("the ledger's change feed cannot listen (%s); polling meanwhile", _line(exc))
            else:
                try:
                    async with listener:
                        await listener.execute(f"LISTEN {CHANNEL}")
                        await self.catch_up()
                        if not started:
                            task_status.started()
                            started = True
                        delay = RECONNECT_MIN
                        forget_at = await self._listen(listener, forget_at)
                except (psycopg.Error, LedgerUnavailable) as exc:
                    logger.warning("the ledger's change feed lost its listener (%s); polling meanwhile", _line(exc))
            if not started:
                task_status.started()
                started = True
            with anyio.move_on_after(delay):
                forget_at = await self._poll(forget_at)
            delay = min(delay * 2, RECONNECT_MAX)

    async def _listen(self, listener: Connection, forget_at: float) -> float:
        """Read whenever a notification comes (or while a gap may fill); returns only by raising."""
        while True:
            notified = False
            async for _ in listener.notifies(timeout=GAP_POLL if self._blocked else IDLE_CHECK, stop_after=1):
                notified = True
            if notified or self._blocked:
                await self.catch_up()
            else:  # a quiet while: make sure the connection still works (shielded, as every query: see database.py)
                with anyio.CancelScope(shield=True), anyio.move_on_after(IDLE_CHECK):
                    await listener.execute("SELECT 1")
            forget_at = await self._upkeep(forget_at)

    async def _poll(self, forget_at: float) -> float:
        """Read every FALLBACK_POLL seconds, until cancelled (the listener is down)."""
        while True:
            try:
                await self.catch_up()
                forget_at = await self._upkeep(forget_at)
            except LedgerUnavailable as exc:
                logger.debug("the ledger's change feed could not read: %s", exc.message)
            await anyio.sleep(FALLBACK_POLL)

    async def _upkeep(self, forget_at: float) -> float:
        """Forget rate counts older than the window, once a minute."""
        if anyio.current_time() < forget_at:
            return forget_at
        try:
            await forget_counts(self._db, utcnow())
        except LedgerUnavailable as exc:  # upkeep only: announcing changes matters more
            logger.warning("old rate counts could not be forgotten: %s", exc.message)
        return anyio.current_time() + WINDOW_SECONDS

    async def _news(self, *, poll: bool) -> None:
        """Wait for the next announcement; polling, when asked, while a gap or a cursor ahead of the horizon
        waits for something no notification may announce."""
        arrived = self._arrived
        if not poll:
            await arrived.wait()
            return
        with anyio.move_on_after(GAP_POLL):
            await arrived.wait()
        if not arrived.is_set():
            await self.catch_up()

    async def _committed(self, changes: Sequence[Change]) -> None:
        """This process committed `changes`: announce them now, without a read when they follow the horizon."""
        ids = [change.id for change in changes]
        if not self._gaps and ids == list(range(self._cursor + 1, self._cursor + 1 + len(ids))):
            self._announce(list(changes))
        elif ids[-1] > self._cursor:
            await self.catch_up()

    async def catch_up(self) -> None:
        """Read what committed above the horizon and announce what follows it without a gap. Concurrent callers
        share a read that began after they asked."""
        self._requested += 1
        wanted = self._requested
        async with self._reading:
            if self._satisfied >= wanted:
                return
            began = self._requested
            while True:
                rows = await self._db.fetchall(_NEWER, (self._cursor, _PAGE))
                found = [Change(id=row[0], invocation_id=row[1], kind=row[2]) for row in rows if row[0] is not None]
                complete = self._advance(found, xmin=int(rows[0][3]), xmax=int(rows[0][4]))
                if not complete or len(found) < _PAGE:
                    break
            self._satisfied = began

    def _advance(self, found: list[Change], *, xmin: int, xmax: int) -> bool:
        """Announce the changes of `found` (read above the horizon, in id order) that follow the horizon without a
        gap that may still fill; False when such a gap stopped it."""
        fresh: list[Change] = []
        expected = self._cursor + 1
        self._blocked = False
        for change in found:
            if change.id < expected:
                continue  # announced meanwhile (a commit of this process)
            if change.id > expected and not self._gap_is_gone(expected, change.id - 1, xmin=xmin, xmax=xmax):
                self._blocked = True
                break
            fresh.append(change)
            expected = change.id + 1
        self._announce(fresh)
        return not self._blocked

    def _gap_is_gone(self, first: int, last: int, *, xmin: int, xmax: int) -> bool:
        """Whether ids first..last, missing from a read with this snapshot, will never commit (see the module)."""
        now = anyio.current_time()
        position = first
        while position <= last:
            gap = next((gap for gap in self._gaps if gap.first <= position <= gap.last), None)
            if gap is None:
                after = [gap.first - 1 for gap in self._gaps if gap.first > position]
                gap = _Gap(position, min([last, *after]), xmax, now)
                self._gaps.append(gap)
            if xmin < gap.xmax and now - gap.seen < GAP_GRACE:
                return False
            position = gap.last + 1
        return True

    def _announce(self, fresh: list[Change]) -> None:
        if not fresh:
            return
        self._recent.extend(fresh)
        while len(self._recent) > KEPT:
            self._floor = self._recent.popleft().id
        self._cursor = fresh[-1].id
        self._gaps = [gap for gap in self._gaps if gap.last > self._cursor]
        arrived, self._arrived = self._arrived, anyio.Event()
        arrived.set()


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
