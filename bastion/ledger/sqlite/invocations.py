"""The `invocations` and `events` tables: the statements `SqliteLedger` runs on them and how a row maps to an
`Invocation`.

Writes run inside the one transaction `SqliteLedger` opens for each write method; reads run alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from bastion.models import EventKind, Invocation

COLUMNS: Final = (
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
    "drift",
    "created_at",
    "updated_at",
    "expires_at",
)
_COLUMN_LIST: Final = ", ".join(COLUMNS)

SELECT: Final = f"SELECT {_COLUMN_LIST} FROM invocations"
SELECT_ONE: Final = f"{SELECT} WHERE id = ?"
NEWEST_FIRST: Final = " ORDER BY created_at DESC, rowid DESC LIMIT ?"
LIST_FILTERS: Final = ("status = ?", "source_id = ?", "session_id = ?", "principal = ?")
COUNT: Final = "SELECT COUNT(*) FROM invocations"
COUNT_FILTERS: Final = ("status = ?", "session_id = ?")
COUNT_PENDING: Final = f"{COUNT} WHERE status = 'pending'"
INSERT_INVOCATION: Final = f"INSERT INTO invocations ({_COLUMN_LIST}) VALUES ({', '.join('?' * len(COLUMNS))})"
INSERT_EVENT: Final = "INSERT INTO events (invocation_id, seq, kind, at, detail) VALUES (?, ?, ?, ?, ?)"
APPEND_EVENT: Final = """
    INSERT INTO events (invocation_id, seq, kind, at, detail)
    SELECT :id, COALESCE(MAX(seq), 0) + 1, :kind, :at, :detail FROM events WHERE invocation_id = :id
"""
SELECT_EVENTS: Final = "SELECT invocation_id, seq, kind, at, detail FROM events WHERE invocation_id = ? ORDER BY seq"

TRANSITION_FIELDS: Final = ("result", "error_class", "error_message", "owner", "expires_at")
"""The columns `transition` may set besides status and updated_at."""

# One constant statement for every transition: `:set_<field>` says whether the field is being set, and the
# allowed from-statuses arrive as one JSON array, so SQLite can reuse the prepared statement.
TRANSITION: Final = f"""
    UPDATE invocations SET
        status = :to,
        updated_at = :now,
        {", ".join(f"{name} = CASE WHEN :set_{name} THEN :{name} ELSE {name} END" for name in TRANSITION_FIELDS)}
    WHERE id = :id AND status IN (SELECT value FROM json_each(:from_statuses))
    RETURNING {_COLUMN_LIST}
"""

# The outcome of a call that ran: one fixed statement, the hot path's second write.
FINISH: Final = """
    UPDATE invocations SET
        status = :to, updated_at = :now, result = :result, error_class = :error_class, error_message = :error_message
    WHERE id = :id AND status = 'executing'
"""

# An approver's decision: only a pending invocation that has not expired (no expires_at never expires).
DECIDE: Final = f"""
    UPDATE invocations SET
        status = :to,
        updated_at = :now,
        error_class = CASE WHEN :approve THEN error_class ELSE 'approval_denied' END,
        error_message = CASE WHEN :approve THEN error_message ELSE :error_message END
    WHERE id = :id AND status = 'pending' AND (expires_at IS NULL OR expires_at > :now)
    RETURNING {_COLUMN_LIST}
"""
SELECT_STATUS: Final = "SELECT status FROM invocations WHERE id = ?"
_EXPIRE: Final = """
    UPDATE invocations SET
        status = 'expired',
        updated_at = :now,
        error_class = 'approval_expired',
        error_message = 'no decision before ' || expires_at
    WHERE status = 'pending' AND expires_at <= :now
"""
EXPIRE_DUE: Final = f"{_EXPIRE} RETURNING {_COLUMN_LIST}"
EXPIRE_ONE: Final = f"{_EXPIRE} AND id = :id RETURNING {_COLUMN_LIST}"
NEXT_EXPIRY: Final = "SELECT MIN(expires_at) FROM invocations WHERE status = 'pending'"

# Recovery after a restart: `:gone` is a JSON array of the owners that are no longer running.
OWNERS: Final = "SELECT DISTINCT owner FROM invocations WHERE status IN ('executing', 'approved') AND owner IS NOT NULL"
_ORPHANED: Final = "(owner IS NULL OR owner IN (SELECT value FROM json_each(:gone)))"
MARK_UNKNOWN: Final = f"""
    UPDATE invocations SET
        status = 'unknown',
        updated_at = :now,
        error_class = 'unknown_outcome',
        error_message = :reason
    WHERE status = 'executing' AND {_ORPHANED}
    RETURNING id
"""
NEVER_STARTED: Final = f"""
    SELECT id FROM invocations WHERE status = 'approved' AND {_ORPHANED} ORDER BY created_at, rowid
"""
PROCESS_STOPPED: Final = "the Bastion process running it stopped"


def event_params(invocation_id: str, kind: EventKind, at: str, detail: str = "{}") -> dict[str, str]:
    """The parameters of `APPEND_EVENT`."""
    return {"id": invocation_id, "kind": kind, "at": at, "detail": detail}


def invocation_from_row(row: Sequence[Any]) -> Invocation:
    data = dict(zip(COLUMNS, row, strict=True))
    for name in ("args", "result", "drift"):
        if data[name] is not None:
            data[name] = json.loads(data[name])
    for name in ("created_at", "updated_at", "expires_at"):
        if data[name] is not None:
            data[name] = datetime.fromisoformat(data[name])
    return Invocation.model_validate(data)
