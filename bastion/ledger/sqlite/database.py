"""One SQLite ledger file in WAL mode, shared safely between processes: its connections and its transactions.

Every write is one `BEGIN IMMEDIATE` transaction. Transitions are conditional updates
(`UPDATE ... WHERE id = ? AND status IN (...)`) under SQLite's single-writer lock, so of two racing
transitions, even from two processes, exactly one wins.

Two connections: reads run on aiosqlite's thread; writes run on a plain `sqlite3` connection, right on the
event loop while nobody else holds the write lock (a transaction of a tool call is ~50-100 µs of SQLite
work, less than the thread hand-off it saves), and in a worker thread that waits for the lock when another
connection or process holds it. A write that may wait (a call's outcome) waits for the loop's next turn, and the
writes of that turn share one transaction, each in a savepoint of its own: one commit, and the pages they share
written once; any other write runs at once and takes the waiting ones along. A write that may be deferred (the
outcome of a call that ended while others run) waits longer: for the next write that may not wait (the next call's
intent, typically), at most `DEFER_SECONDS`; a read on this process, and closing, commit it first.

Nothing on the event loop ever waits for a lock or an fsync: the writer never waits (busy_timeout 0 on the loop), and
it leaves checkpoints (the fsyncs) to `SqliteFeed.run`. The change feed reads a commit made on the loop back once the
committing task yields (a tool call: once its request has left for the downstream).

SQLite failures of a running ledger (a full disk, an I/O error, a lock held for too long) surface as
`LedgerUnavailable`, a retriable Bastion error, never as a raw `sqlite3` error.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import aiosqlite
import anyio

from bastion.errors import BastionError, ConfigError, LedgerUnavailable
from bastion.ledger.sqlite.news import CommitListener, CommitNews
from bastion.ledger.sqlite.schema import migrate, register_functions, register_functions_async
from bastion.ledger.timing import CommitTimes

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_WAL_ATTEMPTS: Final = 10
_BUSY_TIMEOUT_MS: Final = 5000
CHECKPOINT_AFTER: Final = 200
"""The WAL is checkpointed (off the event loop) once the writer has committed this many transactions: a tool
call commits twice, about 8 pages each, so the WAL stays near 6 MiB."""
DEFER_SECONDS: Final = 0.02
"""How long a deferred write waits at most for a write that commits sooner to take it along (see `write`)."""
_WRITER_AUTOCHECKPOINT: Final = 10_000
"""WAL pages after which the writer checkpoints by itself: a bound for processes that never run the feed."""
_MIN_SQLITE: Final = (3, 35, 0)

_PRAGMAS: Final = (
    # Wait up to 5 s for another process's lock instead of failing at once.
    f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}",
    # In WAL mode NORMAL syncs only at checkpoints: a committed transaction survives the process being
    # killed (it is in the WAL file), and only an OS crash or power loss can lose the last few commits,
    # never corrupt the file. FULL would add an fsync to every tool call.
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
)

_BUSY: Final = object()
"""What `SqliteDatabase._on_loop` returns when another connection holds the write lock (and a batched write gets
when its transaction could not begin on the loop)."""


@dataclass(slots=True)
class _Batched:
    """A write waiting for the loop's next shared transaction (see `SqliteDatabase._commit_batch`)."""

    work: Callable[[sqlite3.Connection], Any]
    events: bool
    started: float
    done: asyncio.Future[Any]


class SqliteDatabase:
    """The two connections to one migrated ledger file, and the one way to write to it."""

    def __init__(self, db: aiosqlite.Connection, writer: sqlite3.Connection, path: Path) -> None:
        """Use `SqliteDatabase.open`; this only wraps already configured connections to a migrated file."""
        self._db = db
        self._writer = writer
        self._writer_busy = anyio.Lock(fast_acquire=True)
        """Held while a worker thread uses the writer (waiting for another connection's lock), and by the writes
        queued behind it. Taken without a checkpoint when free: a read on the writer holds it within one step."""
        self._batch: list[_Batched] = []
        """The writes for the transaction the loop begins next (`_commit_batch`)."""
        self._deferred: asyncio.TimerHandle | None = None
        """The commit of a batch of deferred writes only, due once the first has waited `DEFER_SECONDS`."""
        self.path = path
        self.uncheckpointed = 0
        self.checkpoint_due = anyio.Event()
        self._news = CommitNews(path)
        self._closed = False
        self._in_worker = False
        """A worker thread is using the writer (nothing else may touch it until it is done)."""
        self.commits = CommitTimes("sqlite")
        """How long each write took to commit (`/metrics`)."""

    @classmethod
    async def open(cls, path: Path) -> SqliteDatabase:
        """Open (creating if needed) and migrate the ledger at `path`. Raises ConfigError if it is unusable."""
        db, writer = await _connections(path)
        return cls(db, writer, path)

    async def close(self) -> None:
        """Close both connections, even when cancelled, and safe to call twice. The last one out checkpoints."""
        with anyio.CancelScope(shield=True):
            self.commit_deferred()
            async with self._writer_busy:
                self._closed = True
                self._writer.close()
            await self._db.close()

    def on_commit(self, listener: CommitListener, *, waiting: Callable[[], bool] | None = None) -> None:
        """Tell `listener` of commits that changed something. With `waiting`, commits made on the loop are told
        only while it answers True (someone waits for news), else when asked (`tell_now`): no read-back per
        commit that nobody waits for."""
        self._news.add(listener, waiting)

    # -- reads ---------------------------------------------------------------------------------------------

    async def fetchall(self, sql: str, params: Iterable[Any] | dict[str, Any] = ()) -> builtins.list[Any]:
        """All rows of one read, on aiosqlite's thread (after the deferred writes are committed). LedgerUnavailable
        once it was closed (a watcher still reading while the process stops)."""
        if self._closed:
            raise LedgerUnavailable(f"the ledger {self.path} is closed; nothing was read")
        self.commit_deferred()
        try:
            return builtins.list(await self._db.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc

    async def fetchone(self, sql: str, params: Iterable[Any] | dict[str, Any] = ()) -> Any:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def data_version(self) -> int:
        """The writer's view of `data_version`: it changes with every commit by another connection. The
        query reads shared memory and takes no lock, so it runs on the loop unless a worker has the writer."""
        self.commit_deferred()
        async with self._writer_busy:
            try:
                return int(self._writer.execute("PRAGMA data_version").fetchone()[0])
            except sqlite3.Error as exc:
                raise _unavailable(self.path, exc) from exc

    async def read_on_writer(self, read: Callable[[sqlite3.Connection], _T]) -> _T:
        """A short read on the writer connection, on the loop (it sees every commit, its own included, and the
        deferred writes, committed first)."""
        self.commit_deferred()
        async with self._writer_busy:
            try:
                return read(self._writer)
            except sqlite3.Error as exc:
                raise _unavailable(self.path, exc) from exc

    async def checkpoint(self) -> None:
        """Copy the committed WAL pages into the database file, on aiosqlite's thread: a checkpoint syncs
        the files, which the event loop must not wait for. PASSIVE: it never waits for other connections,
        and the WAL is reused from its start once every reader has moved past it."""
        self.checkpoint_due = anyio.Event()
        self.uncheckpointed = 0
        try:
            await self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc

    # -- writes --------------------------------------------------------------------------------------------

    async def write(
        self,
        work: Callable[[sqlite3.Connection], _T],
        *,
        events: bool = True,
        may_wait: bool = False,
        may_defer: bool = False,
    ) -> _T:
        """Run `work` in one `BEGIN IMMEDIATE` transaction on the writer; if it changed anything, tell the
        commit listeners (the change feed).

        First on the event loop, where taking the write lock never waits: when no other connection holds
        it, the whole transaction runs here, without a thread hand-off: at once, with the writes waiting for the
        loop's next turn, or (`may_wait`) at that turn, with the writes that arrive before it (each in a savepoint:
        one's failure rolls back only its own work). A caller that may wait and is cancelled before that turn writes
        nothing; one cancelled after it gets its write's outcome, and the cancellation at its next await, as if the
        write had run in its own step. When the lock is taken (SQLITE_BUSY)
        the transaction, rolled back if it had begun, runs again in a worker thread that waits for the lock
        up to busy_timeout; writes arriving meanwhile queue behind it, and each runs on the loop again once the
        writer is its own, in a thread only if the other connection still holds the lock. `may_defer` (implies
        `may_wait`): the write waits past the loop's turn, for the next write that may not wait, at most `DEFER_SECONDS`
        (the outcome of a call that ended while others run: it commits with the next call's intent, one commit for
        both); reads on this process and `close` commit it first. `work` touches nothing but the
        connection, so running it twice is safe. A cancelled caller cannot leave a transaction half-open:
        the worker's run is shielded, and the caller is cancelled at its next checkpoint.

        A BastionError raised by `work` (a conflict, say) passes through after the rollback; any other SQLite
        failure is `LedgerUnavailable`. `events=False` says `work` appends no event: the listeners are not told.
        """
        started = time.perf_counter()
        try:
            if not self._in_worker:
                if may_wait or may_defer:
                    done = await self._batched(work, events, started, may_defer)
                else:
                    done = self._now(work, events, started)
                if done is not _BUSY:
                    return cast(_T, done)
            async with self._writer_busy:
                # The writer is ours now: on the loop again first, so that one busy moment (another connection's
                # lock) does not send every write queued behind it to a thread.
                done = self._on_loop(work, events, started)
                if done is not _BUSY:
                    return cast(_T, done)
                changes = self._writer.total_changes
                self._in_worker = True
                try:
                    with anyio.CancelScope(shield=True):
                        result = await anyio.to_thread.run_sync(_wait_and_write, self._writer, work)
                finally:
                    self._in_worker = False
                self.commits.committed(started)
                if self._committed(changes, events) or self._news.untold:
                    self._news.tell(self._writer)  # still holding the writer: listeners read on it
            return result
        except (sqlite3.IntegrityError, BastionError):
            raise
        except sqlite3.Error as exc:
            raise _unavailable(self.path, exc) from exc

    async def _batched(
        self, work: Callable[[sqlite3.Connection], _T], events: bool, started: float, deferred: bool
    ) -> _T | object:
        """`work` in the loop's next transaction (`_commit_batch`), or `_BUSY` when that could not begin. A `deferred`
        write that finds no transaction due opens a batch due in `DEFER_SECONDS`; a write that may not be deferred
        makes a deferred batch due at the loop's next turn."""
        loop = asyncio.get_running_loop()
        batched = _Batched(work, events, started, loop.create_future())
        if not self._batch:
            if deferred:
                self._deferred = loop.call_later(DEFER_SECONDS, self._commit_batch)
            else:
                loop.call_soon(self._commit_batch)
        elif not deferred and self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
            loop.call_soon(self._commit_batch)
        self._batch.append(batched)
        try:
            done: _T | object = await batched.done
        except asyncio.CancelledError:
            if batched.done.cancelled():
                raise  # cancelled before its turn: it was left out, nothing written
            # Its transaction ended before the cancellation reached it: the write stands and its outcome is the
            # caller's; the cancellation comes at the caller's next await.
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
            task.cancel()
            done = batched.done.result()
        return done

    def _now(self, work: Callable[[sqlite3.Connection], _T], events: bool, started: float) -> _T | object:
        """`work` in a transaction right here, with the writes waiting for the loop's next turn (or `_BUSY`)."""
        batched = _Batched(work, events, started, asyncio.get_running_loop().create_future())
        self._batch.append(batched)
        self._commit_batch()
        done: _T | object = batched.done.result()
        return done

    def _commit_batch(self) -> None:
        """Run the waiting writes in one transaction, each in a savepoint when there are several, and hand each its
        outcome. When the transaction cannot begin here (a worker thread has the writer, or another connection the
        write lock) each gets `_BUSY` and takes the queue to the writer."""
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        batch = [batched for batched in self._batch if not batched.done.cancelled()]
        self._batch = []
        if not batch:
            return
        conn = self._writer
        if self._closed or self._in_worker:
            _settle([(batched, _BUSY, None) for batched in batch])
            return
        changes = conn.total_changes
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            busy = isinstance(exc, sqlite3.OperationalError) and _is_busy(exc)
            _settle([(batched, _BUSY, None) if busy else (batched, None, exc) for batched in batch])
            return
        shared = len(batch) > 1
        outcomes: list[tuple[_Batched, Any, Exception | None]] = []
        for batched in batch:
            if not conn.in_transaction:  # a failure ended the whole transaction: what it held is gone
                break
            try:
                if shared:
                    conn.execute("SAVEPOINT batched")
                result = batched.work(conn)
                if shared:
                    conn.execute("RELEASE batched")
                outcomes.append((batched, result, None))
            except Exception as exc:  # noqa: BLE001 (not swallowed: it is the write's outcome, raised to its caller)
                if shared and conn.in_transaction:
                    conn.execute("ROLLBACK TO batched")
                    conn.execute("RELEASE batched")
                outcomes.append((batched, None, exc))
        try:
            if not conn.in_transaction:  # the last write's failure ended it (the loop stops right after)
                ended = outcomes[-1][2]
                raise ended if isinstance(ended, sqlite3.Error) else sqlite3.OperationalError("the transaction ended")
            if not shared and outcomes[0][2] is not None:
                conn.execute("ROLLBACK")
            else:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:  # nothing of the batch is stored: every write fails with it
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            _settle([(batched, None, exc) for batched in batch])
            return
        stored = [batched for batched, _, exc in outcomes if exc is None]
        if stored:
            for batched in stored:
                self.commits.committed(batched.started)
            if self._committed(changes, any(batched.events for batched in stored)):
                self._news.soon(self._free_writer)
        _settle(outcomes)

    def commit_deferred(self) -> None:
        """Commit the deferred writes now, if any wait (a read that follows sees them)."""
        if self._deferred is not None:
            self._commit_batch()

    def _on_loop(self, work: Callable[[sqlite3.Connection], _T], events: bool, started: float) -> _T | object:
        """`work` in a transaction right here, unless another connection holds the write lock (`_BUSY`: nothing
        was done). The caller has the writer to itself: nobody holds `_writer_busy`, or it does."""
        changes = self._writer.total_changes
        try:
            result = _in_transaction(self._writer, work)
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise
            return _BUSY
        self.commits.committed(started)
        if self._committed(changes, events):
            self._news.soon(self._free_writer)
        return result

    def _committed(self, changes_before: int, events: bool) -> bool:
        """Count a commit towards the next checkpoint; whether the listeners are to be told of it."""
        if self._writer.total_changes == changes_before:
            return False  # nothing written (an expiry sweep that found nothing): no news, no WAL pages
        self.uncheckpointed += 1
        if self.uncheckpointed >= CHECKPOINT_AFTER:
            self.checkpoint_due.set()
        return events

    def _free_writer(self) -> sqlite3.Connection | None:
        """The writer, when nothing else uses it (no worker thread has it, not closed)."""
        return None if self._closed or self._in_worker else self._writer

    def tell_now(self) -> None:
        """Tell the listeners at once of the commits not told yet (whoever reads the feed's cursor or waits for news
        wants it exact); cheap when there are none."""
        self._news.now(self._free_writer)


async def _connections(path: Path) -> tuple[aiosqlite.Connection, sqlite3.Connection]:
    """The reading and the writing connection to the ledger at `path`, created if needed, configured and migrated.
    ConfigError if it is unusable."""
    if sqlite3.sqlite_version_info < _MIN_SQLITE:
        raise ConfigError(
            f"{path}: the ledger needs SQLite {'.'.join(map(str, _MIN_SQLITE))} or newer (for RETURNING), "
            f"this Python has {sqlite3.sqlite_version}; use a newer Python build"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(path, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise ConfigError(f"{path}: cannot open the ledger ({exc}); check the [server] ledger setting") from exc
    try:
        for pragma in _PRAGMAS:
            await db.execute(pragma)
        await _enable_wal(db, path)
        await register_functions_async(db)
        await migrate(db)
        writer = _open_writer(path)
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await db.close()
        if isinstance(exc, sqlite3.DatabaseError):
            raise ConfigError(f"{path}: not a usable ledger ({exc}); point [server] ledger at another file") from exc
        raise
    return db, writer


def _settle(outcomes: Iterable[tuple[_Batched, Any, Exception | None]]) -> None:
    """Hand each batched write its result or its exception."""
    for batched, result, exc in outcomes:
        if batched.done.done():
            continue
        if exc is not None:
            batched.done.set_exception(exc)
        else:
            batched.done.set_result(result)


def _unavailable(path: Path, exc: sqlite3.Error) -> LedgerUnavailable:
    return LedgerUnavailable(
        f"the ledger {path} failed ({exc}); nothing was recorded by this operation: check the disk and the file's "
        "permissions, then retry"
    )


async def _enable_wal(db: aiosqlite.Connection, path: Path) -> None:
    """Switch the file to WAL, which lets readers (the CLI, other gateway processes) work while one writes.

    When two connections convert a new file at once, SQLite answers one of them "database is locked" at
    once instead of waiting (to avoid a deadlock); by the time it asks again the other has finished.
    """
    for attempt in range(_WAL_ATTEMPTS):
        try:
            rows = builtins.list(await db.execute_fetchall("PRAGMA journal_mode = WAL"))
            break
        except sqlite3.OperationalError:
            if attempt == _WAL_ATTEMPTS - 1:
                raise
    if str(rows[0][0]).lower() != "wal":
        raise ConfigError(f"{path}: the ledger cannot use WAL mode (got {rows[0][0]!r}); put it on a local file system")


def _open_writer(path: Path) -> sqlite3.Connection:
    """The connection every write goes through: on the event loop it never waits for a lock (busy_timeout 0,
    see `_wait_and_write`) and leaves checkpoints to the feed, up to a bound."""
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        register_functions(writer)
        for pragma in (*_PRAGMAS, "PRAGMA busy_timeout = 0", f"PRAGMA wal_autocheckpoint = {_WRITER_AUTOCHECKPOINT}"):
            writer.execute(pragma)
    except BaseException:
        writer.close()
        raise
    return writer


def _wait_and_write(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], _T]) -> _T:
    """In a worker thread: the transaction, waiting up to busy_timeout for the write lock."""
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    try:
        return _in_transaction(conn, work)
    finally:
        conn.execute("PRAGMA busy_timeout = 0")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused because another connection holds a lock (SQLITE_BUSY or an extended form)."""
    return exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY


def _in_transaction(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], _T]) -> _T:
    """Run `work` between BEGIN IMMEDIATE and COMMIT (taking the write lock up front), rolling back on error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result
