"""The ledger (DESIGN.md §6): where every invocation, pin and token is kept, opened from its URL in one place.

`open_ledger` composes a backend's stores (SQLite now: `bastion.ledger.sqlite`) into an `OpenLedger`, with the
invocation store behind the `Recorder`, so redaction and truncation happen once, above every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from bastion.errors import ConfigError
from bastion.ledger.keys import load_or_create_key
from bastion.ledger.recorder import Recorder
from bastion.ledger.redaction import Redactor
from bastion.ledger.sqlite import SqliteBackend
from bastion.ledger.sqlite.feed import SqliteFeed
from bastion.ledger.sqlite.instances import SqliteInstances
from bastion.ledger.sqlite.limits import SqliteLimits
from bastion.ledger.sqlite.pins import SqlitePins
from bastion.ledger.sqlite.tokens import SqliteTokens

__all__ = ["SQLITE_PREFIX", "OpenLedger", "Recorder", "Redactor", "key_path_for", "open_ledger", "sqlite_path"]

SQLITE_PREFIX: Final = "sqlite:///"


@dataclass(eq=False)
class OpenLedger:
    """An open ledger: its stores, each satisfying its seam in `bastion.pipeline.seams`. Close it (or use it as
    an async context manager) when done."""

    url: str
    invocations: Recorder
    pins: SqlitePins
    tokens: SqliteTokens
    changes: SqliteFeed
    instances: SqliteInstances
    limits: SqliteLimits
    backend: SqliteBackend
    """The stores as the backend implements them (tests of SQLite internals reach the file through it)."""

    async def close(self) -> None:
        """Close the backend, even when cancelled; safe to call twice."""
        await self.backend.close()

    async def __aenter__(self) -> OpenLedger:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def sqlite_path(url: str) -> Path:
    """The file of a `sqlite:///relative` or `sqlite:////absolute` ledger URL; ConfigError for another scheme."""
    path = url.removeprefix(SQLITE_PREFIX)
    if path == url or not path:
        scheme = url.split(":", 1)[0] if ":" in url else url
        raise ConfigError(
            f'ledger URL scheme "{scheme}" is not supported: only SQLite ledgers work in this version; '
            'use "sqlite:///state/ledger.db" (relative to the config directory) or "sqlite:////absolute/path.db"'
        )
    return Path(path)


def key_path_for(database: Path) -> Path:
    """Where the key of a SQLite ledger's argument hashes is kept: beside the file, never in it."""
    return database.with_name(f"{database.stem}.key")


async def open_ledger(url: str | Path, *, redactor: Redactor, key_path: Path | None = None) -> OpenLedger:
    """Open the ledger at `url` (`sqlite:///...`, or a path to a SQLite file). Raises ConfigError when the URL or
    the file cannot be used."""
    path = url if isinstance(url, Path) else sqlite_path(url)
    key = load_or_create_key(key_path or key_path_for(path))
    backend = await SqliteBackend.open(path)
    return OpenLedger(
        url=url if isinstance(url, str) else SQLITE_PREFIX + str(path),
        invocations=Recorder(backend.invocations, redactor, key),
        pins=backend.pins,
        tokens=backend.tokens,
        changes=backend.changes,
        instances=backend.instances,
        limits=backend.limits,
        backend=backend,
    )
