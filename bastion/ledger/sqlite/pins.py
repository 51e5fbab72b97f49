"""The `pins` table: the SQLite pin store (`SqlitePins`), how a `Pin` is stored, and its statements.

The functions taking a `sqlite3.Connection` run inside the transaction `SqliteDatabase.write` opened for them.

Definitions are stored verbatim, never passed through the redactor: they are the tool definitions an
upstream server publishes, not secrets, and a scrubbed copy would make fingerprints and diffs lie.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from bastion.errors import NotFound
from bastion.ledger.kept import NAMES, PINS
from bastion.ledger.sqlite.chain import recorded, recorded_each
from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.ledger.sqlite.schema import dumps, timestamp
from bastion.models import Pin, PinObservation, policy_key, utcnow

_OBSERVATION_FIELDS: Final = ("fingerprint", "structural", "definition", "seen_at")
_PINNED_COLUMNS: Final = _OBSERVATION_FIELDS
_DRIFT_COLUMNS: Final = tuple(f"drift_{name}" for name in _OBSERVATION_FIELDS)
_COLUMNS: Final = PINS.columns
"""source_id, action_id, the pinned observation, pinned_by, the drift observation."""
_COLUMN_LIST: Final = ", ".join(_COLUMNS)

_SELECT: Final = f"SELECT {_COLUMN_LIST} FROM pins"
_BY_KEY: Final = " ORDER BY source_id, action_id"
_SELECT_ALL: Final = _SELECT + _BY_KEY
_SELECT_SOURCE: Final = _SELECT + " WHERE source_id = ?" + _BY_KEY

_UPSERT: Final = f"""
    INSERT INTO pins ({_COLUMN_LIST}) VALUES ({", ".join("?" * len(_COLUMNS))})
    ON CONFLICT (source_id, action_id) DO UPDATE SET
        {", ".join(f"{name} = excluded.{name}" for name in _COLUMNS[2:])}
    {PINS.returning}
"""

# Every right-hand side of an UPDATE reads the row as it was before the update, so the drift columns are
# copied into the pinned ones and cleared in the same statement.
_ACCEPT: Final = f"""
    UPDATE pins SET
        {", ".join(f"{pinned} = {drift}" for pinned, drift in zip(_PINNED_COLUMNS, _DRIFT_COLUMNS, strict=True))},
        {", ".join(f"{drift} = NULL" for drift in _DRIFT_COLUMNS)},
        pinned_by = :principal
    WHERE source_id = :source_id
        AND (:action_id IS NULL OR action_id = :action_id)
        AND drift_fingerprint IS NOT NULL
    {PINS.returning}
"""
_EXISTS: Final = "SELECT 1 FROM pins WHERE source_id = ? AND action_id = ?"
_NAMES: Final = "SELECT name, source_id, action_id FROM tool_names"
_KEEP_NAME: Final = f"""
    INSERT INTO tool_names (name, source_id, action_id, given_at) VALUES (?, ?, ?, ?) ON CONFLICT (name) DO NOTHING
    {NAMES.returning}
"""


class SqlitePins:
    """The trusted definition of every action, and its drift; satisfies `bastion.pipeline.seams.PinStore`."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def pins(self, source_id: str | None = None) -> list[Pin]:
        """Every pin, or those of one source, sorted by source and action."""
        return [pin_from_row(row) for row in await self._db.fetchall(*select_pins(source_id))]

    async def save_pin(self, pin: Pin) -> None:
        """Insert or replace the pin of (source_id, action_id), drift included."""

        def work(conn: sqlite3.Connection) -> None:
            save_pin(conn, pin)

        await self._db.write(work)

    async def accept_drift(self, *, source_id: str, action_id: str | None = None, principal: str | None) -> list[Pin]:
        """Re-pin the drifted action `action_id`, or every drifted action of the source, to its drifted
        definition, in one transaction: pinned := drift, drift := none, pinned_by := principal.

        Returns the accepted pins (none when nothing had drifted). Raises NotFound when `action_id` names
        no pin.
        """

        def work(conn: sqlite3.Connection) -> list[Pin]:
            return accept_drift(conn, source_id=source_id, action_id=action_id, principal=principal)

        return await self._db.write(work)

    async def tool_names(self) -> dict[str, tuple[str, str]]:
        """Every host name given to an action: name -> (source_id, action_id)."""
        return {name: (source_id, action_id) for name, source_id, action_id in await self._db.fetchall(_NAMES)}

    async def keep_tool_names(self, names: Mapping[str, tuple[str, str]], *, now: datetime) -> None:
        """Remember that each name was given to its action (`name_given`, chained); a name already given to one
        stays with it."""
        at = timestamp(now)
        rows = [(name, source_id, action_id, at) for name, (source_id, action_id) in names.items()]

        def work(conn: sqlite3.Connection) -> None:
            recorded_each(conn, _KEEP_NAME, rows, NAMES, "name_given", at)

        await self._db.write(work)


def select_pins(source_id: str | None) -> tuple[str, tuple[str, ...]]:
    """The query (and its parameters) listing the pins, of one source or all, sorted by source and action."""
    if source_id is None:
        return _SELECT_ALL, ()
    return _SELECT_SOURCE, (source_id,)


def save_pin(conn: sqlite3.Connection, pin: Pin) -> None:
    """Insert the pin, or replace every column of the existing one with the same key."""
    drift = pin.drift
    recorded(
        conn,
        _UPSERT,
        (
            pin.source_id,
            pin.action_id,
            *_observation_values(pin.pinned),
            pin.pinned_by,
            *(_observation_values(drift) if drift is not None else (None,) * len(_DRIFT_COLUMNS)),
        ),
        PINS,
        "pin_saved",
        timestamp(utcnow()),
    )


def accept_drift(
    conn: sqlite3.Connection, *, source_id: str, action_id: str | None, principal: str | None
) -> list[Pin]:
    """Re-pin the drifted action `action_id` (or every drifted action of the source) to its drift observation.

    Returns the accepted pins sorted by action. Raises NotFound when `action_id` names no pin.
    """
    params = {"source_id": source_id, "action_id": action_id, "principal": principal}
    rows = recorded(conn, _ACCEPT, params, PINS, "pin_accepted", timestamp(utcnow()))
    accepted = [pin_from_row(row) for row in rows]
    if not accepted and action_id is not None and conn.execute(_EXISTS, (source_id, action_id)).fetchone() is None:
        raise NotFound(f"no pin for {policy_key(source_id, action_id)}")
    return sorted(accepted, key=lambda pin: pin.action_id)


def pin_from_row(row: Sequence[Any]) -> Pin:
    data = dict(zip(_COLUMNS, row, strict=True))
    drift_values = [data[name] for name in _DRIFT_COLUMNS]
    return Pin(
        source_id=data["source_id"],
        action_id=data["action_id"],
        pinned=_observation([data[name] for name in _PINNED_COLUMNS]),
        pinned_by=data["pinned_by"],
        drift=None if drift_values[0] is None else _observation(drift_values),
    )


def _observation_values(observation: PinObservation) -> tuple[str, str, str, str]:
    return (
        observation.fingerprint,
        observation.structural,
        dumps(observation.definition),
        timestamp(observation.seen_at),
    )


def _observation(values: Sequence[Any]) -> PinObservation:
    fingerprint, structural, definition, seen_at = values
    return PinObservation(
        fingerprint=fingerprint,
        structural=structural,
        definition=json.loads(definition),
        seen_at=datetime.fromisoformat(seen_at),
    )
