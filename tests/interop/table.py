"""The interop matrix as a table: `python -m tests.interop.table` prints every cell of the last run (the files the
matrix's tests wrote in `.interop/`), one row per cell, `pass`, `n/a` or `FAIL` per check, and a summary line."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from tests.interop.cells import CHECKS, CellResult
from tests.interop.servers import DOWNSTREAMS
from tests.tools import ROOT

RESULTS: Final = ROOT / ".interop"
"""Where each downstream's test writes its cells (`<downstream>.json`)."""


def table(results: Sequence[CellResult]) -> str:
    """A Markdown table of the cells (after what each downstream is), then how many passed."""
    lines = [f"- `{d.id}`: {d.program}" for d in DOWNSTREAMS.values() if any(r.downstream == d.id for r in results)]
    header = ["downstream", "host", "version", "express", *CHECKS]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        marks = [_mark(result.checks.get(check, "FAIL: not run")) for check in CHECKS]
        row = [result.downstream, result.transport, result.version, "on" if result.express else "off", *marks]
        lines.append("| " + " | ".join(row) + " |")
    failed = [result for result in results if result.failures]
    lines.append("")
    lines.append(f"{len(results) - len(failed)} of {len(results)} cells pass (every check passes or is n/a)")
    for result in failed:
        for check, why in result.failures.items():
            lines.append(
                f"- {result.downstream} {result.transport} {result.version} express={result.express} {check}: {why}"
            )
    return "\n".join(lines)


def _mark(outcome: str) -> str:
    return "FAIL" if outcome.startswith("FAIL") else outcome


def load(directory: Path = RESULTS) -> list[CellResult]:
    """The cells of the last run, in the order of the downstreams."""
    results: list[CellResult] = []
    for downstream in DOWNSTREAMS:
        path = directory / f"{downstream}.json"
        if path.exists():
            results.extend(CellResult(**row) for row in json.loads(path.read_text()))
    return results


def main() -> None:
    results = load()
    if not results:
        print(f"no results in {RESULTS}: run the matrix first (make interop)", file=sys.stderr)
        sys.exit(2)
    print(table(results))
    missing = [d for d in DOWNSTREAMS if not (RESULTS / f"{d}.json").exists()]
    if missing:
        print(f"\nnot run: {', '.join(missing)}")
    sys.exit(1 if missing or any(result.failures for result in results) else 0)


if __name__ == "__main__":
    main()
