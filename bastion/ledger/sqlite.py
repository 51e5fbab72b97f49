"""The SQLite ledger: one file in WAL mode, shared safely between processes.

Open it with `ledger = await SqliteLedger.open(path, redactor=...)` and release it with
`await ledger.close()`, or let `async with await SqliteLedger.open(...) as ledger:` do the closing.

Every write method is one transaction. Transitions are conditional updates
(`UPDATE ... WHERE id = ? AND status IN (...)`) under SQLite's single-writer lock, so of two racing
transitions, even from two processes, exactly one wins.

Two connections: reads run on aiosqlite's thread; writes run on a plain `sqlite3` connection, right on the
event loop while nobody else holds the write lock (a transaction of a tool call is ~50-100 µs of SQLite
work, less than the thread hand-off it saves), and in a worker thread that waits for the lock when another
connection or process holds it. Nothing on the event loop ever waits for a lock or an fsync: the writer
never waits (busy_timeout 0 on the loop), and it leaves checkpoints (the fsyncs) to `watch`.

Change notification: `wait_for_change()` returns after the next commit this object sees. Its own writes
wake the waiters right after they commit (when they changed something); commits by other connections
(the CLI deciding in another process) are noticed by `watch()`, which the owner runs in a task group and
which polls `PRAGMA data_version`. `commits_seen` counts them, so a waiter that read the state it waits
on first cannot miss a commit that landed in between (`wait_for_change(after=...)`).
"""

from __future__ import annotations

import builtins
import json
import sqlite3
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

import aiosqlite
import anyio
from anyio.abc import TaskStatus

from bastion.errors import ApprovalExpired, ConfigError, Conflict, NotFound
from bastion.ledger import pins as pin_table
from bastion.ledger import tokens as token_table
from bastion.ledger.invocations import (
    APPEND_EVENT,
    COLUMNS,
    COUNT,
    COUNT_FILTERS,
    COUNT_PENDING,
    DECIDE,
    EXPIRE_DUE,
    EXPIRE_ONE,
    FINISH,
    INSERT_EVENT,
    INSERT_INVOCATION,
    LIST_FILTERS,
    MARK_UNKNOWN,
    NEVER_STARTED,
    NEWEST_FIRST,
    NEXT_EXPIRY,
    OWNERS,
    PROCESS_STOPPED,
    SELECT,
    SELECT_EVENTS,
    SELECT_ONE,
    SELECT_STATUS,
    TRANSITION,
    TRANSITION_FIELDS,
    event_params,
    invocation_from_row,
)
from bastion.ledger.redaction import Redactor
from bastion.ledger.schema import dumps, migrate, optional_timestamp, timestamp
from bastion.models import (
    EventKind,
    Invocation,
    InvocationEvent,
    Pin,
    Principal,
    RecoveryReport,
    Role,
    Status,
    TokenInfo,
    utcnow,
)

_T = TypeVar("_T")

_WAL_ATTEMPTS: Final = 10
_BUSY_TIMEOUT_MS: Final = 5000
_CHECKPOINT_AFTER: Final = 200
"""`watch` checkpoints the WAL (off the event loop) once the writer has committed this many transactions: a tool
call commits twice, about 8 pages each, so the WAL stays near 6 MiB."""
_WRITER_AUTOCHECKPOINT: Final = 10_000
"""WAL pages after which the writer checkpoints by itself: a bound for processes that never run `watch`."""
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


class SqliteLedger:
    """The invocation store on a local SQLite file; satisfies `bastion.seams.Ledger` structurally.

    Args, results, error messages and event details pass through `redactor.scrub` before they are stored.
    Pins and the drift diffs of invocations are stored verbatim (see `bastion.ledger.pins`).
    Tokens are stored as the SHA-256 of their secret only (see `bastion.ledger.tokens`).
    """

    def __init__(self, db: aiosqlite.Connection, writer: sqlite3.Connection, path: Path, redactor: Redactor) -> None:
        """Use `SqliteLedger.open`; this only wraps already configured connections to a migrated file."""
        self._db = db
        self._writer = writer
        self._writer_busy = anyio.Lock()
        """Held while a worker thread uses the writer (waiting for another connection's lock)."""
        self._uncheckpointed = 0
        self._checkpoint_due = anyio.Event()
        self.path = path
        self.redactor = redactor
        self._changed = anyio.Event()
        self._commits_seen = 0

    @classmethod
    async def open(cls, path: Path, *, redactor: Redactor) -> SqliteLedger:
        """Open (creating if needed) and migrate the ledger at `path`. Raises ConfigError if it is unusable."""
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
            await migrate(db)
            writer = _open_writer(path)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await db.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise ConfigError(
                    f"{path}: not a usable ledger ({exc}); point [server] ledger at another file"
                ) from exc
            raise
        return cls(db, writer, path, redactor)

    async def close(self) -> None:
        """Close both connections, even when cancelled, and safe to call twice. The last one out checkpoints.

        Cancel `watch` first: it polls the connections.
        """
        with anyio.CancelScope(shield=True):
            async with self._writer_busy:
                self._writer.close()
            await self._db.close()

    async def __aenter__(self) -> SqliteLedger:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- writes ------------------------------------------------------------------------------------------

    async def record(
        self, invocation: Invocation, events: Sequence[EventKind], detail: Mapping[str, Any] | None = None
    ) -> None:
        """Insert a new invocation and its first events (seq 1..n, one timestamp) in one transaction.

        `detail` goes on the last event: it describes the state the invocation was recorded in (e.g. the
        reason of a `denied`). Raises Conflict if an invocation with this id already exists.
        """
        row = self._invocation_row(invocation)
        at = timestamp(utcnow())
        last = len(events)
        event_rows = [
            (invocation.id, seq, kind, at, self._detail(detail if seq == last else None))
            for seq, kind in enumerate(events, start=1)
        ]

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(INSERT_INVOCATION, row)
            conn.executemany(INSERT_EVENT, event_rows)

        try:
            await self._write(work)
        except sqlite3.IntegrityError as exc:
            raise Conflict(f"invocation {invocation.id} is already recorded", invocation_id=invocation.id) from exc

    async def transition(
        self,
        invocation_id: str,
        *,
        from_statuses: Collection[Status],
        to: Status,
        event: EventKind | None = None,
        detail: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> Invocation | None:
        """Move an invocation to `to` if its status is one of `from_statuses`, set `fields` and append the
        event (default kind: `to`), all in one transaction.

        Returns the updated invocation, or None when the condition did not hold or the id is unknown.
        Raises ValueError for a field outside `TRANSITION_FIELDS`.
        """
        fields = fields or {}
        unknown = set(fields) - set(TRANSITION_FIELDS)
        if unknown:
            raise ValueError(f"transition cannot set {sorted(unknown)}; allowed: {', '.join(TRANSITION_FIELDS)}")
        now = timestamp(utcnow())
        params: dict[str, Any] = {
            "id": invocation_id,
            "to": to,
            "now": now,
            "from_statuses": json.dumps(builtins.list(from_statuses)),
        }
        for name in TRANSITION_FIELDS:
            params[f"set_{name}"] = name in fields
            params[name] = self._field_value(name, fields[name]) if name in fields else None
        event_params = {"id": invocation_id, "kind": event or to, "at": now, "detail": self._detail(detail)}

        def work(conn: sqlite3.Connection) -> Sequence[Any] | None:
            rows = conn.execute(TRANSITION, params).fetchall()
            if not rows:
                return None
            conn.execute(APPEND_EVENT, event_params)
            row: Sequence[Any] = rows[0]
            return row

        updated = await self._write(work)
        return None if updated is None else invocation_from_row(updated)

    async def finish(
        self,
        invocation_id: str,
        to: Status,
        *,
        result: Any = None,
        error_class: str | None = None,
        error_message: str | None = None,
    ) -> bool:
        """Record the outcome of a call that ran: executing -> `to`, with its result and error, and the event,
        in one transaction. False when it was no longer executing (recovery marked it unknown meanwhile)."""
        now = timestamp(utcnow())
        params = {
            "id": invocation_id,
            "to": to,
            "now": now,
            "result": self._json(result),
            "error_class": error_class,
            "error_message": self._text(error_message),
        }
        event = event_params(invocation_id, to, now)

        def work(conn: sqlite3.Connection) -> bool:
            if conn.execute(FINISH, params).rowcount == 0:
                return False
            conn.execute(APPEND_EVENT, event)
            return True

        return await self._write(work)

    async def decide(
        self, invocation_id: str, *, approve: bool, principal: str | None, note: str | None, now: datetime
    ) -> Invocation:
        """An approver's decision on a pending invocation, in one transaction: `approved` (event detail
        `{"by", "note"}`) or `denied` (`{"by", "reason"}`, error class `approval_denied`). `now` stamps it.

        Raises NotFound for an unknown id; ApprovalExpired when it is pending but past its expires_at, after
        marking it `expired` in the same transaction; Conflict when it is no longer pending (whoever
        decided first won), naming its status.
        """
        at = timestamp(now)
        to: Literal["approved", "denied"] = "approved" if approve else "denied"
        detail = {"by": principal, "note" if approve else "reason": note}
        denied_by = f"denied by {principal or 'an approver'}"
        params = {
            "id": invocation_id,
            "to": to,
            "now": at,
            "approve": approve,
            "error_message": self._text(denied_by if note is None else f"{denied_by}: {note}"),
        }
        decided_event = event_params(invocation_id, to, at, self._detail(detail))

        def work(conn: sqlite3.Connection) -> tuple[Sequence[Any], bool]:
            """The updated row, and whether it expired instead of being decided."""
            decided = conn.execute(DECIDE, params).fetchall()
            if decided:
                conn.execute(APPEND_EVENT, decided_event)
                return decided[0], False
            found = conn.execute(SELECT_STATUS, (invocation_id,)).fetchone()
            if found is None:
                raise NotFound(f"no invocation {invocation_id}", invocation_id=invocation_id)
            if found[0] != "pending":
                raise Conflict(f"invocation {invocation_id} is already {found[0]}", invocation_id=invocation_id)
            # Pending, yet the decision did not apply: it is past its expiry.
            expired = conn.execute(EXPIRE_ONE, {"id": invocation_id, "now": at}).fetchall()
            conn.execute(APPEND_EVENT, event_params(invocation_id, "expired", at))
            return expired[0], True

        row, expired = await self._write(work)
        invocation = invocation_from_row(row)
        if expired:
            raise ApprovalExpired(
                f"invocation {invocation_id} expired at {invocation.expires_at} before a decision",
                invocation_id=invocation_id,
            )
        return invocation

    async def expire_due(self, now: datetime) -> builtins.list[Invocation]:
        """Mark every pending invocation whose expires_at <= now as `expired` in one transaction; return them
        sorted by expiry."""
        at = timestamp(now)

        def work(conn: sqlite3.Connection) -> builtins.list[Sequence[Any]]:
            rows: builtins.list[Sequence[Any]] = conn.execute(EXPIRE_DUE, {"now": at}).fetchall()
            conn.executemany(APPEND_EVENT, [event_params(row[0], "expired", at) for row in rows])
            return rows

        expired = [invocation_from_row(row) for row in await self._write(work)]
        return sorted(expired, key=lambda invocation: (invocation.expires_at, invocation.id))

    async def claim(self, invocation_id: str, *, owner: str) -> Invocation | None:
        """Take an approved invocation to run it: approved -> executing, owned by `owner`. Of several
        claimers exactly one gets the invocation; the others (and any claim of a non-approved one) get None."""
        approved: tuple[Status] = ("approved",)
        return await self.transition(invocation_id, from_statuses=approved, to="executing", fields={"owner": owner})

    async def recover(self, instance_alive: Callable[[str], bool]) -> RecoveryReport:
        """On start-up: every `executing` invocation whose owner is not alive becomes `unknown` (its outcome
        cannot be known); report the approved ones whose owner is not alive (oldest first: they never
        started, claim and run them) and how many are pending (kept with their expiry).

        A missing owner counts as not alive. `instance_alive` is asked once per distinct owner.
        """
        owners = await self._db.execute_fetchall(OWNERS)
        # An owner that was gone when asked stays gone (instance ids are never reused), so the answer
        # still holds in the transaction below even if other rows changed meanwhile.
        gone = dumps([owner for (owner,) in owners if not instance_alive(owner)])
        at = timestamp(utcnow())
        reason = {"reason": PROCESS_STOPPED}

        def work(conn: sqlite3.Connection) -> RecoveryReport:
            params = {"gone": gone, "now": at, "reason": PROCESS_STOPPED}
            unknown = [row[0] for row in conn.execute(MARK_UNKNOWN, params).fetchall()]
            conn.executemany(APPEND_EVENT, [event_params(id_, "unknown", at, dumps(reason)) for id_ in unknown])
            return RecoveryReport(
                unknown=sorted(unknown),
                approved=[row[0] for row in conn.execute(NEVER_STARTED, {"gone": gone}).fetchall()],
                pending=conn.execute(COUNT_PENDING).fetchone()[0],
            )

        return await self._write(work)

    async def save_pin(self, pin: Pin) -> None:
        """Insert or replace the pin of (source_id, action_id), drift included."""

        def work(conn: sqlite3.Connection) -> None:
            pin_table.save_pin(conn, pin)

        await self._write(work)

    async def accept_drift(
        self, *, source_id: str, action_id: str | None = None, principal: str | None
    ) -> builtins.list[Pin]:
        """Re-pin the drifted action `action_id`, or every drifted action of the source, to its drifted
        definition, in one transaction: pinned := drift, drift := none, pinned_by := principal.

        Returns the accepted pins (none when nothing had drifted). Raises NotFound when `action_id` names
        no pin.
        """

        def work(conn: sqlite3.Connection) -> builtins.list[Pin]:
            return pin_table.accept_drift(conn, source_id=source_id, action_id=action_id, principal=principal)

        return await self._write(work)

    async def create_token(self, name: str, *, role: Role, profile: str | None, now: datetime) -> str:
        """Store a new token created at `now` and return its secret: the only time it exists outside the
        caller, since the ledger keeps just its SHA-256.

        Raises ValueError for a malformed name, an unknown role or a profile on a non-agent token, and
        Conflict when an active token already has the name.
        """
        token_table.validate_token_name(name)
        token_table.validate_token_role(role, profile)
        secret = token_table.new_secret()
        digest = token_table.secret_hash(secret)

        def work(conn: sqlite3.Connection) -> None:
            token_table.insert_token(conn, name=name, role=role, profile=profile, digest=digest, now=now)

        await self._write(work)
        return secret

    async def revoke_token(self, name: str, *, now: datetime) -> TokenInfo:
        """Revoke the active token `name` at `now`; its secret authenticates no more. Raises NotFound when
        there is no active token of that name."""

        def work(conn: sqlite3.Connection) -> TokenInfo:
            return token_table.revoke_token(conn, name=name, now=now)

        return await self._write(work)

    # -- change notification -----------------------------------------------------------------------------

    @property
    def commits_seen(self) -> int:
        """How many commits this object has seen: its own, and (while `watch` runs) other connections'."""
        return self._commits_seen

    async def wait_for_change(self, after: int | None = None) -> None:
        """Return after the next commit: a write through this object, or (while `watch` runs) another
        connection's. With `after` (a `commits_seen` taken before reading what the caller waits on), return
        at once if a commit came since, so none is missed between that read and this wait."""
        if after is not None and after != self._commits_seen:
            await anyio.lowlevel.checkpoint()
            return
        await self._changed.wait()

    async def watch(self, interval: float = 0.05, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled, every `interval` seconds notice commits by other connections and wake the waiters.

        `PRAGMA data_version` changes when another connection (any process) has committed since this one
        last asked: one statement per tick, on the loop. `task_group.start(ledger.watch)` returns once the
        first version is read, so every commit after it is noticed.

        It also checkpoints the WAL (see `checkpoint`) as soon as the writer has committed `_CHECKPOINT_AFTER`
        transactions since the last checkpoint.
        """
        seen = await self._data_version()
        task_status.started()
        while True:
            with anyio.move_on_after(interval):
                await self._checkpoint_due.wait()
            if self._checkpoint_due.is_set():
                await self.checkpoint()
            version = await self._data_version()
            if version != seen:
                seen = version
                self._wake()

    async def checkpoint(self) -> None:
        """Copy the committed WAL pages into the database file, on aiosqlite's thread: a checkpoint syncs
        the files, which the event loop must not wait for. PASSIVE: it never waits for other connections,
        and the WAL is reused from its start once every reader has moved past it."""
        self._checkpoint_due = anyio.Event()
        self._uncheckpointed = 0
        await self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    async def _data_version(self) -> int:
        """The writer's view of `data_version`: it changes with every commit by another connection. The
        query reads shared memory and takes no lock, so it runs on the loop unless a worker has the writer."""
        async with self._writer_busy:
            return int(self._writer.execute("PRAGMA data_version").fetchone()[0])

    def _wake(self) -> None:
        """Count a commit and wake every current waiter; later waiters wait for the next change."""
        self._commits_seen += 1
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    # -- reads -------------------------------------------------------------------------------------------

    async def get(self, invocation_id: str) -> Invocation | None:
        rows = builtins.list(await self._db.execute_fetchall(SELECT_ONE, (invocation_id,)))
        return invocation_from_row(rows[0]) if rows else None

    async def list(
        self,
        *,
        status: Status | None = None,
        source_id: str | None = None,
        session_id: str | None = None,
        principal: str | None = None,
        limit: int = 100,
    ) -> builtins.list[Invocation]:
        """Newest first (by created_at, then insertion order), at most `limit`. The principal filter has
        no index of its own (one more page written by every call): it scans newest first until `limit`."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        filters = zip(LIST_FILTERS, (status, source_id, session_id, principal), strict=True)
        used = [(clause, value) for clause, value in filters if value is not None]
        where = " WHERE " + " AND ".join(clause for clause, _ in used) if used else ""
        params = [value for _, value in used] + [limit]
        rows = await self._db.execute_fetchall(SELECT + where + NEWEST_FIRST, params)
        return [invocation_from_row(row) for row in rows]

    async def ids_starting_with(
        self, prefix: str, *, principal: str | None = None, limit: int = 10
    ) -> builtins.list[str]:
        """The ids that start with `prefix` (of `principal`'s invocations only, when given), sorted, at most
        `limit`; the id equal to `prefix`, if any, comes first. A range over the primary key, never a scan."""
        # Every id starting with the prefix sorts between it and it followed by the highest code point.
        query = "SELECT id FROM invocations WHERE id >= ? AND id < ?"
        params: builtins.list[Any] = [prefix, prefix + "\U0010ffff"]
        if principal is not None:
            query += " AND principal = ?"
            params.append(principal)
        rows = await self._db.execute_fetchall(query + " ORDER BY id LIMIT ?", [*params, limit])
        return [str(row[0]) for row in rows]

    async def events(self, invocation_id: str) -> builtins.list[InvocationEvent]:
        """The invocation's history, oldest first (by seq)."""
        rows = await self._db.execute_fetchall(SELECT_EVENTS, (invocation_id,))
        return [
            InvocationEvent(
                invocation_id=row[0],
                seq=row[1],
                kind=row[2],
                at=datetime.fromisoformat(row[3]),
                detail=json.loads(row[4]),
            )
            for row in rows
        ]

    async def count(self, status: Status | None = None, *, session_id: str | None = None) -> int:
        """How many invocations there are, optionally only those with `status` and of `session_id`."""
        filters = zip(COUNT_FILTERS, (status, session_id), strict=True)
        used = [(clause, value) for clause, value in filters if value is not None]
        where = " WHERE " + " AND ".join(clause for clause, _ in used) if used else ""
        rows = builtins.list(await self._db.execute_fetchall(COUNT + where, [value for _, value in used]))
        return int(rows[0][0])

    async def next_expiry(self) -> datetime | None:
        """The earliest expires_at among pending invocations (None when none of them expires)."""
        rows = builtins.list(await self._db.execute_fetchall(NEXT_EXPIRY))
        return None if rows[0][0] is None else datetime.fromisoformat(rows[0][0])

    async def pins(self, source_id: str | None = None) -> builtins.list[Pin]:
        """Every pin, or those of one source, sorted by source and action."""
        rows = await self._db.execute_fetchall(*pin_table.select_pins(source_id))
        return [pin_table.pin_from_row(row) for row in rows]

    async def tokens(self) -> builtins.list[TokenInfo]:
        """Every token, active and revoked, newest first; never a secret (the ledger has none)."""
        rows = await self._db.execute_fetchall(token_table.SELECT_ALL)
        return [token_table.token_from_row(row) for row in rows]

    async def authenticate(self, secret: str) -> Principal | None:
        """The principal of the active token with this secret, else None.

        Runs on every HTTP request: input without a token's shape is refused without a query, the rest is
        one lookup by the SHA-256 of the secret on a unique index. It never writes.
        """
        if not token_table.looks_like_secret(secret):
            return None
        rows = builtins.list(
            await self._db.execute_fetchall(token_table.AUTHENTICATE, (token_table.secret_hash(secret),))
        )
        return token_table.principal_from_row(rows[0]) if rows else None

    async def has_tokens(self) -> bool:
        """Whether any active token exists (then every HTTP caller must present one)."""
        rows = builtins.list(await self._db.execute_fetchall(token_table.HAS_ACTIVE))
        return bool(rows[0][0])

    # -- internals ---------------------------------------------------------------------------------------

    async def _write(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `work` in one `BEGIN IMMEDIATE` transaction on the writer; if it changed anything, wake the
        waiters of `wait_for_change` (`watch` cannot see this process's own commits).

        First on the event loop, where taking the write lock never waits: when no other connection holds
        it, the whole transaction runs here, without a thread hand-off. When the lock is taken (SQLITE_BUSY)
        the transaction, rolled back if it had begun, runs again in a worker thread that waits for the lock
        up to busy_timeout; writes arriving meanwhile queue behind it. `work` touches nothing but the
        connection, so running it twice is safe. A cancelled caller cannot leave a transaction half-open:
        the worker's run is shielded, and the caller is cancelled at its next checkpoint.
        """
        if not self._writer_busy.locked():
            changes = self._writer.total_changes
            try:
                result = _in_transaction(self._writer, work)
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
            else:
                self._committed(changes)
                return result
        async with self._writer_busy:
            changes = self._writer.total_changes
            with anyio.CancelScope(shield=True):
                result = await anyio.to_thread.run_sync(_wait_and_write, self._writer, work)
        self._committed(changes)
        return result

    def _committed(self, changes_before: int) -> None:
        if self._writer.total_changes == changes_before:
            return  # nothing written (an expiry sweep that found nothing): no news, no WAL pages
        self._uncheckpointed += 1
        if self._uncheckpointed >= _CHECKPOINT_AFTER:
            self._checkpoint_due.set()
        self._wake()

    def _invocation_row(self, invocation: Invocation) -> tuple[Any, ...]:
        values = {name: getattr(invocation, name) for name in COLUMNS}
        values["args"] = self._json(invocation.args)
        values["result"] = self._json(invocation.result)
        values["error_message"] = self._text(invocation.error_message)
        # The drift diff is stored verbatim: it comes from the pinned and current tool definitions, which
        # the pins table already holds verbatim (see bastion.ledger.pins).
        values["drift"] = None if invocation.drift is None else dumps(invocation.drift)
        values["created_at"] = timestamp(invocation.created_at)
        values["updated_at"] = timestamp(invocation.updated_at)
        values["expires_at"] = optional_timestamp(invocation.expires_at)
        return tuple(values[name] for name in COLUMNS)

    def _field_value(self, name: str, value: Any) -> Any:
        if name == "result":
            return self._json(value)
        if name == "error_message":
            return self._text(value)
        if name == "expires_at":
            return optional_timestamp(value)
        if value is not None and not isinstance(value, str):
            raise TypeError(f"transition field {name!r} must be a string or None, got {type(value).__name__}")
        return value

    def _json(self, value: Any) -> str | None:
        """JSON text of the scrubbed value; SQL NULL for None."""
        if value is None:
            return None
        return self.redactor.scrub_json(value)

    def _text(self, message: str | None) -> str | None:
        if message is None:
            return None
        scrubbed = self.redactor.scrub(message)
        return scrubbed if isinstance(scrubbed, str) else dumps(scrubbed)

    def _detail(self, detail: Mapping[str, Any] | None) -> str:
        return self.redactor.scrub_json(dict(detail)) if detail else "{}"


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
    see `_wait_and_write`) and leaves checkpoints to `watch`, up to a bound."""
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
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
