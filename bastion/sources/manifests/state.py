"""Which manifest actions are enabled: an overlay kept outside the manifests.

A re-install may overwrite an action file; whether the action is enabled is the operator's choice, so it lives
in its own file beside the ledger (`action-state.json`), as `{"<name>": {"enabled": false}, ...}`. An action
with no entry is enabled. Writes go to a temporary file renamed over the old one, so a crash never leaves half
a file; an overlay that cannot be read disables every manifest action until it is fixed (fail closed).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Final

from bastion.errors import ConfigError

STATE_FILE: Final = "action-state.json"


class ActionState:
    """The enabled overlay of one configuration (`path` None: every action enabled, nothing can be changed)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def read(self) -> dict[str, bool]:
        """Each action with an entry, and whether it is enabled. ConfigError (naming the fix) for a broken file."""
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self._broken(f"cannot be read as JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise self._broken("is not a JSON object")
        enabled: dict[str, bool] = {}
        for name, entry in data.items():
            flag = entry.get("enabled", True) if isinstance(entry, dict) else None
            if not isinstance(flag, bool):
                raise self._broken(f'has an entry for "{name}" that is not {{"enabled": true|false}}')
            enabled[name] = flag
        return enabled

    def stamp(self) -> tuple[int, int] | None:
        """What changes when the file is rewritten (modification time and size); None while it does not exist."""
        if self.path is None:
            return None
        try:
            found = self.path.stat()
        except OSError:
            return None
        return found.st_mtime_ns, found.st_size

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Record the choice for `name`, atomically (a temporary file renamed over the overlay)."""
        if self.path is None:
            raise ConfigError("the embedded default configuration has no manifest actions to enable or disable")
        entries: dict[str, Any] = {key: {"enabled": value} for key, value in self.read().items()}
        entries[name] = {"enabled": enabled}
        text = json.dumps(dict(sorted(entries.items())), indent=2) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                "w", encoding="utf-8", dir=self.path.parent, prefix=f".{STATE_FILE}.", delete=False
            ) as temporary:
                temporary.write(text)
                temporary.flush()
                os.fsync(temporary.fileno())
            os.replace(temporary.name, self.path)
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path} ({exc.strerror}); check the directory's permissions") from exc

    def _broken(self, why: str) -> ConfigError:
        return ConfigError(
            f"{self.path} {why}; fix it, or delete it to enable every manifest action again "
            "(until then every manifest action is disabled)"
        )
