"""The `pins` table on PostgreSQL: the pin store (`PostgresPins`). Definitions are stored verbatim,
never through the redactor, as on SQLite (see bastion.ledger.sqlite.pins for why)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from bastion.errors import NotFound
from bastion.ledger.kept import NAMES, PINS
from bastion.ledger.postgres.chain import recorded
from bastion.ledger.postgres.database import Connection, PostgresDatabase
from bastion.models import Pin, PinObservation, policy_key, utcnow

_OBSERVATION_FIELDS: Final = ("fingerprint", "structural", "definition", "seen_at")
_PINNED_COLUMNS: Final = _OBSERVATION_FIELDS
_DRIFT_COLUMNS: Final = tuple(f"drift_{name}" for name in _OBSERVATION_FIELDS)
_COLUMNS: Final = ("source_id", "action_id", *_PINNED_COLUMNS, "pinned_by", *_DRIFT_COLUMNS)
_COLUMN_LIST: Final = ", ".join(_COLUMNS)

_SELECT: Final = f"SELECT {_COLUMN_LIST} FROM pins"
_BY_KEY: Final = " ORDER BY source_id, action_id"
_UPSERT: Final = f"""
    INSERT INTO pins ({_COLUMN_LIST}) VALUES ({", ".join(["%s"] * len(_COLUMNS))})
    ON CONFLICT (source_id, action_id) DO UPDATE SET
        {", ".join(f"{name} = excluded.{name}" for name in _COLUMNS[2:])}
    {PINS.returning}
"""
# The right-hand sides read the row as it was before the update: drift is copied into the pin and cleared at once.
_ACCEPT: Final = f"""
    UPDATE pins SET
        {", ".join(f"{pinned} = {drift}" for pinned, drift in zip(_PINNED_COLUMNS, _DRIFT_COLUMNS, strict=True))},
        {", ".join(f"{drift} = NULL" for drift in _DRIFT_COLUMNS)},
        pinned_by = %(principal)s
    WHERE source_id = %(source_id)s
        AND (%(action_id)s::text IS NULL OR action_id = %(action_id)s)
        AND drift_fingerprint IS NOT NULL
    {PINS.returning}
"""
_EXISTS: Final = "SELECT 1 FROM pins WHERE source_id = %s AND action_id = %s"
_NAMES: Final = "SELECT name, source_id, action_id FROM tool_names"
_KEEP_NAMES: Final = f"""
    INSERT INTO tool_names (name, source_id, action_id, given_at)
    SELECT name, source_id, action_id, %(now)s
    FROM unnest(%(names)s::text[], %(sources)s::text[], %(actions)s::text[]) AS given (name, source_id, action_id)
    ON CONFLICT (name) DO NOTHING
    {NAMES.returning}
"""


class PostgresPins:
    """The trusted definition of every action, and its drift; satisfies `bastion.pipeline.seams.PinStore`."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def pins(self, source_id: str | None = None) -> list[Pin]:
        """Every pin, or those of one source, sorted by source and action."""
        if source_id is None:
            rows = await self._db.fetchall(_SELECT + _BY_KEY)
        else:
            rows = await self._db.fetchall(_SELECT + " WHERE source_id = %s" + _BY_KEY, (source_id,))
        return [_pin_from_row(row) for row in rows]

    async def save_pin(self, pin: Pin) -> None:
        """Insert or replace the pin of (source_id, action_id), drift included."""
        drift = pin.drift
        params = (
            pin.source_id,
            pin.action_id,
            *_observation_values(pin.pinned),
            pin.pinned_by,
            *(_observation_values(drift) if drift is not None else (None,) * len(_DRIFT_COLUMNS)),
        )
        now = utcnow()
        await self._db.transaction(lambda conn: recorded(conn, _UPSERT, params, PINS, "pin_saved", now))

    async def accept_drift(self, *, source_id: str, action_id: str | None = None, principal: str | None) -> list[Pin]:
        """Re-pin the drifted action `action_id`, or every drifted action of the source, to its drifted definition,
        in one transaction. Returns the accepted pins (sorted by action). NotFound when `action_id` names no pin."""
        params = {"source_id": source_id, "action_id": action_id, "principal": principal}

        async def work(conn: Connection) -> list[Pin]:
            rows = await recorded(conn, _ACCEPT, params, PINS, "pin_accepted", utcnow())
            accepted = [_pin_from_row(row) for row in rows]
            if not accepted and action_id is not None:
                exists = await (await conn.execute(_EXISTS, (source_id, action_id))).fetchone()
                if exists is None:
                    raise NotFound(f"no pin for {policy_key(source_id, action_id)}")
            return sorted(accepted, key=lambda pin: pin.action_id)

        return await self._db.transaction(work)

    async def tool_names(self) -> dict[str, tuple[str, str]]:
        """Every host name given to an action: name -> (source_id, action_id)."""
        return {name: (source_id, action_id) for name, source_id, action_id in await self._db.fetchall(_NAMES)}

    async def keep_tool_names(self, names: Mapping[str, tuple[str, str]], *, now: datetime) -> None:
        """Remember that each name was given to its action (`name_given`, chained); a name already given to one
        stays with it."""
        keys = list(names.values())
        params = {
            "names": list(names),
            "sources": [source_id for source_id, _ in keys],
            "actions": [action_id for _, action_id in keys],
            "now": now,
        }

        async def work(conn: Connection) -> None:
            await recorded(conn, _KEEP_NAMES, params, NAMES, "name_given", now)

        await self._db.transaction(work)


def _pin_from_row(row: Sequence[Any]) -> Pin:
    data = dict(zip(_COLUMNS, row, strict=True))
    drift_values = [data[name] for name in _DRIFT_COLUMNS]
    return Pin(
        source_id=data["source_id"],
        action_id=data["action_id"],
        pinned=_observation([data[name] for name in _PINNED_COLUMNS]),
        pinned_by=data["pinned_by"],
        drift=None if drift_values[0] is None else _observation(drift_values),
    )


def _observation_values(observation: PinObservation) -> tuple[Any, ...]:
    definition = json.dumps(observation.definition, ensure_ascii=False, separators=(",", ":"))
    return (observation.fingerprint, observation.structural, definition, observation.seen_at)


def _observation(values: Sequence[Any]) -> PinObservation:
    fingerprint, structural, definition, seen_at = values
    return PinObservation(
        fingerprint=fingerprint, structural=structural, definition=json.loads(definition), seen_at=seen_at
    )
