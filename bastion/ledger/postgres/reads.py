"""Reading the `invocations` and `events` tables of a PostgreSQL ledger (`PostgresInvocationReads`: bastion.ledger.
invocation_reads with PostgreSQL's placeholder and timestamps), and how a row maps to an `Invocation`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from bastion.ledger.backend import INVOCATION_COLUMNS
from bastion.ledger.invocation_reads import InvocationReads
from bastion.ledger.postgres.database import PostgresDatabase
from bastion.models import Invocation

_INVOCATION_WIDTH: Final = len(INVOCATION_COLUMNS)


def invocation_from_row(row: Sequence[Any]) -> Invocation:
    data = dict(zip(INVOCATION_COLUMNS, row[:_INVOCATION_WIDTH], strict=True))
    for name in ("args", "result", "drift"):
        if data[name] is not None:
            data[name] = json.loads(data[name])
    return Invocation.model_validate(data)


def as_is(moment: datetime) -> datetime:
    """A timestamp as psycopg gives it back: a datetime already."""
    return moment


class PostgresInvocationReads(InvocationReads):
    """The reads of the invocation store in one PostgreSQL database."""

    def __init__(self, db: PostgresDatabase) -> None:
        super().__init__(db, placeholder="%s", insertion="position", from_row=invocation_from_row, moment=as_is)
        self._db: PostgresDatabase = db
