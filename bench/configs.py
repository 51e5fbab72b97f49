"""The Bastion configurations and the notes file the benchmarks run against, and reading the ledger back."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

NOTE = {"name": "hello", "text": "A short note, read over and over by the benchmark."}


def write_notes(path: Path) -> Path:
    """The demo server's notes file, holding the one note every benchmark reads."""
    path.write_text(json.dumps({NOTE["name"]: NOTE["text"]}) + "\n")
    return path


def notes_config(directory: Path, notes_file: Path, *, express_lane: bool = True) -> Path:
    """A Bastion configuration: the demo notes server as its only connector, the ledger beside it; `express_lane`
    False serves every call through the MCP SDK's server and client (`[server] express_lane`)."""
    (directory / "connectors").mkdir(parents=True)
    (directory / "policies").mkdir()
    (directory / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///ledger.db"\nstartup_wait_seconds = 60\n'
        f"express_lane = {'true' if express_lane else 'false'}\n"
        "[limits]\ninvocations_per_minute = 100000000\nlist_timeout_seconds = 60\n"
    )
    (directory / "connectors" / "notes.toml").write_text(
        'command = "python"\nargs = ["-m", "bastion.demo.notes"]\n'
        f"env = {{ BASTION_NOTES_FILE = {toml_string(str(notes_file))} }}\n"
    )
    (directory / "policies" / "default.toml").write_text("")  # read risk: allow
    return directory / "ledger.db"


def toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def ledger_counts(ledger: Path) -> dict[str, int]:
    """Bastion's invocations of notes/read_note by status."""
    with closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)) as db:
        rows = db.execute(
            "SELECT status, COUNT(*) FROM invocations WHERE source_id = 'notes' AND action_id = 'read_note' "
            "GROUP BY status"
        ).fetchall()
    return {str(status): int(count) for status, count in rows}
