"""The change feed of a SQLite ledger: every event, in id order, announced to whoever waits in this process.

Events have increasing ids (the rowid of `events`), and SQLite has one writer at a time, so the committed
events are always a prefix of the ids: reading `WHERE id > last` after a commit yields exactly what is new.
This process's own commits are read once the task that committed them yields while someone waits for news (one
indexed read on the writer, on the loop: a tool call's request is then on its way to the downstream); while nobody
waits they are read when asked for (`cursor`, `next`) or by `run`, at most `interval` seconds later, many at once
(no read-back per commit that nobody waits for). Other processes' commits are noticed by `run`, which
polls `PRAGMA data_version` every `interval` seconds.

`run` also checkpoints the WAL off the event loop once enough transactions accumulated, and forgets rate counts
older than the limit's window once a minute: it is the ledger's one background task.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import deque
from collections.abc import Sequence
from typing import Final

import anyio
from anyio.abc import TaskStatus

from bastion.errors import ChangesLost, LedgerUnavailable
from bastion.ledger.limits import WINDOW_SECONDS
from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.ledger.sqlite.limits import forget_counts
from bastion.models import Change, utcnow

logger = logging.getLogger(__name__)

KEPT: Final = 4096
"""How many recent changes are kept for waiters that fall behind; one further behind gets `ChangesLost`."""

_NEWER: Final = "SELECT id, invocation_id, kind FROM events WHERE id > ? ORDER BY id"
_NEWER_PAGE: Final = _NEWER + " LIMIT ?"
_NEWEST: Final = "SELECT id, invocation_id, kind FROM events WHERE id > ? ORDER BY id DESC LIMIT ?"
_LAST: Final = "SELECT COALESCE(MAX(id), 0) FROM events"


class SqliteFeed:
    """Satisfies `bastion.pipeline.seams.ChangeFeed` for one SQLite ledger file."""

    def __init__(self, db: SqliteDatabase, *, start: int) -> None:
        """`start`: the newest event id when the ledger was opened (changes before it are not announced)."""
        self._db = db
        self._recent: deque[Change] = deque()
        self._cursor = start
        self._floor = start
        """Changes after it are kept: the id of the newest one dropped (ids have gaps: the records' events of the
        chain, bastion.ledger.kept, take positions the feed never announces)."""
        self._arrived = anyio.Event()
        db.on_commit(self._read_new, waiting=self._someone_waits)

    @classmethod
    async def open(cls, db: SqliteDatabase) -> SqliteFeed:
        row = await db.fetchone(_LAST)
        return cls(db, start=int(row[0]))

    @property
    def cursor(self) -> int:
        """The id of the newest change announced so far (every commit of this process's included)."""
        self._db.tell_now()
        return self._cursor

    async def next(self, after: int) -> Sequence[Change]:
        """The changes after id `after`, oldest first, waiting for the first of them. Raises ChangesLost when
        some of them are no longer kept, or when `after` is beyond every event of the file (a cursor of another
        ledger, or of this one before a restore: waiting would never end)."""
        if after > self._cursor:
            # A cursor read from the file (`since`) may be ahead of what was announced: catch up on the writer,
            # which sees every commit. Whatever is still ahead was never issued by this ledger.
            await self._db.read_on_writer(self._read_new)
            if after > self._cursor:
                raise ChangesLost(
                    f"cursor {after} is beyond the newest change of this ledger ({self._cursor}); "
                    "re-read what you watch and continue from the feed's cursor"
                )
        while after >= self.cursor:  # (reading the cursor reads this process's commits not read yet)
            await self._arrived.wait()
        if after < self._floor:
            raise ChangesLost(f"changes after {after} are no longer kept (the oldest kept follows {self._floor})")
        return [change for change in self._recent if change.id > after]

    async def since(self, after: int, *, limit: int = 1000) -> list[Change]:
        """At most `limit` changes after id `after`, read from the file: what a resumed stream of events needs."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        rows = await self._db.fetchall(_NEWER_PAGE, (after, limit))
        return [Change(id=row[0], invocation_id=row[1], kind=row[2]) for row in rows]

    async def run(self, interval: float = 0.05, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled, notice commits of other connections and announce their events; checkpoint the WAL
        when due. `task_group.start(feed.run)` returns once the first data_version is read and what other
        connections committed before it is announced, so no commit of theirs is missed."""
        seen = await self._db.data_version()
        await self._db.read_on_writer(self._read_new)
        task_status.started()
        forget_at = anyio.current_time()
        while True:
            with anyio.move_on_after(interval):
                await self._db.checkpoint_due.wait()
            if self._db.checkpoint_due.is_set():
                await self._db.checkpoint()
            if anyio.current_time() >= forget_at:
                forget_at = anyio.current_time() + WINDOW_SECONDS
                try:
                    await forget_counts(self._db, utcnow())
                except LedgerUnavailable as exc:  # upkeep only: announcing changes matters more
                    logger.warning("old rate counts could not be forgotten: %s", exc.message)
            self._db.tell_now()  # this process's commits that nobody waited for: read while few
            version = await self._db.data_version()
            if version != seen:
                seen = version
                await self._db.read_on_writer(self._read_new)

    def _someone_waits(self) -> bool:
        return self._arrived.statistics().tasks_waiting > 0

    def _read_new(self, conn: sqlite3.Connection) -> None:
        """Announce the events committed since the last one announced (on the loop, on the writer)."""
        # Newest first, at most what is kept: a backlog nobody waited for may be long, and what is beyond the kept
        # changes would only be read to be dropped (a waiter behind them is told to re-read: `ChangesLost`).
        rows = conn.execute(_NEWEST, (self._cursor, KEPT)).fetchall()
        if not rows:
            return
        rows.reverse()
        if len(rows) == KEPT:  # older ones may have been left unread: they are lost to a waiter behind them
            self._floor = max(self._floor, rows[0][0] - 1)
        self._recent.extend(Change(id=row[0], invocation_id=row[1], kind=row[2]) for row in rows)
        while len(self._recent) > KEPT:
            self._floor = self._recent.popleft().id
        self._cursor = rows[-1][0]
        if self._arrived.statistics().tasks_waiting:  # (`next` reads the cursor before it waits)
            arrived, self._arrived = self._arrived, anyio.Event()
            arrived.set()
