"""The ledger: where every invocation, pin and token is kept, opened from its URL in one place.

`open_ledger` composes a backend's stores (`bastion.ledger.sqlite` for one machine, `bastion.ledger.postgres` for
several instances on one database) into an `OpenLedger`, with the invocation store behind the `Recorder`, so
redaction and truncation happen once, above every backend.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from bastion.config import SQLITE_PREFIX, is_postgres_url, sqlite_path
from bastion.config.models import display_url
from bastion.errors import ConfigError
from bastion.ledger.anchors import signing_key_path_for
from bastion.ledger.keys import load_key, load_or_create_key, marker_key_from
from bastion.ledger.postgres import PostgresBackend, key_check
from bastion.ledger.postgres.audit import PostgresAudit
from bastion.ledger.postgres.feed import PostgresFeed
from bastion.ledger.postgres.grants import PostgresGrants
from bastion.ledger.postgres.instances import PostgresInstances
from bastion.ledger.postgres.limits import PostgresLimits
from bastion.ledger.postgres.outbox import PostgresOutbox
from bastion.ledger.postgres.pins import PostgresPins
from bastion.ledger.postgres.tokens import PostgresTokens
from bastion.ledger.recorder import Recorder
from bastion.ledger.redaction import Redactor
from bastion.ledger.sqlite import SqliteBackend
from bastion.ledger.sqlite.audit import SqliteAudit
from bastion.ledger.sqlite.feed import SqliteFeed
from bastion.ledger.sqlite.grants import SqliteGrants
from bastion.ledger.sqlite.instances import SqliteInstances
from bastion.ledger.sqlite.limits import SqliteLimits
from bastion.ledger.sqlite.outbox import SqliteOutbox
from bastion.ledger.sqlite.pins import SqlitePins
from bastion.ledger.sqlite.tokens import SqliteTokens
from bastion.ledger.timing import CommitTimes
from bastion.models import Guarantee

__all__ = [
    "OpenLedger",
    "Recorder",
    "Redactor",
    "display_url",
    "guarantee_of",
    "key_path_for",
    "open_ledger",
    "sqlite_path",
]


@dataclass(eq=False)
class OpenLedger:
    """An open ledger: its stores, each satisfying its seam in `bastion.pipeline.seams`. Close it (or use it as
    an async context manager) when done."""

    url: str
    invocations: Recorder
    pins: SqlitePins | PostgresPins
    tokens: SqliteTokens | PostgresTokens
    grants: SqliteGrants | PostgresGrants
    changes: SqliteFeed | PostgresFeed
    instances: SqliteInstances | PostgresInstances
    limits: SqliteLimits | PostgresLimits
    outbox: SqliteOutbox | PostgresOutbox
    audit: SqliteAudit | PostgresAudit
    backend: SqliteBackend | PostgresBackend
    """The stores as the backend implements them (tests of SQLite internals reach the file through it)."""
    key_path: Path
    """The file of the key of its argument hashes (every instance on one PostgreSQL ledger needs the same)."""
    marker_key: bytes
    """The key provider calls mark what they make with, derived from the ledger's key (`marker_key_from`): what a
    reconcile by check finds counts only when it carries this key's mark."""

    @classmethod
    def of(
        cls, backend: SqliteBackend | PostgresBackend, *, url: str, redactor: Redactor, key: bytes, key_path: Path
    ) -> OpenLedger:
        """The ledger of an open backend: its stores, its invocations behind the recorder (which redacts what is
        stored, hashes arguments with `key`, and signs decisions with the signing key beside `key_path`, created by the
        first decision: bastion.ledger.anchors)."""
        return cls(
            url=url,
            invocations=Recorder(backend.invocations, redactor, key, signing_key_path_for(key_path)),
            pins=backend.pins,
            tokens=backend.tokens,
            grants=backend.grants,
            changes=backend.changes,
            instances=backend.instances,
            limits=backend.limits,
            outbox=backend.outbox,
            audit=backend.audit,
            backend=backend,
            key_path=key_path,
            marker_key=marker_key_from(key),
        )

    @property
    def commits(self) -> CommitTimes:
        """How long its writes take to commit (the server's `/metrics` listens)."""
        return self.backend.database.commits

    async def close(self) -> None:
        """Close the backend, even when cancelled; safe to call twice."""
        await self.backend.close()

    async def __aenter__(self) -> OpenLedger:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


_NOT_G2: Final = (
    "no external orchestrator owns an outbox: Bastion does not retry, and an `unknown` outcome is reconciled by a "
    "person searching the downstream for its correlation id (io.bastion/correlation-id)"
)
SQLITE_GUARANTEE: Final = Guarantee(
    level="G1",
    scope="single machine: the ledger is a SQLite file; the processes sharing it (serve, the CLI) see one ledger",
    recovery="when Bastion starts again on this machine: executing calls become unknown, approved ones run once",
    not_g2=_NOT_G2,
)
POSTGRES_GUARANTEE: Final = Guarantee(
    level="G1",
    scope=(
        "every instance on one PostgreSQL database: intents and outcomes are durable in PostgreSQL, decisions wake "
        "a waiting call on any instance, rate and pending limits are counted across instances"
    ),
    recovery=(
        "by any other instance once the stopped one's lease lapses (at once on the same host): its executing calls "
        "become unknown, its approved ones are claimed and run exactly once"
    ),
    not_g2=_NOT_G2,
)


def guarantee_of(url: str) -> Guarantee:
    """The guarantee (level, scope, recovery) a ledger at `url` gives."""
    return POSTGRES_GUARANTEE if is_postgres_url(url) else SQLITE_GUARANTEE


def key_path_for(database: Path) -> Path:
    """Where the key of a SQLite ledger's argument hashes is kept: beside the file, never in it."""
    return database.with_name(f"{database.stem}.key")


async def open_ledger(url: str | Path, *, redactor: Redactor, key_path: Path | None = None) -> OpenLedger:
    """Open the ledger at `url`: `sqlite:///...` or a path to a SQLite file (its key beside it unless `key_path`
    says otherwise), or `postgresql://...` (`key_path` required). Raises ConfigError when the URL, the database or
    the key cannot be used."""
    if isinstance(url, str) and is_postgres_url(url):
        if key_path is None:
            raise ConfigError(f"{display_url(url)}: a PostgreSQL ledger needs the file of its key (key_path)")
        return await _open_postgres(url, redactor, key_path)
    path = url if isinstance(url, Path) else sqlite_path(url)
    key_path = key_path or key_path_for(path)
    key = load_or_create_key(key_path)
    backend = await SqliteBackend.open(path)
    opened = url if isinstance(url, str) else SQLITE_PREFIX + str(path)
    return OpenLedger.of(backend, url=opened, redactor=redactor, key=key, key_path=key_path)


async def _open_postgres(url: str, redactor: Redactor, key_path: Path) -> OpenLedger:
    """A PostgreSQL ledger, with the key every instance on it shares (checked against the one it was used with)."""
    backend = await PostgresBackend.open(url)
    try:
        key = await _shared_key(backend, key_path, display_url(url))
    except BaseException:
        await backend.close()
        raise
    return OpenLedger.of(backend, url=url, redactor=redactor, key=key, key_path=key_path)


async def _shared_key(backend: PostgresBackend, key_path: Path, where: str) -> bytes:
    """The key in `key_path` if it is the one the database's argument hashes are made with; created when the
    database has none yet. Instances with different keys could not run each other's approved calls."""
    recorded = await backend.recorded_key_check()
    copy_it = (
        f"copy the key file of an instance already using this ledger to {key_path} (every instance on one "
        "PostgreSQL ledger needs the same key; set [ledger] key_file to put it elsewhere)"
    )
    if recorded is None:
        key = load_or_create_key(key_path)
        recorded = await backend.record_key_check(key_check(key))
    else:
        found = load_key(key_path)
        if found is None:
            raise ConfigError(f"{where}: the ledger's key is missing: {copy_it}")
        key = found
    if not hmac.compare_digest(key_check(key), recorded):
        raise ConfigError(f"{where}: {key_path} is not the key this ledger's argument hashes were made with: {copy_it}")
    return key
