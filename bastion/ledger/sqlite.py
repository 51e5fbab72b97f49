"""The SQLite ledger: one aiosqlite connection to one file in WAL mode, shared safely between processes.

Open it with `ledger = await SqliteLedger.open(path, redactor=...)` and release it with
`await ledger.close()`, or let `async with await SqliteLedger.open(...) as ledger:` do the closing.

Every write method is one transaction. Transitions are conditional updates
(`UPDATE ... WHERE id = ? AND status IN (...)`) under SQLite's single-writer lock, so of two racing
transitions, even from two processes, exactly one wins.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

import aiosqlite
import anyio

from bastion.errors import ConfigError, Conflict
from bastion.ledger.redaction import Redactor
from bastion.ledger.schema import migrate
from bastion.models import EventKind, Invocation, InvocationEvent, Status, utcnow

_T = TypeVar("_T")

_COLUMNS: Final = (
    "id",
    "status",
    "policy_key",
    "tool",
    "source_id",
    "action_id",
    "risk",
    "mode",
    "mode_source",
    "fingerprint",
    "session_id",
    "profile",
    "principal",
    "args",
    "args_hash",
    "result",
    "error_class",
    "error_message",
    "owner",
    "created_at",
    "updated_at",
    "expires_at",
)
_COLUMN_LIST: Final = ", ".join(_COLUMNS)

_SELECT: Final = f"SELECT {_COLUMN_LIST} FROM invocations"
_SELECT_ONE: Final = f"{_SELECT} WHERE id = ?"
_NEWEST_FIRST: Final = " ORDER BY created_at DESC, rowid DESC LIMIT ?"
_LIST_FILTERS: Final = ("status = ?", "source_id = ?", "session_id = ?")
_COUNT_ALL: Final = "SELECT COUNT(*) FROM invocations"
_COUNT_STATUS: Final = "SELECT COUNT(*) FROM invocations WHERE status = ?"
_INSERT_INVOCATION: Final = f"INSERT INTO invocations ({_COLUMN_LIST}) VALUES ({', '.join('?' * len(_COLUMNS))})"
_INSERT_EVENT: Final = "INSERT INTO events (invocation_id, seq, kind, at, detail) VALUES (?, ?, ?, ?, ?)"
_APPEND_EVENT: Final = """
    INSERT INTO events (invocation_id, seq, kind, at, detail)
    SELECT :id, COALESCE(MAX(seq), 0) + 1, :kind, :at, :detail FROM events WHERE invocation_id = :id
"""
_SELECT_EVENTS: Final = "SELECT invocation_id, seq, kind, at, detail FROM events WHERE invocation_id = ? ORDER BY seq"

TRANSITION_FIELDS: Final = ("result", "error_class", "error_message", "owner", "expires_at")
"""The columns `transition` may set besides status and updated_at."""

# One constant statement for every transition: `:set_<field>` says whether the field is being set, and the
# allowed from-statuses arrive as one JSON array, so SQLite can reuse the prepared statement.
_TRANSITION: Final = f"""
    UPDATE invocations SET
        status = :to,
        updated_at = :now,
        {", ".join(f"{name} = CASE WHEN :set_{name} THEN :{name} ELSE {name} END" for name in TRANSITION_FIELDS)}
    WHERE id = :id AND status IN (SELECT value FROM json_each(:from_statuses))
    RETURNING {_COLUMN_LIST}
"""

_WAL_ATTEMPTS: Final = 10
_MIN_SQLITE: Final = (3, 35, 0)

_PRAGMAS: Final = (
    # Wait up to 5 s for another process's lock instead of failing at once.
    "PRAGMA busy_timeout = 5000",
    # In WAL mode NORMAL syncs only at checkpoints: a committed transaction survives the process being
    # killed (it is in the WAL file), and only an OS crash or power loss can lose the last few commits,
    # never corrupt the file. FULL would add an fsync to every tool call.
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
)


class SqliteLedger:
    """The invocation store on a local SQLite file; satisfies `bastion.gateway.Ledger` structurally.

    Args, results, error messages and event details pass through `redactor.scrub` before they are stored.
    """

    def __init__(self, db: aiosqlite.Connection, path: Path, redactor: Redactor) -> None:
        """Use `SqliteLedger.open`; this only wraps an already configured and migrated connection."""
        self._db = db
        self.path = path
        self.redactor = redactor

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
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await db.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise ConfigError(
                    f"{path}: not a usable ledger ({exc}); point [server] ledger at another file"
                ) from exc
            raise
        return cls(db, path, redactor)

    async def close(self) -> None:
        """Close the connection, even when cancelled, and safe to call twice. The last one out checkpoints."""
        with anyio.CancelScope(shield=True):
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
        at = _timestamp(utcnow())
        last = len(events)
        event_rows = [
            (invocation.id, seq, kind, at, self._detail(detail if seq == last else None))
            for seq, kind in enumerate(events, start=1)
        ]

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(_INSERT_INVOCATION, row)
            conn.executemany(_INSERT_EVENT, event_rows)

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
        now = _timestamp(utcnow())
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
            rows = conn.execute(_TRANSITION, params).fetchall()
            if not rows:
                return None
            conn.execute(_APPEND_EVENT, event_params)
            row: Sequence[Any] = rows[0]
            return row

        updated = await self._write(work)
        return None if updated is None else _invocation(updated)

    # -- reads -------------------------------------------------------------------------------------------

    async def get(self, invocation_id: str) -> Invocation | None:
        rows = builtins.list(await self._db.execute_fetchall(_SELECT_ONE, (invocation_id,)))
        return _invocation(rows[0]) if rows else None

    async def list(
        self,
        *,
        status: Status | None = None,
        source_id: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
    ) -> builtins.list[Invocation]:
        """Newest first (by created_at, then insertion order), at most `limit`."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        filters = zip(_LIST_FILTERS, (status, source_id, session_id), strict=True)
        used = [(clause, value) for clause, value in filters if value is not None]
        where = " WHERE " + " AND ".join(clause for clause, _ in used) if used else ""
        params = [value for _, value in used] + [limit]
        rows = await self._db.execute_fetchall(_SELECT + where + _NEWEST_FIRST, params)
        return [_invocation(row) for row in rows]

    async def events(self, invocation_id: str) -> builtins.list[InvocationEvent]:
        """The invocation's history, oldest first (by seq)."""
        rows = await self._db.execute_fetchall(_SELECT_EVENTS, (invocation_id,))
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

    async def count(self, status: Status | None = None) -> int:
        """How many invocations there are, optionally only those with `status`."""
        if status is None:
            rows = builtins.list(await self._db.execute_fetchall(_COUNT_ALL))
        else:
            rows = builtins.list(await self._db.execute_fetchall(_COUNT_STATUS, (status,)))
        return int(rows[0][0])

    # -- internals ---------------------------------------------------------------------------------------

    async def _write(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `work` in one `BEGIN IMMEDIATE` transaction on the connection's own thread, in one hop.

        aiosqlite has no public call that runs a function on its thread; one await per statement would cost
        four thread hops per transaction instead of one (about 270 µs against 80 µs on two cores), and every
        tool call writes twice. `Connection._execute` has had this signature since aiosqlite 0.17.
        Running the whole transaction in one call also means a cancelled caller can never leave a
        transaction half-open on the shared connection: it finishes (or rolls back) on the thread.
        """
        db = self._db

        def run() -> _T:
            return _in_transaction(db._conn, work)

        result: _T = await db._execute(run)  # type: ignore[no-untyped-call]
        return result

    def _invocation_row(self, invocation: Invocation) -> tuple[Any, ...]:
        values = {name: getattr(invocation, name) for name in _COLUMNS}
        values["args"] = self._json(invocation.args)
        values["result"] = self._json(invocation.result)
        values["error_message"] = self._text(invocation.error_message)
        values["created_at"] = _timestamp(invocation.created_at)
        values["updated_at"] = _timestamp(invocation.updated_at)
        values["expires_at"] = _optional_timestamp(invocation.expires_at)
        return tuple(values[name] for name in _COLUMNS)

    def _field_value(self, name: str, value: Any) -> Any:
        if name == "result":
            return self._json(value)
        if name == "error_message":
            return self._text(value)
        if name == "expires_at":
            return _optional_timestamp(value)
        if value is not None and not isinstance(value, str):
            raise TypeError(f"transition field {name!r} must be a string or None, got {type(value).__name__}")
        return value

    def _json(self, value: Any) -> str | None:
        """JSON text of the scrubbed value; SQL NULL for None."""
        if value is None:
            return None
        return _dumps(self.redactor.scrub(value))

    def _text(self, message: str | None) -> str | None:
        if message is None:
            return None
        scrubbed = self.redactor.scrub(message)
        return scrubbed if isinstance(scrubbed, str) else _dumps(scrubbed)

    def _detail(self, detail: Mapping[str, Any] | None) -> str:
        return _dumps(self.redactor.scrub(dict(detail))) if detail else "{}"


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


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _timestamp(moment: datetime) -> str:
    """Fixed-width ISO-8601 UTC with microseconds, so stored timestamps sort as text. Naive means UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _optional_timestamp(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    if not isinstance(moment, datetime):
        raise TypeError(f"expected a datetime, got {type(moment).__name__}")
    return _timestamp(moment)


def _invocation(row: Sequence[Any]) -> Invocation:
    data = dict(zip(_COLUMNS, row, strict=True))
    for name in ("args", "result"):
        if data[name] is not None:
            data[name] = json.loads(data[name])
    for name in ("created_at", "updated_at", "expires_at"):
        if data[name] is not None:
            data[name] = datetime.fromisoformat(data[name])
    return Invocation.model_validate(data)
