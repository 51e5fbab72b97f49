"""The PostgreSQL ledger's schema and its versioned migrations, applied at start under an advisory lock.

`bastion_schema` holds one row per migration applied. Every instance opening the database takes the same
session-level advisory lock before it reads that table, so of several instances starting at once exactly one
applies each missing migration (each in its own transaction, with its row) while the others wait, then find it
done. Migrations are only ever appended: later ones go at the end of `MIGRATIONS`.

The tables mirror the SQLite ledger's (bastion.ledger.sqlite.schema) with PostgreSQL's own types: timestamps
are `timestamptz`, ids compare by code point (`COLLATE "C"`, as SQLite compares UTF-8 bytes), JSON is text
stored exactly as the Recorder scrubbed it. Two columns exist only here: `invocations.position` orders rows
inserted with the same `created_at` (SQLite's rowid), and `invocations.last_seq` numbers an invocation's events
inside the statement that changes it (see bastion.ledger.postgres.invocations).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from bastion.errors import ConfigError
from bastion.ledger.chain import GENESIS
from bastion.ledger.kept import GRANTS, NAMES, PINS, TOKENS, Kept

Step = str | Callable[[AsyncConnection[TupleRow]], Awaitable[None]]
"""A migration's step: a statement, or work in Python on the migrating connection (in its transaction)."""

MIGRATION_LOCK: Final = 0x6261_7374_696F_6E01
"""The advisory lock key every instance takes while it migrates (`bastion` in ASCII, then 1)."""

_MIGRATION_1: Final = (
    """
    CREATE TABLE invocations (
        id            text COLLATE "C" PRIMARY KEY,
        position      bigint GENERATED ALWAYS AS IDENTITY,
        status        text NOT NULL,
        policy_key    text NOT NULL,
        tool          text NOT NULL,
        source_id     text NOT NULL,
        action_id     text NOT NULL,
        risk          text NOT NULL,
        mode          text NOT NULL,
        mode_source   text NOT NULL,
        fingerprint   text,
        session_id    text NOT NULL,
        profile       text,
        principal     text,
        args          text,            -- JSON, redacted then truncated
        args_hash     text NOT NULL,   -- keyed hash of the raw args (bastion.ledger.keys)
        result        text,            -- JSON, redacted then truncated
        error_class   text,
        error_message text,            -- redacted
        owner         text,
        drift         text,            -- JSON list of diff lines, or NULL
        created_at    timestamptz NOT NULL,
        updated_at    timestamptz NOT NULL,
        expires_at    timestamptz,
        parent_id     text COLLATE "C" REFERENCES invocations (id),  -- a manifest step's manifest invocation
        last_seq      integer NOT NULL -- the seq of its newest event
    )
    """,
    "CREATE INDEX invocations_status ON invocations (status, created_at)",
    "CREATE INDEX invocations_source ON invocations (source_id, created_at)",
    "CREATE INDEX invocations_session ON invocations (session_id, created_at)",
    "CREATE INDEX invocations_created ON invocations (created_at, position)",
    "CREATE INDEX invocations_parent ON invocations (parent_id, created_at) WHERE parent_id IS NOT NULL",
    "CREATE INDEX invocations_pending_expiry ON invocations (expires_at) WHERE status = 'pending'",
    "CREATE INDEX invocations_pending_session ON invocations (session_id) WHERE status = 'pending'",
    # One history for the whole ledger: ids from a sequence, so they have gaps (a rolled-back insert) and commit
    # out of order (see bastion.ledger.postgres.feed for how the change feed copes).
    """
    CREATE TABLE events (
        id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        invocation_id text COLLATE "C" NOT NULL REFERENCES invocations (id),
        seq           integer NOT NULL,   -- 1..n per invocation
        kind          text NOT NULL,
        at            timestamptz NOT NULL,
        detail        text NOT NULL DEFAULT '{}',   -- JSON object, redacted then truncated
        UNIQUE (invocation_id, seq)
    )
    """,
    """
    CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'the events table is append-only';
    END
    $$
    """,
    """
    CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only()
    """,
    """
    CREATE TABLE pins (
        source_id         text COLLATE "C" NOT NULL,
        action_id         text COLLATE "C" NOT NULL,
        fingerprint       text NOT NULL,
        structural        text NOT NULL,
        definition        text NOT NULL,   -- JSON object, verbatim
        seen_at           timestamptz NOT NULL,
        pinned_by         text,
        drift_fingerprint text,
        drift_structural  text,
        drift_definition  text,
        drift_seen_at     timestamptz,
        PRIMARY KEY (source_id, action_id),
        CHECK (
            (drift_fingerprint IS NULL) = (drift_structural IS NULL)
            AND (drift_fingerprint IS NULL) = (drift_definition IS NULL)
            AND (drift_fingerprint IS NULL) = (drift_seen_at IS NULL)
        )
    )
    """,
    """
    CREATE TABLE tokens (
        id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name        text NOT NULL,
        role        text NOT NULL,
        profile     text,
        secret_hash text NOT NULL,
        created_at  timestamptz NOT NULL,
        revoked_at  timestamptz
    )
    """,
    "CREATE UNIQUE INDEX tokens_secret_hash ON tokens (secret_hash)",
    "CREATE UNIQUE INDEX tokens_active_name ON tokens (name) WHERE revoked_at IS NULL",
    """
    CREATE TABLE instances (
        id          text PRIMARY KEY,
        started_at  timestamptz NOT NULL,
        renewed_at  timestamptz NOT NULL,
        lease_until timestamptz NOT NULL
    )
    """,
    """
    CREATE TABLE rate_counts (
        key    text NOT NULL,
        second bigint NOT NULL,
        count  integer NOT NULL,
        PRIMARY KEY (key, second)
    )
    """,
    # Facts about the ledger itself: `key_check` proves which key of argument hashes it is used with.
    "CREATE TABLE ledger_meta (name text PRIMARY KEY, value text NOT NULL)",
)

_MIGRATION_2: Final = (
    # Webhook messages, as in SQLite's migration 8 (the audit chain is migration 3 here, 9 there).
    """
    CREATE TABLE outbox (
        id           bigserial PRIMARY KEY,
        target       text COLLATE "C" NOT NULL,
        event_id     bigint NOT NULL,
        body         text NOT NULL,
        attempts     integer NOT NULL DEFAULT 0,
        next_at      timestamptz,
        delivered_at timestamptz,
        last_error   text,
        UNIQUE (target, event_id)
    )
    """,
    "CREATE INDEX outbox_due ON outbox (next_at) WHERE delivered_at IS NULL AND next_at IS NOT NULL",
)

_MIGRATION_3: Final = (
    # The audit chain (bastion.ledger.chain). Event ids commit out of order here, so the chain has its own order:
    # `position`, numbered from the one row of `audit_head`, which the trigger appending an event locks until
    # commit (writers append to the chain one transaction after another). A retention prune deletes the oldest
    # events up to a checkpoint keeping the last pruned hash; nothing else may update or delete an event.
    """
    CREATE FUNCTION bastion_event_hash(text, bigint, text, integer, text, timestamptz, text) RETURNS text
    LANGUAGE sql AS $$
        SELECT encode(sha256(convert_to(concat_ws(E'\\n', $1, $2::text, $3, $4::text, $5,
            to_char($6 AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'), $7), 'UTF8')), 'hex')
    $$
    """,
    "CREATE TABLE audit_head (one boolean PRIMARY KEY DEFAULT true CHECK (one), position bigint NOT NULL, "
    "hash text NOT NULL)",
    """
    CREATE TABLE audit_checkpoints (
        position    bigint PRIMARY KEY,   -- the last pruned event's position
        event_id    bigint NOT NULL,
        hash        text NOT NULL,        -- its hash: the previous hash of the first event kept
        at          timestamptz NOT NULL,
        events      integer NOT NULL,
        invocations integer NOT NULL
    )
    """,
    "DROP TRIGGER events_append_only ON events",
    "ALTER TABLE events ADD COLUMN position bigint, ADD COLUMN prev_hash text, ADD COLUMN hash text",
    f"""
    DO $$
    DECLARE
        event record;
        head text := '{GENESIS}';
        counted bigint := 0;
    BEGIN
        FOR event IN SELECT * FROM events ORDER BY id LOOP
            counted := counted + 1;
            UPDATE events SET position = counted, prev_hash = head,
                hash = bastion_event_hash(head, event.id, event.invocation_id, event.seq, event.kind, event.at,
                                          event.detail)
            WHERE id = event.id RETURNING hash INTO head;
        END LOOP;
        INSERT INTO audit_head (position, hash) VALUES (counted, head);
    END
    $$
    """,
    "ALTER TABLE events ALTER COLUMN position SET NOT NULL, ALTER COLUMN prev_hash SET NOT NULL, "
    "ALTER COLUMN hash SET NOT NULL",
    "CREATE UNIQUE INDEX events_position ON events (position)",
    """
    CREATE FUNCTION events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        head audit_head%ROWTYPE;
    BEGIN
        SELECT * INTO head FROM audit_head FOR UPDATE;
        NEW.position := head.position + 1;
        NEW.prev_hash := head.hash;
        NEW.hash := bastion_event_hash(head.hash, NEW.id, NEW.invocation_id, NEW.seq, NEW.kind, NEW.at, NEW.detail);
        UPDATE audit_head SET position = NEW.position, hash = NEW.hash;
        RETURN NEW;
    END
    $$
    """,
    "CREATE TRIGGER events_chain BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION events_chain()",
    """
    CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only()
    """,
    """
    CREATE FUNCTION events_prune_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF OLD.position > (SELECT COALESCE(MAX(position), 0) FROM audit_checkpoints) THEN
            RAISE EXCEPTION 'the events table is append-only (a prune deletes only up to its checkpoint)';
        END IF;
        RETURN OLD;
    END
    $$
    """,
    "CREATE TRIGGER events_prune_only BEFORE DELETE ON events FOR EACH ROW EXECUTE FUNCTION events_prune_only()",
)

_MIGRATION_4: Final = (
    # Where an invocation's risk came from, as in SQLite's migration 10. NULL for the calls recorded before.
    "ALTER TABLE invocations ADD COLUMN risk_source text",
)

_MIGRATION_5: Final = (
    # Standing approvals, as in SQLite's migration 11: never deleted; `invocation_id` is not a foreign key (the call
    # that made a grant may be pruned while it stands).
    """
    CREATE TABLE grants (
        id            text PRIMARY KEY,
        policy_key    text NOT NULL,
        scope         text NOT NULL,
        session_id    text,
        principal     text,
        rule          text,
        grantor       text NOT NULL,
        invocation_id text,
        created_at    timestamptz NOT NULL,
        expires_at    timestamptz,
        revoked_at    timestamptz,
        revoked_by    text
    )
    """,
    "CREATE INDEX grants_unrevoked ON grants (policy_key) WHERE revoked_at IS NULL",
)

_MIGRATION_6: Final = (
    # The host-visible name each action was given, as in SQLite's migration 12: never deleted.
    """
    CREATE TABLE tool_names (
        name      text PRIMARY KEY,
        source_id text NOT NULL,
        action_id text NOT NULL,
        given_at  timestamptz NOT NULL
    )
    """,
)

_MIGRATION_7: Final = (
    # Records chained, as in SQLite's migration 13: an event carries `state`, the digest of its invocation row after
    # the change, which its hash covers (NULL for the events before: the pre-chain segment). The chain is computed in
    # Python now, for both backends (bastion.ledger.postgres.chain): the trigger and function that computed it here go.
    "ALTER TABLE events ADD COLUMN state text",
    "ALTER TABLE audit_checkpoints ADD COLUMN key text, ADD COLUMN signature text",
    "DROP TRIGGER events_chain ON events",
    "DROP FUNCTION events_chain()",
    "DROP FUNCTION bastion_event_hash(text, bigint, text, integer, text, timestamptz, text)",
)


def _adopting(*kinds: Kept) -> Step:
    """The step that adopts the records of `kinds` a database holds (`record_adopted`, one event each)."""

    async def adopt(conn: AsyncConnection[TupleRow]) -> None:
        # Imported here: the chain's module reaches this one through the database's.
        from bastion.ledger.postgres.chain import adopt_records

        await adopt_records(conn, kinds)

    return adopt


_MIGRATION_8: Final[tuple[Step, ...]] = (
    # Tokens, pins and grants chained beside invocations, as in SQLite's migration 14 (bastion.ledger.kept): their
    # events share the chain's positions and are kept apart; the records already stored are adopted, one event each.
    """
    CREATE TABLE record_events (
        position  bigint PRIMARY KEY,
        record    text COLLATE "C" NOT NULL,
        seq       integer NOT NULL,
        kind      text NOT NULL,
        at        timestamptz NOT NULL,
        detail    text NOT NULL DEFAULT '{}',
        state     text NOT NULL,
        prev_hash text NOT NULL,
        hash      text NOT NULL,
        UNIQUE (record, seq)
    )
    """,
    """
    CREATE TRIGGER record_events_no_update BEFORE UPDATE ON record_events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only()
    """,
    """
    CREATE TRIGGER record_events_prune_only BEFORE DELETE ON record_events
    FOR EACH ROW EXECUTE FUNCTION events_prune_only()
    """,
    _adopting(TOKENS, PINS, GRANTS),
)

_MIGRATION_9: Final[tuple[Step, ...]] = (
    # Tool names chained too, as in SQLite's migration 15: the names already given are adopted, one event each.
    _adopting(NAMES),
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
)
"""Migration N (1-based) brings a database from version N-1 to N."""

SCHEMA_VERSION: Final = len(MIGRATIONS)

_CREATE_VERSIONS: Final = """
    CREATE TABLE IF NOT EXISTS bastion_schema (
        version    integer PRIMARY KEY,
        applied_at timestamptz NOT NULL DEFAULT now()
    )
"""
_CURRENT: Final = "SELECT COALESCE(MAX(version), 0) FROM bastion_schema"
_APPLIED: Final = "INSERT INTO bastion_schema (version) VALUES (%s)"


async def migrate(conn: AsyncConnection[TupleRow], *, where: str, to_version: int = SCHEMA_VERSION) -> None:
    """Bring the database to `to_version` (tests build old ones with a lower one), under the migration lock.

    `conn` must be in autocommit mode and used by nobody else. Raises ConfigError when the database was written
    by a newer Bastion (`where` names it in the message).
    """
    if not 0 <= to_version <= SCHEMA_VERSION:
        raise ValueError(f"to_version must be between 0 and {SCHEMA_VERSION}, got {to_version}")
    await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
    try:
        await conn.execute(_CREATE_VERSIONS)
        current = await schema_version(conn)
        if current > SCHEMA_VERSION:
            raise ConfigError(
                f"{where}: the ledger has schema version {current} but this Bastion knows only up to "
                f"{SCHEMA_VERSION}; upgrade Bastion to use this ledger (or point [server] ledger at another database)"
            )
        for version in range(current + 1, to_version + 1):
            async with conn.transaction():
                for step in MIGRATIONS[version - 1]:
                    if isinstance(step, str):
                        await conn.execute(step)
                    else:
                        await step(conn)
                await conn.execute(_APPLIED, (version,))
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))


async def schema_version(conn: AsyncConnection[TupleRow]) -> int:
    """The number of migrations applied (0 for a new database)."""
    cursor = await conn.execute(_CURRENT)
    row = await cursor.fetchone()
    return int(row[0]) if row is not None else 0
