"""The SQLite ledger's schema and its migrations.

`PRAGMA user_version` holds the number of migrations applied. Each migration is a tuple of statements run
in one transaction together with the version bump, so a file is always at exactly one version. Migrations
are only ever appended: later ones go at the end of `MIGRATIONS`.

Timestamps are stored as fixed-width ISO-8601 UTC text with microseconds
(`2026-11-21T10:00:00.000000+00:00`), so they compare and sort lexicographically; JSON as compact UTF-8
text. `timestamp` and `dumps` below produce exactly these forms.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import partial
from typing import Any, Final

import aiosqlite
import anyio

from bastion.errors import ConfigError
from bastion.ledger.chain import GENESIS, event_hash, stored_time
from bastion.ledger.kept import GRANTS, NAMES, PINS, TOKENS
from bastion.ledger.sqlite.chain import adopt_records

Step = str | Callable[[aiosqlite.Connection], Awaitable[None]]
"""A migration's step: a statement, or work in Python on the migrating connection (in its transaction)."""

_APPEND_ONLY_EVENTS: Final = (
    """
    CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'the events table is append-only'); END
    """,
    """
    CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'the events table is append-only'); END
    """,
)

_MIGRATION_1: Final = (
    """
    CREATE TABLE invocations (
        id            TEXT PRIMARY KEY,
        status        TEXT NOT NULL,
        policy_key    TEXT NOT NULL,
        tool          TEXT NOT NULL,
        source_id     TEXT NOT NULL,
        action_id     TEXT NOT NULL,
        risk          TEXT NOT NULL,
        mode          TEXT NOT NULL,
        mode_source   TEXT NOT NULL,
        fingerprint   TEXT,
        session_id    TEXT NOT NULL,
        profile       TEXT,
        principal     TEXT,
        args          TEXT,            -- JSON, redacted then truncated
        args_hash     TEXT NOT NULL,   -- SHA-256 of the raw args
        result        TEXT,            -- JSON, redacted then truncated
        error_class   TEXT,
        error_message TEXT,            -- redacted
        owner         TEXT,
        created_at    TEXT NOT NULL,
        updated_at    TEXT NOT NULL,
        expires_at    TEXT
    )
    """,
    # Listing filters by one column and sorts newest first, so each filter index ends with created_at.
    "CREATE INDEX invocations_status ON invocations (status, created_at)",
    "CREATE INDEX invocations_source ON invocations (source_id, created_at)",
    "CREATE INDEX invocations_session ON invocations (session_id, created_at)",
    "CREATE INDEX invocations_created ON invocations (created_at)",
    # The sweeper's question: which pending invocations have expired?
    "CREATE INDEX invocations_pending_expiry ON invocations (expires_at) WHERE status = 'pending'",
    """
    CREATE TABLE events (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        invocation_id TEXT NOT NULL REFERENCES invocations (id),
        seq           INTEGER NOT NULL,    -- 1..n per invocation
        kind          TEXT NOT NULL,
        at            TEXT NOT NULL,
        detail        TEXT NOT NULL DEFAULT '{}'   -- JSON object, redacted then truncated
    )
    """,
    "CREATE UNIQUE INDEX events_invocation_seq ON events (invocation_id, seq)",
    *_APPEND_ONLY_EVENTS,
)

_MIGRATION_2: Final = (
    # The diff (pinned -> current) of the action's definition when it had drifted at call time: a JSON
    # list of lines, or NULL.
    "ALTER TABLE invocations ADD COLUMN drift TEXT",
    # The trusted definition of each action and, until an approver accepts it, the latest
    # definition seen that differs from it. The drift columns are all NULL or all set.
    """
    CREATE TABLE pins (
        source_id         TEXT NOT NULL,
        action_id         TEXT NOT NULL,   -- the upstream's original tool name
        fingerprint       TEXT NOT NULL,
        structural        TEXT NOT NULL,
        definition        TEXT NOT NULL,   -- JSON object, verbatim
        seen_at           TEXT NOT NULL,
        pinned_by         TEXT,
        drift_fingerprint TEXT,
        drift_structural  TEXT,
        drift_definition  TEXT,            -- JSON object, verbatim
        drift_seen_at     TEXT,
        PRIMARY KEY (source_id, action_id),
        CHECK (
            (drift_fingerprint IS NULL) = (drift_structural IS NULL)
            AND (drift_fingerprint IS NULL) = (drift_definition IS NULL)
            AND (drift_fingerprint IS NULL) = (drift_seen_at IS NULL)
        )
    )
    """,
)

_MIGRATION_3: Final = (
    # Bearer tokens, kept only as the SHA-256 of their secret. A revoked token keeps its
    # row, so a name is unique only among active tokens and may be reused once revoked.
    """
    CREATE TABLE tokens (
        id          INTEGER PRIMARY KEY,
        name        TEXT NOT NULL,
        role        TEXT NOT NULL,   -- owner | admin | agent
        profile     TEXT,            -- agent tokens only: the profile their sessions use
        secret_hash TEXT NOT NULL,   -- SHA-256 hex of the secret
        created_at  TEXT NOT NULL,
        revoked_at  TEXT
    )
    """,
    # Every authenticated HTTP request looks its token up by hash.
    "CREATE UNIQUE INDEX tokens_secret_hash ON tokens (secret_hash)",
    "CREATE UNIQUE INDEX tokens_active_name ON tokens (name) WHERE revoked_at IS NULL",
)

_MIGRATION_4: Final = (
    # Events keyed by (invocation_id, seq) in one b-tree: the rowid table, its AUTOINCREMENT counter and
    # the separate unique index cost three page writes per commit where this costs one, and every tool
    # call commits twice (SQLite's cost per commit grows with the pages it writes).
    """
    CREATE TABLE events_by_invocation (
        invocation_id TEXT NOT NULL REFERENCES invocations (id),
        seq           INTEGER NOT NULL,    -- 1..n per invocation
        kind          TEXT NOT NULL,
        at            TEXT NOT NULL,
        detail        TEXT NOT NULL DEFAULT '{}',  -- JSON object, redacted then truncated
        PRIMARY KEY (invocation_id, seq)
    ) WITHOUT ROWID
    """,
    "INSERT INTO events_by_invocation (invocation_id, seq, kind, at, detail)"
    " SELECT invocation_id, seq, kind, at, detail FROM events",
    "DROP TABLE events",  # with its index and triggers
    "DELETE FROM sqlite_sequence WHERE name = 'events'",
    "ALTER TABLE events_by_invocation RENAME TO events",
    *_APPEND_ONLY_EVENTS,
)

_MIGRATION_5: Final = (
    # One history for the whole ledger: every event gets an increasing id (the rowid), the cursor a stream of
    # events resumes from and the order the change feed announces them in. Events are append-only, so the
    # newest id is never deleted and never reused. (invocation_id, seq) stays unique: it is how an
    # invocation's events are read and numbered.
    """
    CREATE TABLE events_v5 (
        id            INTEGER PRIMARY KEY,
        invocation_id TEXT NOT NULL REFERENCES invocations (id),
        seq           INTEGER NOT NULL,    -- 1..n per invocation
        kind          TEXT NOT NULL,
        at            TEXT NOT NULL,
        detail        TEXT NOT NULL DEFAULT '{}'   -- JSON object, redacted then truncated
    )
    """,
    "INSERT INTO events_v5 (invocation_id, seq, kind, at, detail)"
    " SELECT invocation_id, seq, kind, at, detail FROM events ORDER BY at, invocation_id, seq",
    "DROP TABLE events",  # with its triggers
    "ALTER TABLE events_v5 RENAME TO events",
    "CREATE UNIQUE INDEX events_invocation_seq ON events (invocation_id, seq)",
    *_APPEND_ONLY_EVENTS,
    # Bastion instances and their leases: an instance renews its lease while it runs; one
    # whose lease lapsed is gone, and its executing invocations are unknown, its approved ones free to run.
    """
    CREATE TABLE instances (
        id          TEXT PRIMARY KEY,   -- host:pid:start
        started_at  TEXT NOT NULL,
        renewed_at  TEXT NOT NULL,
        lease_until TEXT NOT NULL
    )
    """,
    # An unkeyed SHA-256 of the arguments lets anyone who reads the file guess redacted values (a 6-digit
    # password in a second). Hashes are keyed from now on (see bastion.ledger.keys); the old ones are dropped,
    # except where an approval may still compare against them.
    "UPDATE invocations SET args_hash = '' WHERE status NOT IN ('pending', 'approved')",
    # The pending limit counts a session's pending invocations in the transaction that adds one. Partial: only
    # calls that wait for approval write to it, never the allow path.
    "CREATE INDEX invocations_pending_session ON invocations (session_id) WHERE status = 'pending'",
)

_MIGRATION_6: Final = (
    # The rate limit, counted in the file so every process sharing it counts together: admissions
    # per key (a session) and second since the epoch (see bastion.ledger.limits). Rows older than the window are
    # deleted as the key is admitted again, and by the change feed's upkeep.
    """
    CREATE TABLE rate_counts (
        key    TEXT NOT NULL,
        second INTEGER NOT NULL,
        count  INTEGER NOT NULL,
        PRIMARY KEY (key, second)
    ) WITHOUT ROWID
    """,
)

_MIGRATION_7: Final = (
    # A step of a manifest action is an invocation of its own, recorded as a child of the manifest's invocation
    # (whose approval covered it). NULL for every other invocation.
    "ALTER TABLE invocations ADD COLUMN parent_id TEXT REFERENCES invocations (id)",
    # A manifest invocation's steps, in order. Partial: the ordinary calls (no parent) never write to it.
    "CREATE INDEX invocations_parent ON invocations (parent_id, created_at) WHERE parent_id IS NOT NULL",
)

_MIGRATION_8: Final = (
    # Webhook messages, kept until the receiver takes them: one per webhook (`target`) and named event
    # (`event_id`, the change feed's id), so re-reading the feed after a restart adds none twice. `next_at` is when
    # it is due (claimed until then while being sent); NULL once delivered or given up.
    """
    CREATE TABLE outbox (
        id           INTEGER PRIMARY KEY,
        target       TEXT NOT NULL,
        event_id     INTEGER NOT NULL,
        body         TEXT NOT NULL,
        attempts     INTEGER NOT NULL DEFAULT 0,
        next_at      TEXT,
        delivered_at TEXT,
        last_error   TEXT,
        UNIQUE (target, event_id)
    )
    """,
    "CREATE INDEX outbox_due ON outbox (next_at) WHERE delivered_at IS NULL AND next_at IS NOT NULL",
)

_MIGRATION_9: Final = (
    # The audit chain (bastion.ledger.chain): every event carries the hash of the one before it (by id: one writer
    # at a time), computed by `bastion_event_hash` in the statement that appends it. The events so far are chained
    # here, in id order. Events stay append-only, except that a retention prune deletes the oldest ones up to a
    # checkpoint, which keeps the last pruned event's hash so what follows still verifies.
    """
    CREATE TABLE audit_checkpoints (
        position    INTEGER PRIMARY KEY,   -- the last pruned event's id
        event_id    INTEGER NOT NULL,
        hash        TEXT NOT NULL,         -- its hash: the previous hash of the first event kept
        at          TEXT NOT NULL,
        events      INTEGER NOT NULL,      -- how many events that prune removed
        invocations INTEGER NOT NULL
    )
    """,
    """
    CREATE TABLE events_v8 (
        id            INTEGER PRIMARY KEY,
        invocation_id TEXT NOT NULL REFERENCES invocations (id),
        seq           INTEGER NOT NULL,    -- 1..n per invocation
        kind          TEXT NOT NULL,
        at            TEXT NOT NULL,
        detail        TEXT NOT NULL DEFAULT '{}',  -- JSON object, redacted then truncated
        prev_hash     TEXT NOT NULL,
        hash          TEXT NOT NULL
    )
    """,
    f"""
    INSERT INTO events_v8 (id, invocation_id, seq, kind, at, detail, prev_hash, hash)
    WITH RECURSIVE chain (id, prev_hash, hash) AS (
        SELECT 0, NULL, '{GENESIS}'
        UNION ALL
        SELECT events.id, chain.hash,
               bastion_event_hash(chain.hash, events.id, events.invocation_id, events.seq, events.kind, events.at,
                                  events.detail)
        FROM chain JOIN events ON events.id = (SELECT MIN(id) FROM events WHERE id > chain.id)
    )
    SELECT events.id, events.invocation_id, events.seq, events.kind, events.at, events.detail, chain.prev_hash,
           chain.hash
    FROM events JOIN chain ON chain.id = events.id
    """,
    "DROP TABLE events",  # with its triggers
    "ALTER TABLE events_v8 RENAME TO events",
    "CREATE UNIQUE INDEX events_invocation_seq ON events (invocation_id, seq)",
    """
    CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'the events table is append-only'); END
    """,
    """
    CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    WHEN old.id > (SELECT COALESCE(MAX(position), 0) FROM audit_checkpoints)
    BEGIN SELECT RAISE(ABORT, 'the events table is append-only (a prune deletes only up to its checkpoint)'); END
    """,
)

_MIGRATION_10: Final = (
    # Where an invocation's risk came from (a connector file's override, an annotation, a default, declared by its
    # source: bastion.models.RiskDecision), shown to approvers. NULL for the calls recorded before.
    "ALTER TABLE invocations ADD COLUMN risk_source TEXT",
)

_MIGRATION_11: Final = (
    # Standing approvals (bastion.pipeline.grants): what an approver's "session", "hour" or "always" approval leaves
    # behind, stored in the transaction of the decision that made it. Rows are never deleted: an ended grant keeps
    # who approved what, until when, and who revoked it. `invocation_id` is not a foreign key: the call that made a
    # grant may be pruned while the grant stands.
    """
    CREATE TABLE grants (
        id            TEXT PRIMARY KEY,
        policy_key    TEXT NOT NULL,
        scope         TEXT NOT NULL,   -- session | hour | always
        session_id    TEXT,            -- the session a "session" grant covers
        principal     TEXT,            -- the caller an "hour" grant covers (NULL: callers without a token)
        rule          TEXT,            -- a CEL condition on the arguments, if the approver gave one
        grantor       TEXT NOT NULL,
        invocation_id TEXT,
        created_at    TEXT NOT NULL,
        expires_at    TEXT,
        revoked_at    TEXT,
        revoked_by    TEXT
    )
    """,
    "CREATE INDEX grants_unrevoked ON grants (policy_key) WHERE revoked_at IS NULL",
)

_MIGRATION_12: Final = (
    # The host-visible name each action was given (bastion.policies.naming): a name stays with its action across
    # restarts, so a source added later cannot take it over. Rows are never deleted.
    """
    CREATE TABLE tool_names (
        name      TEXT PRIMARY KEY,
        source_id TEXT NOT NULL,
        action_id TEXT NOT NULL,
        given_at  TEXT NOT NULL
    )
    """,
)

_MIGRATION_13: Final = (
    # Records chained (bastion.ledger.chain): an event carries `state`, the digest of its invocation row after the
    # change, which its hash covers; the events before stay as they are (state NULL: the pre-chain segment). The head
    # of the chain is kept apart from the events, so losing the newest ones is noticed: taken from the chain as it
    # stands. A prune signs the checkpoint it leaves, when it can.
    "ALTER TABLE events ADD COLUMN state TEXT",
    "ALTER TABLE audit_checkpoints ADD COLUMN key TEXT",  # a prune's signature (bastion.ledger.anchors)
    "ALTER TABLE audit_checkpoints ADD COLUMN signature TEXT",
    "CREATE TABLE audit_head (one INTEGER PRIMARY KEY CHECK (one = 1), position INTEGER NOT NULL, hash TEXT NOT NULL)",
    f"""
    INSERT INTO audit_head (one, position, hash)
    SELECT 1,
           COALESCE(MAX(id), (SELECT MAX(position) FROM audit_checkpoints), 0),
           COALESCE((SELECT hash FROM events ORDER BY id DESC LIMIT 1),
                    (SELECT hash FROM audit_checkpoints ORDER BY position DESC LIMIT 1), '{GENESIS}')
    FROM events
    """,
)

_MIGRATION_14: Final[tuple[Step, ...]] = (
    # Tokens, pins and grants chained beside invocations (bastion.ledger.kept): their events share the chain's
    # positions with the invocations' (`position` is the id an invocation event would have had) and are kept apart,
    # so what reads an invocation's events never meets them. The records already stored are adopted, each with one
    # event, so a row with none is one written behind the ledger.
    """
    CREATE TABLE record_events (
        position  INTEGER PRIMARY KEY,
        record    TEXT NOT NULL,       -- a token's, pin's or grant's key: bastion.ledger.kept
        seq       INTEGER NOT NULL,    -- 1..n per record
        kind      TEXT NOT NULL,
        at        TEXT NOT NULL,
        detail    TEXT NOT NULL DEFAULT '{}',
        state     TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash      TEXT NOT NULL,
        UNIQUE (record, seq)
    )
    """,
    """
    CREATE TRIGGER record_events_no_update BEFORE UPDATE ON record_events
    BEGIN SELECT RAISE(ABORT, 'the record_events table is append-only'); END
    """,
    """
    CREATE TRIGGER record_events_no_delete BEFORE DELETE ON record_events
    WHEN old.position > (SELECT COALESCE(MAX(position), 0) FROM audit_checkpoints)
    BEGIN SELECT RAISE(ABORT, 'the record_events table is append-only (a prune deletes only up to its checkpoint)'); END
    """,
    partial(adopt_records, kinds=(TOKENS, PINS, GRANTS)),
)

_MIGRATION_15: Final[tuple[Step, ...]] = (
    # Tool names chained too (bastion.ledger.kept NAMES): the names already given are adopted, one event each.
    partial(adopt_records, kinds=(NAMES,)),
)

MIGRATIONS: Final[tuple[tuple[Step, ...], ...]] = (
    _MIGRATION_1,
    _MIGRATION_2,
    _MIGRATION_3,
    _MIGRATION_4,
    _MIGRATION_5,
    _MIGRATION_6,
    _MIGRATION_7,
    _MIGRATION_8,
    _MIGRATION_9,
    _MIGRATION_10,
    _MIGRATION_11,
    _MIGRATION_12,
    _MIGRATION_13,
    _MIGRATION_14,
    _MIGRATION_15,
)
"""Migration N (1-based) brings a ledger from user_version N-1 to N."""

SCHEMA_VERSION: Final = len(MIGRATIONS)


async def schema_version(db: aiosqlite.Connection) -> int:
    """The number of migrations applied to the open ledger file (0 for a new file)."""
    rows = list(await db.execute_fetchall("PRAGMA user_version"))
    return int(rows[0][0])


async def migrate(db: aiosqlite.Connection, *, to_version: int = SCHEMA_VERSION) -> None:
    """Apply the missing migrations up to `to_version` (tests build old files with a lower one), each in
    its own transaction.

    The connection must be in autocommit mode (`isolation_level=None`). The version is re-read after the
    write lock is taken, so two processes opening a new file at once apply each migration exactly once.
    Raises ConfigError when the file was written by a newer Bastion than this one.
    """
    if not 0 <= to_version <= SCHEMA_VERSION:
        raise ValueError(f"to_version must be between 0 and {SCHEMA_VERSION}, got {to_version}")
    while True:
        current = await schema_version(db)
        await _refuse_newer(db, current)
        if current >= to_version:
            return
        # Shielded: a cancellation between statements would leave the transaction open on the connection.
        with anyio.CancelScope(shield=True):
            await db.execute("BEGIN IMMEDIATE")
            try:
                if await schema_version(db) == current:
                    for step in MIGRATIONS[current]:
                        if isinstance(step, str):
                            await db.execute(step)
                        else:
                            await step(db)
                    # PRAGMA takes no parameters; the version is an int we computed.
                    await db.execute(f"PRAGMA user_version = {current + 1:d}")
                await db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    await db.execute("ROLLBACK")
                raise


async def _refuse_newer(db: aiosqlite.Connection, version: int) -> None:
    if version <= SCHEMA_VERSION:
        return
    rows = list(await db.execute_fetchall("PRAGMA database_list"))
    path = next((str(row[2]) for row in rows if row[1] == "main"), "the ledger")
    raise ConfigError(
        f"{path}: the ledger has schema version {version} but this Bastion knows only up to {SCHEMA_VERSION}; "
        "upgrade Bastion to use this ledger (or point [server] ledger at another file)"
    )


HASH_FUNCTION: Final = "bastion_event_hash"
"""The SQL function computing an event's chain hash (bastion.ledger.chain.event_hash), on every connection."""


def register_functions(conn: sqlite3.Connection) -> None:
    """Give a connection the SQL functions the schema uses (the audit chain's hash)."""
    conn.create_function(HASH_FUNCTION, 7, event_hash, deterministic=True)


async def register_functions_async(db: aiosqlite.Connection) -> None:
    await db.create_function(HASH_FUNCTION, 7, event_hash, deterministic=True)


timestamp: Final = stored_time
"""Fixed-width ISO-8601 UTC with microseconds, so stored timestamps sort as text (naive means UTC): the one form the
event chain hashes, so a stored event's time is the text its hash was computed from."""


def optional_timestamp(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    if not isinstance(moment, datetime):
        raise TypeError(f"expected a datetime, got {type(moment).__name__}")
    return timestamp(moment)


def dumps(value: Any) -> str:
    """Compact JSON text, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
