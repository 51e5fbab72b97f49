"""The SQLite backend of the ledger: one file (`database`), its tables and migrations (`schema`), and a store per
table (`invocations`, `pins`, `tokens`, `grants`, `instances`, `limits`, `outbox`) plus the change feed (`feed`) and the
audit chain (`audit`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bastion.ledger.sqlite.audit import SqliteAudit
from bastion.ledger.sqlite.database import SqliteDatabase
from bastion.ledger.sqlite.feed import SqliteFeed
from bastion.ledger.sqlite.grants import SqliteGrants
from bastion.ledger.sqlite.instances import SqliteInstances
from bastion.ledger.sqlite.invocations import SqliteInvocations
from bastion.ledger.sqlite.limits import SqliteLimits
from bastion.ledger.sqlite.outbox import SqliteOutbox
from bastion.ledger.sqlite.pins import SqlitePins
from bastion.ledger.sqlite.tokens import SqliteTokens

__all__ = ["SqliteBackend"]


@dataclass(eq=False)
class SqliteBackend:
    """The stores of one SQLite ledger file, as `bastion.ledger.open_ledger` composes them."""

    database: SqliteDatabase
    invocations: SqliteInvocations
    pins: SqlitePins
    tokens: SqliteTokens
    grants: SqliteGrants
    changes: SqliteFeed
    instances: SqliteInstances
    limits: SqliteLimits
    outbox: SqliteOutbox
    audit: SqliteAudit

    @classmethod
    async def open(cls, path: Path) -> SqliteBackend:
        """Open (creating and migrating if needed) the ledger file at `path`. Raises ConfigError if unusable."""
        database = await SqliteDatabase.open(path)
        try:
            feed = await SqliteFeed.open(database)
        except BaseException:
            await database.close()
            raise
        return cls(
            database=database,
            invocations=SqliteInvocations(database),
            pins=SqlitePins(database),
            tokens=SqliteTokens(database),
            grants=SqliteGrants(database),
            changes=feed,
            instances=SqliteInstances(database),
            limits=SqliteLimits(database),
            outbox=SqliteOutbox(database),
            audit=SqliteAudit(database),
        )

    async def close(self) -> None:
        await self.database.close()
