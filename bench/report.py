"""What every benchmark reports: distributions, the machine and versions, and the results files."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
RUN_ENV_VAR = "BENCH_RUN"
"""Names one `make bench` run: every results file it writes carries it, so bench/summary.py combines only those."""


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def distribution(seconds: Sequence[float]) -> dict[str, float]:
    """n, p50, p95, mean and max of durations in seconds, in milliseconds."""
    ordered = sorted(seconds)
    if not ordered:
        return {"n": 0}
    return {
        "n": len(ordered),
        "p50_ms": round(percentile(ordered, 50) * 1000, 3),
        "p95_ms": round(percentile(ordered, 95) * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def machine() -> dict[str, Any]:
    """Cores and the versions that shape the figures (a missing package reads None)."""
    return {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mcp": version("mcp"),
        "fastmcp": version("fastmcp"),
        "bastion": version("bastion"),
    }


def machine_line(info: dict[str, Any]) -> str:
    fastmcp = f", fastmcp {info['fastmcp']}" if info.get("fastmcp") else ""
    return f"{info['cores']} cores, Python {info['python']}, mcp {info['mcp']}{fastmcp}, bastion {info['bastion']}"


def version(package: str) -> str | None:
    """An installed package's version; None when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("-" if cell is None else str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def provenance() -> dict[str, Any]:
    """Which run wrote a results file: the `make bench` run ($BENCH_RUN), the git commit measured (and whether
    the work tree had changes outside bench/results/) and when, in UTC."""
    root = RESULTS.parent.parent
    commit = _git(root, "rev-parse", "HEAD")
    changes = _git(root, "status", "--porcelain", "--", ".", ":(exclude)bench/results")
    return {
        "run": os.environ.get(RUN_ENV_VAR) or None,
        "commit": commit or None,
        "uncommitted_changes": bool(changes) if commit else None,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _git(root: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def fail_on(problems: Sequence[str], name: str) -> None:
    """Exit with status 1 naming every problem (lost ledger rows, failed calls), once the results are written:
    a figure measured on calls that failed or went unrecorded is not a result."""
    if problems:
        for problem in problems:
            print(f"bench {name}: FAILED: {problem}", file=sys.stderr)
        raise SystemExit(1)


def write(name: str, results: dict[str, Any], markdown: str) -> None:
    """bench/results/NAME.json (with `provenance()` under "run") and NAME.md; the Markdown is printed too."""
    results = {**results, "run": provenance()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown.rstrip() + "\n")
    print(markdown.rstrip())
