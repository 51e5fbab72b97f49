"""Reading the `invocations` and `events` tables of a SQLite ledger (`SqliteInvocationReads`: bastion.ledger.
invocation_reads with SQLite's placeholder and text timestamps), and how a row maps to an `Invocation`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from bastion.ledger.backend import INVOCATION_COLUMNS
from bastion.ledger.invocation_reads import InvocationReads
from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.models import Invocation


def invocation_from_row(row: Sequence[Any]) -> Invocation:
    data = dict(zip(INVOCATION_COLUMNS, row, strict=True))
    for name in ("args", "result", "drift"):
        if data[name] is not None:
            data[name] = json.loads(data[name])
    for name in ("created_at", "updated_at", "expires_at"):
        if data[name] is not None:
            data[name] = datetime.fromisoformat(data[name])
    return Invocation.model_validate(data)


class SqliteInvocationReads(InvocationReads):
    """The reads of the invocation store on one SQLite file."""

    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(
            db, placeholder="?", insertion="rowid", from_row=invocation_from_row, moment=datetime.fromisoformat
        )
        self._db: SqliteDatabase = db
