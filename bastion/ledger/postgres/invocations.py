"""The `invocations` and `events` tables on PostgreSQL: the invocation store (`PostgresInvocations`).

A write that changes an invocation is one transaction: it takes the chain's head (bastion.ledger.postgres.chain),
updates the row, bumping its `last_seq`, and returns it; the event, numbered from the row it updated and carrying the
row's state, is then appended with its link. A new invocation is inserted with its first events in one statement.
Event ids come from the events' identity sequence only after the invocation row was written, which the change feed
relies on (bastion.ledger.postgres.feed). What it stores arrives scrubbed from the `Recorder`: it redacts nothing
itself.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, Literal, TypeVar

import psycopg

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
from bastion.ledger.invocation_reads import COUNT
from bastion.ledger.postgres.chain import APPENDED, Change, append, appending, head
from bastion.ledger.postgres.database import NOTIFY, Connection, changes_of
from bastion.ledger.postgres.grants import insert_grant
from bastion.ledger.postgres.limits import admit_in
from bastion.ledger.postgres.reads import PostgresInvocationReads, invocation_from_row
from bastion.ledger.scrubbing import SCRUBBED_COLUMNS
from bastion.ledger.twins import twin_key, twin_params, twin_query
from bastion.models import Admission, EventKind, Grant, Invocation, RecoveryReport, RetryWindow, Status, utcnow

_COLUMN_LIST: Final = ", ".join(INVOCATION_COLUMNS)

COUNT_PENDING: Final = f"{COUNT} WHERE status = 'pending'"

# A new invocation and its first events (one timestamp; the detail on the last), in one statement.
RECORD: Final = f"""
    WITH inserted AS (
        INSERT INTO invocations ({_COLUMN_LIST}, last_seq)
        VALUES ({", ".join(f"%({name})s" for name in INVOCATION_COLUMNS)}, %(last_seq)s)
    ), {APPENDED}
    SELECT appended.id, appended.invocation_id, appended.kind, {NOTIFY} FROM appended
"""
# The pending limit: counted after taking the session's lock, so two instances cannot both take the last slot.
LOCK_SESSION: Final = "SELECT pg_advisory_xact_lock(hashtextextended('bastion pending ' || %s, 0))"
COUNT_SESSION_PENDING: Final = "SELECT COUNT(*) FROM invocations WHERE session_id = %s AND status = 'pending'"
# A retry's look-up for its twin (bastion.ledger.twins), serialised on the twin's key: the second of two retries at
# once waits until the first committed, and then finds it. (The chain's head, taken first, serialises every write
# today; this lock keeps the look-up race-free without relying on that.)
LOCK_TWIN: Final = "SELECT pg_advisory_xact_lock(hashtextextended('bastion twin ' || %s, 0))"


# `%(set_<field>)s` says whether the field is being set: one statement serves every transition. A move that leaves
# the status (bastion.states.NOTE_CHECK) leaves updated_at too, as in SQLite.
TRANSITION: Final = f"""
    UPDATE invocations SET
        status = %(to)s,
        updated_at = CASE WHEN status = %(to)s THEN updated_at ELSE %(now)s END,
        {", ".join(f"{name} = CASE WHEN %(set_{name})s THEN %({name})s ELSE {name} END" for name in TRANSITION_FIELDS)},
        last_seq = last_seq + 1
    WHERE id = %(id)s AND status = ANY(%(from_statuses)s)
    RETURNING {_COLUMN_LIST}, last_seq
    """
FINISH: Final = f"""
    UPDATE invocations SET
        status = %(to)s, updated_at = %(now)s, result = %(result)s, error_class = %(error_class)s,
        error_message = %(error_message)s, last_seq = last_seq + 1
    WHERE id = %(id)s AND status = %(start)s
    RETURNING {_COLUMN_LIST}, last_seq
    """
SELECT_FOR_DECISION: Final = "SELECT status, expires_at FROM invocations WHERE id = %s FOR UPDATE"
DECIDE: Final = f"""
    UPDATE invocations SET
        status = %(to)s,
        updated_at = %(now)s,
        error_class = CASE WHEN %(approve)s THEN error_class ELSE 'approval_denied' END,
        error_message = CASE WHEN %(approve)s THEN error_message ELSE %(error_message)s END,
        last_seq = last_seq + 1
    WHERE id = %(id)s AND status = %(start)s
    RETURNING {_COLUMN_LIST}, last_seq
    """
_EXPIRE: Final = """
    UPDATE invocations SET
        status = 'expired',
        updated_at = %(now)s,
        error_class = 'approval_expired',
        error_message = 'no decision before '
            || to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
        last_seq = last_seq + 1
    WHERE status = %(start)s AND expires_at <= %(now)s {also}
    RETURNING {columns}, last_seq
"""
EXPIRE_DUE: Final = _EXPIRE.format(also="", columns=_COLUMN_LIST)
EXPIRE_ONE: Final = _EXPIRE.format(also="AND id = %(id)s", columns=_COLUMN_LIST)

# Recovery after a restart: `%(gone)s` is the list of owners that are no longer running.
OWNERS: Final = "SELECT DISTINCT owner FROM invocations WHERE status IN ('executing', 'approved') AND owner IS NOT NULL"
_ORPHANED: Final = "(owner IS NULL OR owner = ANY(%(gone)s))"
MARK_UNKNOWN: Final = f"""
    UPDATE invocations SET
        status = 'unknown',
        updated_at = %(now)s,
        error_class = 'unknown_outcome',
        error_message = %(reason)s,
        last_seq = last_seq + 1
    WHERE status = %(start)s AND {_ORPHANED}
    RETURNING {_COLUMN_LIST}, last_seq
    """
NEVER_STARTED: Final = (
    f"SELECT id FROM invocations WHERE status = 'approved' AND {_ORPHANED} ORDER BY created_at, position"
)
PROCESS_STOPPED: Final = "the Bastion process running it stopped"

_INVOCATION_WIDTH: Final = len(INVOCATION_COLUMNS)
SCRUB_ROW: Final = f"""
    UPDATE invocations SET {", ".join(f"{name} = %s" for name in SCRUBBED_COLUMNS)}, last_seq = last_seq + 1
    WHERE id = %s
    RETURNING {_COLUMN_LIST}, last_seq
"""
"""A scrub's rewrite of an invocation (bastion.ledger.scrubbing): its status and times stay."""
_Refusal = TypeVar("_Refusal")


def changes(rows: Sequence[Sequence[Any]], kind: str, at: datetime, detail: str = "{}") -> builtins.list[Change]:
    """The events of rows an UPDATE returned (`INVOCATION_COLUMNS`, then `last_seq`): each numbered `last_seq`."""
    return [Change(row[:_INVOCATION_WIDTH], row[_INVOCATION_WIDTH], kind, at, detail) for row in rows]


class PostgresInvocations(PostgresInvocationReads):
    """Invocations and their events in one PostgreSQL database; satisfies `bastion.ledger.backend.InvocationBackend`:
    the writes here, the reads in `PostgresInvocationReads`."""

    async def _changing(self, sql: str, params: Mapping[str, Any], kind: str, detail: str = "{}") -> builtins.list[Any]:
        """One UPDATE of invocations (returning `INVOCATION_COLUMNS`, then `last_seq`) in its own transaction, after
        taking the chain's head, with an event of `kind` appended for every row it changed (stamped `params["now"]`);
        the rows."""

        async def work(conn: Connection) -> tuple[builtins.list[Any], builtins.list[Any]]:
            at_head = await head(conn)
            rows = await (await conn.execute(sql, params)).fetchall()
            return rows, await append(conn, at_head, changes(rows, kind, params["now"], detail))

        rows, appended = await self._db.transaction(work)
        await self._db.committed(changes_of(appended))
        return rows

    # -- writes ----------------------------------------------------------------------------------------

    async def insert(
        self, invocation: Invocation, events: Sequence[EventKind], detail: Scrubbed, *, may_share: bool = False
    ) -> None:
        """Insert a new invocation and its first events (seq 1..n, one timestamp) in one transaction. `detail` goes
        on the last event. Raises Conflict if an invocation with this id already exists. Each write has a
        transaction of its own here: `may_share` changes nothing."""
        await self._insert_unless(invocation, events, detail, _nothing_refuses)

    async def insert_admitted(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Scrubbed,
        *,
        admission: Admission,
        may_share: bool = False,
    ) -> float | None:
        """Admit the call against its rate limit and insert it, in one transaction (the chain's head first, then
        the key's lock); when the limit refuses it, nothing is inserted and the seconds until one more fits come
        back (None when inserted)."""

        async def over_rate_limit(
            conn: Connection, at_head: tuple[int, str]
        ) -> tuple[float | None, builtins.list[Any]]:
            return await admit_in(conn, admission), []

        return await self._insert_unless(invocation, events, detail, over_rate_limit)

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
        """Insert it only if its session has fewer than `limit` pending invocations, counted under the session's
        advisory lock in the same transaction (so two instances cannot both take the last slot). None when
        inserted; else how many were pending. With `retries`, its twin, looked up first under the advisory lock of
        the twin's key (so of two retries at once, the second finds what the first recorded), comes back instead,
        with a `retried` event (detail `retried`), and nothing is inserted."""
        find_twin = twin_query(lambda name: f"%({name})s", invocation)

        async def twin_or_over_limit(
            conn: Connection, at_head: tuple[int, str]
        ) -> tuple[int | Invocation | None, builtins.list[Any]]:
            if retries is not None:
                await conn.execute(LOCK_TWIN, (twin_key(invocation),))
                found = await (await conn.execute(find_twin, twin_params(invocation, retries))).fetchone()
                if found is not None:
                    twin_id, status = found[0], found[1]
                    params = _transition_params(twin_id, (status,), status, {})
                    noted = await (await conn.execute(TRANSITION, params)).fetchall()
                    appended = await append(conn, at_head, changes(noted, "retried", params["now"], retried.json))
                    return invocation_from_row(noted[0]), appended
            await conn.execute(LOCK_SESSION, (invocation.session_id,))
            counted = await (await conn.execute(COUNT_SESSION_PENDING, (invocation.session_id,))).fetchone()
            pending = int(counted[0]) if counted is not None else 0
            return (pending if pending >= limit else None), []

        return await self._insert_unless(invocation, events, detail, twin_or_over_limit)

    async def _insert_unless(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Scrubbed,
        refusal: Callable[[Connection, tuple[int, str]], Awaitable[tuple[_Refusal | None, builtins.list[Any]]]],
    ) -> _Refusal | None:
        """Insert the invocation unless `refusal`, asked first in the same transaction (after the chain's head is
        taken, which it is given), answers something (which comes back, nothing inserted) with the events it appended
        itself. Raises Conflict if the id is taken."""
        params = _record_params(invocation)
        last = len(events)
        at = utcnow()
        row = [params[name] for name in INVOCATION_COLUMNS]
        first = [
            Change(row, seq, kind, at, detail.json if seq == last else "{}") for seq, kind in enumerate(events, start=1)
        ]
        params["last_seq"] = last

        async def work(conn: Connection) -> tuple[_Refusal | None, builtins.list[Any]]:
            at_head = await head(conn)
            refused, appended = await refusal(conn, at_head)
            if refused is not None:
                return refused, appended
            return None, await (await conn.execute(RECORD, params | appending(at_head, first))).fetchall()

        try:
            refused, rows = await self._db.transaction(work)
        except psycopg.errors.UniqueViolation as exc:
            raise Conflict(f"invocation {invocation.id} is already recorded", invocation_id=invocation.id) from exc
        await self._db.committed(changes_of(rows))
        return refused

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
        event, in one statement. Returns the updated invocation, or None when the condition did not hold or the
        id is unknown. Raises ValueError for a field outside `TRANSITION_FIELDS`."""
        params = _transition_params(invocation_id, from_statuses, to, fields, at)
        rows = await self._changing(TRANSITION, params, event, detail.json)
        return invocation_from_row(rows[0]) if rows else None

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
        """Record the outcome of a call that ran: executing -> `to`, with its result and error, and the event, in
        one statement. False when it was no longer executing (recovery marked it unknown meanwhile). Each write
        commits on its own connection here: `may_defer` changes nothing."""
        params = {
            "id": invocation_id,
            "to": to,
            "now": utcnow(),
            "result": stored_json(result),
            "error_class": error_class,
            "error_message": _text(error_message),
            "start": states.FINISH.start,
        }
        return bool(await self._changing(FINISH, params, to))

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
        """An approver's decision on a pending invocation, in one transaction holding its row: `approved` or
        `denied` (error class `approval_denied`, `error_message`), and the standing `grant` the approval leaves, if
        any (stored only if the decision holds). `now` stamps it.

        Raises NotFound for an unknown id; ApprovalExpired when it is pending but past its expires_at, after
        marking it `expired` in the same transaction; Conflict when it is no longer pending (whoever decided
        first won), naming its status.
        """
        to: Literal["approved", "denied"] = "approved" if approve else "denied"
        params = {
            "id": invocation_id,
            "to": to,
            "now": now,
            "approve": approve,
            "error_message": _text(error_message),
            "start": states.DECIDE.start,
        }

        async def work(conn: Connection) -> tuple[builtins.list[Any], builtins.list[Any], bool]:
            """The updated rows, the events appended, and whether it expired instead of being decided."""
            at_head = await head(conn)
            found = await (await conn.execute(SELECT_FOR_DECISION, (invocation_id,))).fetchone()
            if found is None:
                raise NotFound(f"no invocation {invocation_id}", invocation_id=invocation_id)
            status, expires_at = found
            if status != states.DECIDE.start:
                raise Conflict(f"invocation {invocation_id} is already {status}", invocation_id=invocation_id)
            if expires_at is not None and expires_at <= now:
                expired = await (
                    await conn.execute(EXPIRE_ONE, {"id": invocation_id, "now": now, "start": states.EXPIRE.start})
                ).fetchall()
                return expired, await append(conn, at_head, changes(expired, "expired", now)), True
            decided = await (await conn.execute(DECIDE, params)).fetchall()
            appended = await append(conn, at_head, changes(decided, to, now, detail.json))
            if grant is not None:
                await insert_grant(conn, grant)
            return decided, appended, False

        rows, appended, expired = await self._db.transaction(work)
        await self._db.committed(changes_of(appended))
        invocation = invocation_from_row(rows[0])
        if expired:
            raise ApprovalExpired(
                f"invocation {invocation_id} expired at {invocation.expires_at} before a decision",
                invocation_id=invocation_id,
            )
        return invocation

    async def expire_due(self, now: datetime) -> builtins.list[Invocation]:
        """Mark every pending invocation whose expires_at <= now as `expired` in one statement; return them sorted
        by expiry."""
        rows = await self._changing(EXPIRE_DUE, {"now": now, "start": states.EXPIRE.start}, "expired")
        expired = [invocation_from_row(row) for row in rows]
        return sorted(expired, key=lambda invocation: (invocation.expires_at, invocation.id))

    async def claim(self, invocation_id: str, *, owner: str) -> Invocation | None:
        """Take an approved invocation to run it: approved -> executing, owned by `owner`. Of several claimers, on
        any instances, exactly one gets it; the others (and any claim of a non-approved one) get None."""
        return await self.transition(
            invocation_id,
            from_statuses=states.CLAIM.from_,
            to="executing",
            event="executing",
            detail=Scrubbed("{}"),
            fields={"owner": owner},
        )

    async def recover(self, gone_of: GoneFn) -> RecoveryReport:
        """Every `executing` invocation whose owner is gone becomes `unknown`; report the approved ones whose owner
        is gone (oldest first: they never started, claim and run them) and how many are pending.

        `gone_of` is asked once, with the owners found, after they are read. A missing owner counts as gone; an
        owner that was gone when asked stays gone (instance ids are never reused).
        """
        owners = [row[0] for row in await self._db.fetchall(OWNERS)]
        gone = sorted(await gone_of(owners)) if owners else []
        now = utcnow()
        params = {"gone": gone, "now": now, "reason": PROCESS_STOPPED, "start": states.RECOVER.start}
        reason = json.dumps({"reason": PROCESS_STOPPED}, separators=(",", ":"))

        async def work(conn: Connection) -> tuple[builtins.list[Any], builtins.list[Any], builtins.list[Any], int]:
            at_head = await head(conn)
            unknown = await (await conn.execute(MARK_UNKNOWN, params)).fetchall()
            appended = await append(conn, at_head, changes(unknown, "unknown", now, reason))
            approved = await (await conn.execute(NEVER_STARTED, {"gone": gone})).fetchall()
            counted = await (await conn.execute(COUNT_PENDING)).fetchone()
            return unknown, appended, approved, int(counted[0]) if counted is not None else 0

        unknown, appended, approved, pending = await self._db.transaction(work)
        await self._db.committed(changes_of(appended))
        return RecoveryReport(
            unknown=sorted(row[0] for row in unknown), approved=[row[0] for row in approved], pending=pending
        )


async def _nothing_refuses(conn: Connection, at_head: tuple[int, str]) -> tuple[None, builtins.list[Any]]:
    return None, []


def _record_params(invocation: Invocation) -> dict[str, Any]:
    params = {name: getattr(invocation, name) for name in INVOCATION_COLUMNS}
    params["args"] = stored_json(invocation.args)
    params["result"] = stored_json(invocation.result)
    params["error_message"] = _text(invocation.error_message)
    # The drift diff is stored verbatim, as on SQLite (it comes from definitions the pins hold verbatim).
    params["drift"] = None if invocation.drift is None else json.dumps(invocation.drift, ensure_ascii=False)
    return params


def _transition_params(
    invocation_id: str,
    from_statuses: Collection[Status],
    to: Status,
    fields: Mapping[str, Any],
    at: datetime | None = None,
) -> dict[str, Any]:
    """The parameters of `TRANSITION`, stamped `at` (default: now)."""
    return transition_params(
        invocation_id, builtins.list(from_statuses), to, fields, now=at or utcnow(), value=_field_value
    )


def _field_value(name: str, value: Any) -> Any:
    if name == "result":
        return stored_json(value)
    if name == "expires_at":
        if value is not None and not isinstance(value, datetime):
            raise TypeError(f"expected a datetime, got {type(value).__name__}")
        return value
    if value is not None and not isinstance(value, str):
        raise TypeError(f"transition field {name!r} must be a string or None, got {type(value).__name__}")
    return _text(value) if name == "error_message" else value


def _text(message: str | None) -> str | None:
    """Free text as PostgreSQL can store it: its text type holds no NUL character (U+FFFD stands in)."""
    return None if message is None else message.replace("\x00", "\ufffd")
