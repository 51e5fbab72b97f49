"""One PostgreSQL ledger database: a pool of connections, its writes, and its failures as Bastion errors.

Connections are in autocommit mode, in UTC, with bounded statement and idle-in-transaction times. A write is
one statement where it can be (a data-modifying CTE changes the invocation and appends its event at once, so a
tool call's writes are one round trip each), else one short transaction. Transitions are conditional updates:
of two racing ones, even on two instances, exactly one matches the row (PostgreSQL re-checks the condition on
the row it waited for). Limits counted across instances take a transaction-level advisory lock on their key.

Every write that appends events also notifies `CHANNEL` (delivered at commit): the change feed of every instance
listens to it. A write is shielded from cancellation once sent, so a cancelled caller never leaves a connection
mid-statement; `statement_timeout` bounds how long that can take.

Failures of a running ledger (the server gone, the network down, no connection free in time) surface as
`LedgerUnavailable`, a retriable Bastion error, never as a raw psycopg error.
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import anyio
import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from bastion.config.models import display_url
from bastion.errors import BastionError, ConfigError, LedgerUnavailable
from bastion.ledger.postgres.schema import migrate
from bastion.ledger.timing import CommitTimes
from bastion.models import Change

_T = TypeVar("_T")

logger = logging.getLogger(__name__)

Connection = AsyncConnection[TupleRow]
Params = Sequence[Any] | Mapping[str, Any] | None

CHANNEL: Final = "bastion_changes"
NOTIFY: Final = f"pg_notify('{CHANNEL}', '')"
"""An expression that notifies the change feeds at commit; in a SELECT list, once per row (PostgreSQL folds the
repeats of one transaction into one)."""

POOL_SIZE: Final = 10
ANNOUNCE_TIMEOUT: Final = 5.0
"""How long a write waits, after its commit, for its changes to be announced in this process."""
ACQUIRE_TIMEOUT: Final = 10.0
"""How long a write waits for a free connection before it is LedgerUnavailable."""
_CONNECT_DEFAULTS: Final = {
    "connect_timeout": "10",
    "fallback_application_name": "bastion",
    # A listener or pooled connection whose server vanished without a word is noticed within about 25 s.
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}
_SESSION: Final = (
    "SET TIME ZONE 'UTC'",
    "SET statement_timeout = '30s'",
    "SET idle_in_transaction_session_timeout = '30s'",
)

CommitListener = Callable[[Sequence[Change]], Awaitable[None]]
"""Told the events a write of this process appended, once it committed (the change feed announces them)."""


def connect_options(url: str) -> dict[str, Any]:
    """Connection parameters: the URL's, with Bastion's defaults for what it leaves out."""
    given = conninfo_to_dict(url)
    return {"autocommit": True} | {name: value for name, value in _CONNECT_DEFAULTS.items() if name not in given}


async def connect(url: str, *, name: str = "bastion") -> Connection:
    """One connection of the ledger's kind (autocommit, UTC), known to the server as `name` unless the URL names
    it. Raises psycopg.OperationalError."""
    conn = await AsyncConnection.connect(url, **(connect_options(url) | {"fallback_application_name": name}))
    try:
        await _configure(conn)
    except BaseException:
        await conn.close()
        raise
    return conn


async def _configure(conn: Connection) -> None:
    for statement in _SESSION:
        await conn.execute(statement)


class PostgresDatabase:
    """The pooled connections to one migrated ledger database, and the ways to read and write it."""

    def __init__(self, pool: AsyncConnectionPool[Connection], url: str) -> None:
        """Use `PostgresDatabase.open`; this only wraps an open pool to a migrated database."""
        self._pool = pool
        self.url = url
        self.display = display_url(url)
        self._commit_listeners: list[CommitListener] = []
        self.commits = CommitTimes("postgresql")
        """How long each write took to commit (`/metrics`)."""

    @classmethod
    async def open(cls, url: str) -> PostgresDatabase:
        """Connect, migrate (under the migration lock) and open the pool. Raises ConfigError when the database
        cannot be reached or used."""
        display = display_url(url)
        try:
            first = await connect(url)
        except psycopg.Error as exc:
            raise ConfigError(
                f"{display}: cannot connect to the PostgreSQL ledger ({_first_line(exc)}); check the [server] ledger "
                "URL, that the server runs, and that it accepts this user and password"
            ) from exc
        try:
            await migrate(first, where=display)
        except psycopg.Error as exc:
            raise ConfigError(
                f"{display}: cannot set up the ledger's tables ({_first_line(exc)}); give the user the right to "
                "create tables in this database, or point [server] ledger at one where it has"
            ) from exc
        finally:
            with anyio.CancelScope(shield=True):
                await first.close()
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            url,
            kwargs=connect_options(url),
            min_size=1,
            max_size=POOL_SIZE,
            open=False,
            configure=_configure,
            timeout=ACQUIRE_TIMEOUT,
            name="bastion-ledger",
        )
        try:
            await pool.open(wait=True, timeout=ACQUIRE_TIMEOUT)
        except PoolTimeout as exc:
            with anyio.CancelScope(shield=True):
                await pool.close()
            raise ConfigError(f"{display}: the ledger's connection pool could not connect in time") from exc
        return cls(pool, url)

    async def close(self) -> None:
        """Close every connection, even when cancelled; safe to call twice."""
        with anyio.CancelScope(shield=True):
            await self._pool.close()

    def on_commit(self, listener: CommitListener) -> None:
        self._commit_listeners.append(listener)

    async def committed(self, changes: Sequence[Change]) -> None:
        """Tell the listeners what a write of this process appended, once it committed. Never fails the write that
        committed: shielded, bounded, and a listener that cannot read now leaves it to the feed's next read."""
        if not changes:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(ANNOUNCE_TIMEOUT):
            for listener in self._commit_listeners:
                try:
                    await listener(changes)
                except LedgerUnavailable as exc:
                    logger.debug("a commit is left for the change feed to announce later: %s", exc.message)

    # -- reads and writes ------------------------------------------------------------------------------

    async def fetchall(self, sql: str, params: Params = None) -> builtins.list[TupleRow]:
        """All rows of one read, shielded once sent: psycopg closes a connection whose query is cancelled twice,
        which anyio's cancellation always does, so a read finishes (bounded by statement_timeout) and its
        connection goes back to the pool."""
        rows: builtins.list[TupleRow] = []
        async with self.connection() as conn:
            with anyio.CancelScope(shield=True):
                cursor = await conn.execute(sql, params)
                rows = await cursor.fetchall()
        return rows

    async def fetchone(self, sql: str, params: Params = None) -> TupleRow | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def write(self, sql: str, params: Params = None) -> builtins.list[TupleRow]:
        """One statement in its own transaction, shielded once sent; its rows (RETURNING or the SELECT of a CTE)."""
        rows: builtins.list[TupleRow] = []
        started = time.perf_counter()
        async with self.connection() as conn:
            with anyio.CancelScope(shield=True):
                cursor = await conn.execute(sql, params)
                if cursor.description is not None:
                    rows = await cursor.fetchall()
                self.commits.committed(started)
        return rows

    async def transaction(self, work: Callable[[Connection], Awaitable[_T]]) -> _T:
        """`work` in one transaction, shielded once begun: committed if it returns, rolled back if it raises."""
        started = time.perf_counter()
        async with self.connection() as conn:
            with anyio.CancelScope(shield=True):
                async with conn.transaction():
                    done = await work(conn)
                self.commits.committed(started)
        return done

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A pooled connection; psycopg's failures of the server or the network become LedgerUnavailable."""
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (BastionError, psycopg.IntegrityError):
            raise
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            raise LedgerUnavailable(
                f"the ledger {self.display} failed ({_first_line(exc)}); nothing was recorded by this operation: "
                "check that the PostgreSQL server runs and is reachable, then retry"
            ) from exc


def changes_of(rows: Iterable[Sequence[Any]]) -> builtins.list[Change]:
    """`(event id, invocation id, kind)` rows as changes, in id order."""
    return sorted((Change(id=row[0], invocation_id=row[1], kind=row[2]) for row in rows), key=lambda c: c.id)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
