"""The policy file Bastion owns: `policies/bastion-approved.toml`, the "always" approvals (issue 14).

An approver who approves a call "always" adds an organisation mode entry `"source:action" = "allow"` here, with a
comment saying who approved which invocation when. Everything in this file came from an approval: that is its
provenance, and why Bastion may remove an entry by itself (when that action's definition drifts from its pin, the
approval was of another definition). Operators' own files are never written. The loader leaves this file out of
the merged policy (where a stricter operator entry would win): the gateway lays its entries over the organisation
map instead, except over a `deny`, which nothing relaxes.

Written with tomlkit, so a person's edits and comments in the file survive Bastion's writes; keys are written as
quoted TOML keys (`"fx:write"`), the only form a policy key (with its colon) can take.

Other instances sharing the configuration directory, and people, change the file too. A running Bastion reads it
again when it changed (its inode, size or times): mode resolution looks (one stat) at most once a second, since it
is on every call's path, so an approval or a revocation made elsewhere applies here within a second. Each change
reads, edits and replaces the file holding an advisory lock (`flock`) on `policies/.bastion-approved.lock`, so two
instances approving at the same instant both keep their entry: one writes after the other, over what it wrote.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Final

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import Table

from bastion.errors import ConfigError

logger = logging.getLogger(__name__)

APPROVED_FILE: Final = "bastion-approved.toml"
"""Its name under `policies/`."""
LOCK_FILE: Final = ".bastion-approved.lock"
"""The file whose lock a change of it holds, beside it (a dot file: the loader reads no such file)."""
LOCK_WAIT_SECONDS: Final = 5.0
"""How long a change waits for another process's change to end before it gives up."""
_LOCK_POLL_SECONDS: Final = 0.005

_HEADER: Final = (
    'Written by Bastion: actions an approver approved "always" (bastion\'s inbox or approver endpoint).\n'
    "Each entry is removed by Bastion when its action's definition drifts from its pin. You may remove entries;\n"
    "entries you add here are treated as approvals too."
)
_KEY: Final = re.compile(r"^[a-z0-9_-]+:[^\s*]+$")
CHECK_SECONDS: Final = 1.0
"""How often, at most, `current()` looks whether the file changed."""

Stamp = tuple[int, int, int, int]
"""What tells one version of the file from another: inode, size, modification and change time (ns)."""
_UNREAD: Final[Stamp] = (-1, -1, -1, -1)
"""The stamp of no file: whatever is there is read at the next check."""


class ApprovedModes:
    """The "always" approvals of one configuration directory, read at start, again when the file changes, and
    written on every change made here."""

    def __init__(self, directory: Path | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        """`directory`: the configuration directory (None: the embedded default, where nothing can be approved
        "always"). `clock` (seconds, monotonic) paces the checks for changes made elsewhere."""
        self.path = None if directory is None else directory / "policies" / APPROVED_FILE
        self.modes: dict[str, str] = {}
        """Policy key -> "allow", as the file held them when last read (see `current`)."""
        self._clock = clock
        self._checked_at = clock()
        self._stamp: Stamp | None = None
        self.reload()

    def current(self) -> Mapping[str, str]:
        """The approvals as the file holds them: read again if it changed since it was last read (another instance
        or a person wrote it), which is looked at no more than once every `CHECK_SECONDS`."""
        now = self._clock()
        if self.path is not None and now - self._checked_at >= CHECK_SECONDS:
            self._checked_at = now
            if self._stat() != self._stamp:
                self.reload()
        return self.modes

    def reload(self) -> None:
        """Read the file again; a broken file approves nothing."""
        # The stamp is taken before the read: a write in between is then read again at the next check, never missed.
        self._stamp = self._stat()
        self.modes = {}
        if self.path is None or self._stamp is None:
            return
        try:
            document = tomlkit.parse(self.path.read_text(encoding="utf-8"))
        except (OSError, TOMLKitError) as exc:
            logger.warning("%s cannot be read (%s): its approvals are ignored until it is fixed", self.path, exc)
            return
        self.modes = _approvals(document)

    def check(self, key: str) -> None:
        """Raise ConfigError when `key` cannot be approved always here (see `add`), saying why and what to do."""
        if self.path is None:
            raise ConfigError(
                'an "always" approval is written to policies/bastion-approved.toml of the configuration directory, '
                "and this Bastion runs on its embedded default; run it with --config DIR (see `bastion init DIR`), or "
                'approve "once" or "for this session"'
            )
        if not _KEY.match(key):
            raise ConfigError(
                f"{key!r} cannot be approved always: a policy entry names one action as source:action, without spaces "
                'or "*"; approve "once" or "for this session"'
            )

    def add(self, key: str, *, by: str, invocation_id: str, at: datetime) -> None:
        """Approve `key` (`source:action`) always: write `"key" = "allow"` with who, which call and when."""
        self.check(key)
        assert self.path is not None
        with self._changing():
            document = self._document()
            modes = document.get("modes")
            if not isinstance(modes, Table):
                modes = tomlkit.table()
                document["modes"] = modes
            modes[key] = "allow"
            modes[key].comment(f"approved by {by} for invocation {invocation_id} at {at.isoformat(timespec='seconds')}")
            self._write(document)

    def revoke(self, key: str) -> bool:
        """Remove the entry of `key`; False when there was none."""
        if self.path is None:
            return False
        with self._changing():
            document = self._document()
            modes = document.get("modes")
            if not isinstance(modes, Table) or key not in modes:
                self.modes = _approvals(document)
                return False
            del modes[key]
            self._write(document)
        return True

    @contextmanager
    def _changing(self) -> Iterator[None]:
        """Hold the lock of the file for a change (read, edit, replace): a change by another process sharing the
        directory happens before or after it, never in between. Raises ConfigError when another process holds it
        for longer than `LOCK_WAIT_SECONDS` (a change takes milliseconds: that process is stuck)."""
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_name(LOCK_FILE)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"{lock} cannot be opened ({exc}); check the permissions of {lock.parent}") from exc
        try:
            waited_until = time.monotonic() + LOCK_WAIT_SECONDS
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= waited_until:
                        raise ConfigError(
                            f"another process has held {lock} for over {LOCK_WAIT_SECONDS:g}s while changing "
                            f"{self.path.name}; if no Bastion is stuck there, retry the approval"
                        ) from None
                    time.sleep(_LOCK_POLL_SECONDS)  # a change elsewhere takes milliseconds
            yield
        finally:
            os.close(fd)  # releases the lock

    def _document(self) -> tomlkit.TOMLDocument:
        assert self.path is not None
        if not self.path.is_file():
            document = tomlkit.document()
            for line in _HEADER.splitlines():
                document.add(tomlkit.comment(line))
            return document
        try:
            return tomlkit.parse(self.path.read_text(encoding="utf-8"))
        except (OSError, TOMLKitError) as exc:
            raise ConfigError(f"{self.path} cannot be read ({exc}); fix or remove it, then approve again") from exc

    def _stat(self) -> Stamp | None:
        try:
            found = os.stat(self.path) if self.path is not None else None
        except OSError:
            return None
        return None if found is None else (found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)

    def _write(self, document: tomlkit.TOMLDocument) -> None:
        """Replace the file at once (a reader never sees half of it), and hold what it now says."""
        assert self.path is not None  # (its folder exists: `_changing` made it)
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".bastion-approved.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(tomlkit.dumps(document))
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self.modes = _approvals(document)
        self._stamp = _UNREAD  # read it again at the next check, in case another process wrote it just after


def _approvals(document: tomlkit.TOMLDocument) -> dict[str, str]:
    """The approvals a parsed file holds: its `[modes]` entries of one action each set to "allow"."""
    modes = document.get("modes")
    if not isinstance(modes, dict):
        return {}
    return {str(k): "allow" for k, v in modes.items() if v == "allow" and _KEY.match(str(k))}
