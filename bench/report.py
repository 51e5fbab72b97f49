"""What every benchmark reports: distributions, the machine and versions, and the results files."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


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
        "mcp": _version("mcp"),
        "fastmcp": _version("fastmcp"),
        "bastion": _version("bastion"),
    }


def machine_line(info: dict[str, Any]) -> str:
    fastmcp = f", fastmcp {info['fastmcp']}" if info.get("fastmcp") else ""
    return f"{info['cores']} cores, Python {info['python']}, mcp {info['mcp']}{fastmcp}, bastion {info['bastion']}"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("-" if cell is None else str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write(name: str, results: dict[str, Any], markdown: str) -> None:
    """bench/results/NAME.json and NAME.md; the Markdown is printed too."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown.rstrip() + "\n")
    print(markdown.rstrip())
