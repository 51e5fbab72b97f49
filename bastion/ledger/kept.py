"""The records chained beside invocations: tokens, pins, grants and tool names, whose rows decide who may call,
which tool definition is trusted, what an approver allowed and which action a host's tool name calls. Every change of
one is an event of the audit chain (bastion.ledger.chain) in the transaction that makes it, kept in `record_events`
beside the invocations' `events` (one chain: the two share its positions): its `record` is the row's key (`token:7`,
`pin:fs:write_file`, `grant:always_...`, `name:fs__write_file`) in place of an invocation id, its state the digest of
the row after the change, so `verify` notices a row edited, inserted or deleted behind the ledger as it does for
invocations. Their rows are never deleted; the SQL here is the same on both backends.

A ledger from before they were chained adopts the rows it holds when it upgrades (`record_adopted`): they are vouched
for as they stood then. A prune that removes a record's events restates it first (`record_kept`), once its row still
matches them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple

from bastion.errors import Conflict
from bastion.ledger.backend import GRANT_COLUMNS
from bastion.ledger.chain import Unlinked, record_state

RecordKind = Literal[
    "token_created",
    "token_revoked",
    "pin_saved",
    "pin_accepted",
    "grant_made",
    "grant_revoked",
    "name_given",
    "record_adopted",
    "record_kept",
]
RECORD_KINDS: Final[frozenset[str]] = frozenset(RecordKind.__args__)  # type: ignore[attr-defined]
"""The event kinds of records: an event of one of these has a `record` and no invocation."""


class Kept(NamedTuple):
    """A table of records chained beside invocations."""

    table: str
    prefix: str
    """Its keys begin with this (`token:`); the rest is its key columns joined by `:`."""
    key_columns: tuple[str, ...]
    columns: tuple[str, ...]
    """What its state digests, in this order."""

    @property
    def key(self) -> str:
        """SQL: a row's key, as its events' `record` holds it (qualified by the table: it is used in subqueries)."""
        return f"'{self.prefix}' || " + " || ':' || ".join(f"{self.table}.{name}" for name in self.key_columns)

    @property
    def returning(self) -> str:
        """The RETURNING clause of a change of one of its rows: the columns, the key, and the seq of its newest
        event, so the event recording the change is numbered in the same statement (`changed_record`)."""
        return (
            f"RETURNING {', '.join(f'{self.table}.{name}' for name in self.columns)}, {self.key}, "
            f"(SELECT COALESCE(MAX(seq), 0) FROM record_events WHERE record_events.record = {self.key})"
        )


TOKENS: Final = Kept(
    "tokens",
    "token:",
    ("id",),
    ("id", "name", "role", "profile", "secret_hash", "created_at", "revoked_at"),
)
PINS: Final = Kept(
    "pins",
    "pin:",
    ("source_id", "action_id"),
    (
        "source_id",
        "action_id",
        "fingerprint",
        "structural",
        "definition",
        "seen_at",
        "pinned_by",
        "drift_fingerprint",
        "drift_structural",
        "drift_definition",
        "drift_seen_at",
    ),
)
GRANTS: Final = Kept("grants", "grant:", ("id",), GRANT_COLUMNS)
NAMES: Final = Kept("tool_names", "name:", ("name",), ("name", "source_id", "action_id", "given_at"))
"""The host-visible name given to each action, for good: a name redirected to another action would send a host's
calls of it there."""
KEPT: Final = (TOKENS, PINS, GRANTS, NAMES)


def changed_record(kept: Kept, returned: Sequence[Any], kind: RecordKind, at: str, detail: str = "{}") -> Unlinked:
    """The event recording a change of one of `kept`'s rows, from what its statement returned (`Kept.returning`)."""
    width = len(kept.columns)
    return Unlinked(returned[width], returned[width + 1] + 1, kind, at, detail, record_state(returned[:width]))


def records_sql(kept: Kept, placeholder: str) -> str:
    """A page of `kept`'s rows for `verify`, after a key, in key order: the columns its state digests, the key, the
    state its newest event carries and how many events it has."""
    newest = f"SELECT state FROM record_events WHERE record_events.record = {kept.key} ORDER BY seq DESC LIMIT 1"
    return (
        f"SELECT {', '.join(f'{kept.table}.{name}' for name in kept.columns)}, {kept.key}, ({newest}), "
        f"(SELECT COUNT(*) FROM record_events WHERE record_events.record = {kept.key}) "
        f"FROM {kept.table} WHERE {kept.key} > {placeholder} ORDER BY {kept.key} LIMIT {placeholder}"
    )


def orphans_sql(kept: Kept) -> str:
    """The keys of `kept`'s records that have events but no row (deleted behind the ledger)."""
    return (
        f"SELECT DISTINCT record FROM record_events WHERE substr(record, 1, {len(kept.prefix)}) = '{kept.prefix}' "
        f"AND NOT EXISTS (SELECT 1 FROM {kept.table} WHERE {kept.key} = record_events.record) ORDER BY record "
        "LIMIT 100"
    )


def record_sql(kept: Kept, placeholder: str) -> str:
    """The row of `kept` with the given key, the columns its state digests."""
    columns = ", ".join(f"{kept.table}.{name}" for name in kept.columns)
    return f"SELECT {columns} FROM {kept.table} WHERE {kept.key} = {placeholder}"


def row_sql(key: str, placeholder: str) -> str | None:
    """The query of the row the record key `key` names (`token:7`: the token of id 7), given the key as its one
    parameter; None for a key of no kind of record."""
    kept = next((kept for kept in KEPT if key.startswith(kept.prefix)), None)
    return None if kept is None else record_sql(kept, placeholder)


def adopted_sql(kept: Kept) -> str:
    """Every row of `kept` with the key its events use: what an upgraded ledger adopts, in key order."""
    columns = ", ".join(f"{kept.table}.{name}" for name in kept.columns)
    return f"SELECT {columns}, {kept.key}, 0 FROM {kept.table} ORDER BY {kept.key}"


def stale_sql(placeholder: str) -> str:
    """The records whose every event is at or before a chain position, which a prune through it would remove: their
    key, the seq of their newest event and the state it carries."""
    return (
        "SELECT record, seq, state FROM record_events AS newest WHERE position <= "
        f"{placeholder} AND seq = (SELECT MAX(seq) FROM record_events WHERE record = newest.record) ORDER BY record"
    )


def restated(stale: Sequence[Sequence[Any]], rows: Mapping[str, Sequence[Any]], at: str) -> list[Unlinked]:
    """The `record_kept` events a prune appends before it removes the `stale` records' events (`stale_sql`): each
    carries the state its newest event carried, once the record's row (in `rows`, by key) still matches it. Conflict
    when one does not: a prune never vouches for a row changed behind the ledger."""
    events = []
    for key, seq, state in stale:
        row = rows.get(key)
        if row is None or record_state(row) != state:
            raise Conflict(
                f"record {key} was changed behind the ledger (its row no longer matches its newest event): nothing "
                "was pruned; run `bastion audit verify` and restore the ledger from a backup"
            )
        events.append(Unlinked(key, seq + 1, "record_kept", at, "{}", state))
    return events
