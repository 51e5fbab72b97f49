"""The `invocations` and `events` tables: the SQLite invocation store's writes (`SqliteInvocations`; its reads are
`SqliteInvocationReads`, bastion.ledger.sqlite.reads), their statements, and appending to the audit chain.

Each write method is one transaction (`SqliteDatabase.write`), a move of the state machine (bastion.states) applied
as a conditional update; reads run alone. What it stores arrives
scrubbed from the `Recorder` (bastion.ledger.recorder): it redacts nothing itself.
"""

from __future__ import annotations

import builtins
import json
import operator
import sqlite3
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, Literal, TypeVar, cast

from bastion import states
from bastion.errors import ApprovalExpired, Conflict, NotFound
from bastion.ledger.backend import (
    EMPTY_DETAIL,
    INVOCATION_COLUMNS,
    TRANSITION_FIELDS,
    GoneFn,
    Scrubbed,
    stored_json,
    transition_params,
)
from bastion.ledger.chain import Unlinked, record_state
from bastion.ledger.invocation_reads import COUNT
from bastion.ledger.scrubbing import SCRUBBED_COLUMNS
from bastion.ledger.sqlite.chain import append_events
from bastion.ledger.sqlite.grants import insert_grant
from bastion.ledger.sqlite.limits import admit_in
from bastion.ledger.sqlite.reads import SqliteInvocationReads, invocation_from_row
from bastion.ledger.sqlite.schema import dumps, optional_timestamp, timestamp
from bastion.ledger.twins import twin_params, twin_query
from bastion.models import Admission, EventKind, Grant, Invocation, RecoveryReport, RetryWindow, Status, utcnow

_COLUMN_LIST: Final = ", ".join(INVOCATION_COLUMNS)
_Refusal = TypeVar("_Refusal")

COUNT_PENDING: Final = f"{COUNT} WHERE status = 'pending'"
INSERT_INVOCATION: Final = (
    f"INSERT INTO invocations ({_COLUMN_LIST}) VALUES ({', '.join('?' * len(INVOCATION_COLUMNS))})"
)
# What a change returns: the row as stored, then the seq of its newest event, so the event recording the change is
# numbered in the same statement.
_RETURNING: Final = (
    f"RETURNING {_COLUMN_LIST}, (SELECT COALESCE(MAX(seq), 0) FROM events WHERE invocation_id = invocations.id)"
)
_STORED: Final = len(INVOCATION_COLUMNS)
SCRUB_ROW: Final = f"""
    UPDATE invocations SET {", ".join(f"{name} = ?" for name in SCRUBBED_COLUMNS)} WHERE id = ?
    {_RETURNING}
"""
"""A scrub's rewrite of an invocation (bastion.ledger.scrubbing): its status and times stay."""
COUNT_SESSION_PENDING: Final = "SELECT COUNT(*) FROM invocations WHERE session_id = ? AND status = 'pending'"
# An event follows the chain's head of record (bastion.ledger.chain). Its id is its position, the head's + 1, as
# SQLite would give it, so it can be hashed before it is inserted.

# One constant statement for every transition: `:set_<field>` says whether the field is being set, and the
# allowed from-statuses arrive as one JSON array, so SQLite can reuse the prepared statement. A move that leaves the
# status (bastion.states.NOTE_CHECK) leaves updated_at too: it is when the status last changed, and a look-up's
# window of the call ends there.
TRANSITION: Final = f"""
    UPDATE invocations SET
        status = :to,
        updated_at = CASE WHEN status = :to THEN updated_at ELSE :now END,
        {", ".join(f"{name} = CASE WHEN :set_{name} THEN :{name} ELSE {name} END" for name in TRANSITION_FIELDS)}
    WHERE id = :id AND status IN (SELECT value FROM json_each(:from_statuses))
    {_RETURNING}
"""

# The outcome of a call that ran: one fixed statement, the hot path's second write.
FINISH: Final = f"""
    UPDATE invocations SET
        status = :to, updated_at = :now, result = :result, error_class = :error_class, error_message = :error_message
    WHERE id = :id AND status = :start
    {_RETURNING}
"""

# An approver's decision: only a pending invocation that has not expired (no expires_at never expires).
DECIDE: Final = f"""
    UPDATE invocations SET
        status = :to,
        updated_at = :now,
        error_class = CASE WHEN :approve THEN error_class ELSE 'approval_denied' END,
        error_message = CASE WHEN :approve THEN error_message ELSE :error_message END
    WHERE id = :id AND status = :start AND (expires_at IS NULL OR expires_at > :now)
    {_RETURNING}
"""
SELECT_STATUS: Final = "SELECT status FROM invocations WHERE id = ?"
_EXPIRE: Final = """
    UPDATE invocations SET
        status = 'expired',
        updated_at = :now,
        error_class = 'approval_expired',
        error_message = 'no decision before ' || expires_at
    WHERE status = :start AND expires_at <= :now
"""
EXPIRE_DUE: Final = f"{_EXPIRE} {_RETURNING}"
EXPIRE_ONE: Final = f"{_EXPIRE} AND id = :id {_RETURNING}"

# Recovery after a restart: `:gone` is a JSON array of the owners that are no longer running.
OWNERS: Final = "SELECT DISTINCT owner FROM invocations WHERE status IN ('executing', 'approved') AND owner IS NOT NULL"
_ORPHANED: Final = "(owner IS NULL OR owner IN (SELECT value FROM json_each(:gone)))"
MARK_UNKNOWN: Final = f"""
    UPDATE invocations SET
        status = 'unknown',
        updated_at = :now,
        error_class = 'unknown_outcome',
        error_message = :reason
    WHERE status = :start AND {_ORPHANED}
    {_RETURNING}
"""
NEVER_STARTED: Final = f"""
    SELECT id FROM invocations WHERE status = 'approved' AND {_ORPHANED} ORDER BY created_at, rowid
"""
PROCESS_STOPPED: Final = "the Bastion process running it stopped"


def changed(returned: Sequence[Any], kind: EventKind, at: str, detail: str = "{}") -> Unlinked:
    """The event recording a change whose statement `returned` the invocation's row (as stored,
    `INVOCATION_COLUMNS` order) and the seq of its newest event before it (`_RETURNING`)."""
    return Unlinked(returned[0], returned[_STORED] + 1, kind, at, detail, record_state(returned[:_STORED]))


def _invocation(returned: Sequence[Any]) -> Invocation:
    """The invocation a change's statement returned (`_RETURNING`)."""
    return invocation_from_row(returned[:_STORED])


class SqliteInvocations(SqliteInvocationReads):
    """Invocations and their events on one SQLite file; satisfies `bastion.ledger.backend.InvocationBackend`: the
    writes here, the reads in `SqliteInvocationReads`."""

    # -- writes ----------------------------------------------------------------------------------------

    async def insert(
        self, invocation: Invocation, events: Sequence[EventKind], detail: Scrubbed, *, may_share: bool = False
    ) -> None:
        """Insert a new invocation and its first events (seq 1..n, one timestamp) in one transaction.

        `detail` goes on the last event: it describes the state the invocation was recorded in (e.g. the
        reason of a `denied`). Raises Conflict if an invocation with this id already exists. `may_share`: the
        write waits for the loop's next turn, to commit with the writes that arrive before it (see
        `SqliteDatabase.write`): while other calls are in flight, their intents and outcomes share one commit.
        """
        await self._insert_unless(invocation, events, detail, lambda conn: None, may_share=may_share)

    async def insert_admitted(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Scrubbed,
        *,
        admission: Admission,
        may_share: bool = False,
    ) -> float | None:
        """Admit the call against its rate limit and insert it, in one transaction; when the limit refuses it,
        nothing is inserted and the seconds until one more fits come back (None when inserted). `may_share`: as
        for `insert`."""
        return await self._insert_unless(
            invocation, events, detail, lambda conn: admit_in(conn, admission), may_share=may_share
        )

    async def insert_pending(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Scrubbed,
        *,
        limit: int,
        retries: RetryWindow | None = None,
        retried: Scrubbed = EMPTY_DETAIL,
    ) -> int | Invocation | None:
        """Insert it only if its session has fewer than `limit` pending invocations, counted in the same
        transaction (under the write lock, so two processes cannot both take the last slot). None when
        inserted; else how many were pending. With `retries`, its twin, found first under the same lock, comes back
        instead, with a `retried` event (detail `retried`), and nothing is inserted."""
        find_twin = twin_query(lambda name: f":{name}", invocation) if retries is not None else None

        def twin_or_over_limit(conn: sqlite3.Connection) -> int | Invocation | None:
            if find_twin is not None and retries is not None:
                twin = self._attach(conn, find_twin, twin_params(invocation, retries), retried)
                if twin is not None:
                    return twin
            pending: int = conn.execute(COUNT_SESSION_PENDING, (invocation.session_id,)).fetchone()[0]
            return pending if pending >= limit else None

        return await self._insert_unless(invocation, events, detail, twin_or_over_limit)

    @staticmethod
    def _attach(
        conn: sqlite3.Connection, find_twin: str, params: dict[str, object], retried: Scrubbed
    ) -> Invocation | None:
        """The twin `find_twin` selects, with a `retried` event appended (bastion.states.NOTE_RETRY); None when
        there is none."""
        for moment in ("created_since", "decided_since"):
            params[moment] = timestamp(cast(datetime, params[moment]))
        found = conn.execute(find_twin, params).fetchone()
        if found is None:
            return None
        twin_id, status = found[0], found[1]
        noted = conn.execute(TRANSITION, _transition_params(twin_id, (status,), status, {})).fetchall()
        append_events(conn, [changed(noted[0], "retried", timestamp(utcnow()), retried.json)])
        return _invocation(noted[0])

    async def _insert_unless(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Scrubbed,
        refusal: Callable[[sqlite3.Connection], _Refusal | None],
        *,
        may_share: bool = False,
    ) -> _Refusal | None:
        """Insert the invocation unless `refusal`, asked first in the same transaction, answers something (which
        comes back, nothing inserted). Raises Conflict if an invocation with this id already exists."""
        insert = self._inserting(invocation, events, detail)

        def work(conn: sqlite3.Connection) -> _Refusal | None:
            refused = refusal(conn)
            if refused is None:
                insert(conn)
            return refused

        try:
            return await self._db.write(work, may_wait=may_share)
        except sqlite3.IntegrityError as exc:
            raise Conflict(f"invocation {invocation.id} is already recorded", invocation_id=invocation.id) from exc

    def _inserting(
        self, invocation: Invocation, events: Sequence[EventKind], detail: Scrubbed
    ) -> Callable[[sqlite3.Connection], None]:
        row = _invocation_row(invocation)
        at = timestamp(utcnow())
        state = record_state(row)
        last = len(events)
        first = [
            Unlinked(invocation.id, seq, kind, at, detail.json if seq == last else "{}", state)
            for seq, kind in enumerate(events, start=1)
        ]

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(INSERT_INVOCATION, row)
            append_events(conn, first)

        return insert

    async def transition(
        self,
        invocation_id: str,
        *,
        from_statuses: Collection[Status],
        to: Status,
        event: EventKind,
        detail: Scrubbed,
        fields: Mapping[str, Any],
        at: datetime | None = None,
    ) -> Invocation | None:
        """Move an invocation to `to` if its status is one of `from_statuses`, set `fields` and append the
        event, all in one transaction. Returns the updated invocation, or None when the condition did not
        hold or the id is unknown. Raises ValueError for a field outside `TRANSITION_FIELDS`."""
        params = _transition_params(invocation_id, from_statuses, to, fields, at)
        now = params["now"]

        def work(conn: sqlite3.Connection) -> Sequence[Any] | None:
            rows = conn.execute(TRANSITION, params).fetchall()  # all: the statement is then done
            if not rows:
                return None
            row: Sequence[Any] = rows[0]
            append_events(conn, [changed(row, event, now, detail.json)])
            return row

        updated = await self._db.write(work)
        return None if updated is None else _invocation(updated)

    async def finish(
        self,
        invocation_id: str,
        to: Status,
        *,
        result: Scrubbed | None,
        error_class: str | None,
        error_message: str | None,
        may_defer: bool = False,
    ) -> bool:
        """Record the outcome of a call that ran: executing -> `to`, with its result and error, and the event,
        in one transaction. False when it was no longer executing (recovery marked it unknown meanwhile). The call
        is over, so the write shares the loop's next commit; `may_defer` (other calls run): the next call's, see
        `SqliteDatabase.write`."""
        now = timestamp(utcnow())
        params = {
            "id": invocation_id,
            "to": to,
            "now": now,
            "result": stored_json(result),
            "error_class": error_class,
            "error_message": error_message,
            "start": states.FINISH.start,
        }

        def work(conn: sqlite3.Connection) -> bool:
            rows = conn.execute(FINISH, params).fetchall()
            if not rows:
                return False
            append_events(conn, [changed(rows[0], to, now)])
            return True

        return await self._db.write(work, may_wait=True, may_defer=may_defer)

    async def decide(
        self,
        invocation_id: str,
        *,
        approve: bool,
        detail: Scrubbed,
        error_message: str | None,
        now: datetime,
        grant: Grant | None = None,
    ) -> Invocation:
        """An approver's decision on a pending invocation, in one transaction: `approved` or `denied` (error
        class `approval_denied`, `error_message`), and the standing `grant` the approval leaves, if any (stored
        only if the decision holds). `now` stamps it.

        Raises NotFound for an unknown id; ApprovalExpired when it is pending but past its expires_at, after
        marking it `expired` in the same transaction; Conflict when it is no longer pending (whoever
        decided first won), naming its status.
        """
        at = timestamp(now)
        to: Literal["approved", "denied"] = "approved" if approve else "denied"
        params = {
            "id": invocation_id,
            "to": to,
            "now": at,
            "approve": approve,
            "error_message": error_message,
            "start": states.DECIDE.start,
        }

        def work(conn: sqlite3.Connection) -> tuple[Sequence[Any], bool]:
            """The updated row, and whether it expired instead of being decided."""
            decided = conn.execute(DECIDE, params).fetchall()
            if decided:
                append_events(conn, [changed(decided[0], to, at, detail.json)])
                if grant is not None:
                    insert_grant(conn, grant)
                return decided[0], False
            found = conn.execute(SELECT_STATUS, (invocation_id,)).fetchone()
            if found is None:
                raise NotFound(f"no invocation {invocation_id}", invocation_id=invocation_id)
            if found[0] != "pending":
                raise Conflict(f"invocation {invocation_id} is already {found[0]}", invocation_id=invocation_id)
            # Pending, yet the decision did not apply: it is past its expiry.
            expired = conn.execute(
                EXPIRE_ONE, {"id": invocation_id, "now": at, "start": states.EXPIRE.start}
            ).fetchall()
            append_events(conn, [changed(expired[0], "expired", at)])
            return expired[0], True

        row, expired = await self._db.write(work)
        invocation = _invocation(row)
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
            rows: builtins.list[Sequence[Any]] = conn.execute(
                EXPIRE_DUE, {"now": at, "start": states.EXPIRE.start}
            ).fetchall()
            append_events(conn, [changed(row, "expired", at) for row in rows])
            return rows

        expired = [_invocation(row) for row in await self._db.write(work)]
        return sorted(expired, key=lambda invocation: (invocation.expires_at, invocation.id))

    async def claim(self, invocation_id: str, *, owner: str) -> Invocation | None:
        """Take an approved invocation to run it: approved -> executing, owned by `owner`. Of several
        claimers exactly one gets the invocation; the others (and any claim of a non-approved one) get None."""
        return await self.transition(
            invocation_id,
            from_statuses=states.CLAIM.from_,
            to="executing",
            event="executing",
            detail=Scrubbed("{}"),
            fields={"owner": owner},
        )

    async def recover(self, gone_of: GoneFn) -> RecoveryReport:
        """Every `executing` invocation whose owner is gone becomes `unknown` (its outcome cannot be known);
        report the approved ones whose owner is gone (oldest first: they never started, claim and run them)
        and how many are pending (kept with their expiry).

        `gone_of` is asked once, with the owners found, after they are read (so an instance that recorded work
        had registered before it is judged). A missing owner counts as gone.
        """
        owners = [owner for (owner,) in await self._db.fetchall(OWNERS)]
        # An owner that was gone when asked stays gone (instance ids are never reused), so the answer
        # still holds in the transaction below even if other rows changed meanwhile.
        gone = dumps(sorted(await gone_of(owners)) if owners else [])
        at = timestamp(utcnow())
        reason = dumps({"reason": PROCESS_STOPPED})

        def work(conn: sqlite3.Connection) -> RecoveryReport:
            params = {"gone": gone, "now": at, "reason": PROCESS_STOPPED, "start": states.RECOVER.start}
            unknown = conn.execute(MARK_UNKNOWN, params).fetchall()
            append_events(conn, [changed(row, "unknown", at, reason) for row in unknown])
            return RecoveryReport(
                unknown=sorted(row[0] for row in unknown),
                approved=[row[0] for row in conn.execute(NEVER_STARTED, {"gone": gone}).fetchall()],
                pending=conn.execute(COUNT_PENDING).fetchone()[0],
            )

        return await self._db.write(work)


_COLUMN_VALUES: Final = operator.attrgetter(*INVOCATION_COLUMNS)
_STORED_AS: Final[dict[str, Callable[[Any], Any]]] = {
    "args": stored_json,
    "result": stored_json,
    # The drift diff is stored verbatim: it comes from the pinned and current tool definitions, which the
    # pins table already holds verbatim (see bastion.ledger.sqlite.pins).
    "drift": lambda drift: None if drift is None else dumps(drift),
    "created_at": timestamp,
    "updated_at": timestamp,
    "expires_at": optional_timestamp,
}
_CONVERTED: Final = tuple((INVOCATION_COLUMNS.index(name), convert) for name, convert in _STORED_AS.items())


def _invocation_row(invocation: Invocation) -> list[Any]:
    """The invocation's columns as stored (in INVOCATION_COLUMNS order): its attributes read in one C call, the
    JSON and time columns converted."""
    row = list(_COLUMN_VALUES(invocation))
    for index, convert in _CONVERTED:
        row[index] = convert(row[index])
    return row


def _transition_params(
    invocation_id: str,
    from_statuses: Collection[Status],
    to: Status,
    fields: Mapping[str, Any],
    at: datetime | None = None,
) -> dict[str, Any]:
    """The parameters of `TRANSITION`, stamped `at` (default: now)."""
    return transition_params(
        invocation_id,
        json.dumps(builtins.list(from_statuses)),
        to,
        fields,
        now=timestamp(at or utcnow()),
        value=_field_value,
    )


def _field_value(name: str, value: Any) -> Any:
    if name == "result":
        return stored_json(value)
    if name == "expires_at":
        return optional_timestamp(value)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"transition field {name!r} must be a string or None, got {type(value).__name__}")
    return value
