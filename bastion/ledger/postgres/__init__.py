"""The PostgreSQL backend of the ledger, for several Bastion instances on one database: its connections and
writes (`database`), versioned migrations (`schema`), a store per table (`invocations`, `pins`, `tokens`, `grants`,
`instances`, `limits`, `outbox`), the change feed over LISTEN/NOTIFY (`feed`) and the audit chain (`audit`)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Final

from bastion.ledger.postgres.audit import PostgresAudit
from bastion.ledger.postgres.database import PostgresDatabase
from bastion.ledger.postgres.feed import PostgresFeed
from bastion.ledger.postgres.grants import PostgresGrants
from bastion.ledger.postgres.instances import PostgresInstances
from bastion.ledger.postgres.invocations import PostgresInvocations
from bastion.ledger.postgres.limits import PostgresLimits
from bastion.ledger.postgres.outbox import PostgresOutbox
from bastion.ledger.postgres.pins import PostgresPins
from bastion.ledger.postgres.tokens import PostgresTokens

__all__ = ["PostgresBackend", "key_check"]

_KEY_CHECK: Final = "key_check"
_READ_META: Final = "SELECT value FROM ledger_meta WHERE name = %s"
_WRITE_META: Final = "INSERT INTO ledger_meta (name, value) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING"


def key_check(key: bytes) -> str:
    """What the database keeps to recognise the key of its argument hashes: a MAC of a constant, which says
    nothing about the key."""
    return hmac.new(key, b"bastion ledger key check", hashlib.sha256).hexdigest()


@dataclass(eq=False)
class PostgresBackend:
    """The stores of one PostgreSQL ledger, as `bastion.ledger.open_ledger` composes them."""

    database: PostgresDatabase
    invocations: PostgresInvocations
    pins: PostgresPins
    tokens: PostgresTokens
    grants: PostgresGrants
    changes: PostgresFeed
    instances: PostgresInstances
    limits: PostgresLimits
    outbox: PostgresOutbox
    audit: PostgresAudit

    @classmethod
    async def open(cls, url: str) -> PostgresBackend:
        """Connect to and migrate the database at `url`. Raises ConfigError when it cannot be used."""
        database = await PostgresDatabase.open(url)
        try:
            feed = await PostgresFeed.open(database)
        except BaseException:
            await database.close()
            raise
        return cls(
            database=database,
            invocations=PostgresInvocations(database),
            pins=PostgresPins(database),
            tokens=PostgresTokens(database),
            grants=PostgresGrants(database),
            changes=feed,
            instances=PostgresInstances(database),
            limits=PostgresLimits(database),
            outbox=PostgresOutbox(database),
            audit=PostgresAudit(database),
        )

    async def recorded_key_check(self) -> str | None:
        """The check of the key this ledger's argument hashes are made with; None before any instance used it."""
        row = await self.database.fetchone(_READ_META, (_KEY_CHECK,))
        return None if row is None else str(row[0])

    async def record_key_check(self, check: str) -> str:
        """Record `check` unless one is recorded already (another instance was first); the one recorded."""
        await self.database.write(_WRITE_META, (_KEY_CHECK, check))
        recorded = await self.recorded_key_check()
        assert recorded is not None
        return recorded

    async def close(self) -> None:
        await self.database.close()
