"""Bastion's headline ratios over every committed bench/results/summary.json, as a table and charts.

Reads each version of the summary that git holds (`git log`, `git show`), takes Bastion / direct at stdio p50 and
in HTTP calls/s at 8 and 32 sessions, with the targets each run held them to, and rewrites the section of
bench/README.md between `START` and `END`: a table, then one Mermaid chart per ratio with its target as a flat
line (Mermaid's xychart draws no legend, so several ratios in one chart could not be told apart). A version
without one of these figures is skipped and named on stderr; a run committed more than once is shown once.
Run: `python -m bench.history` (`make bench-history`).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = "bench/results/summary.json"
README = ROOT / "bench" / "README.md"
START, END = "<!-- history:start -->", "<!-- history:end -->"


@dataclass(frozen=True)
class Ratio:
    """Bastion / direct on the summary's figure `figure`, held to the summary's targets named `targets`."""

    label: str
    figure: str
    targets: tuple[str, ...]


RATIOS = (
    Ratio(
        "stdio p50",
        "stdio latency p50, ms",
        ("stdio p50: Bastion / direct", "stdio p50: Bastion / direct, the next step"),
    ),
    Ratio("HTTP calls/s, 8 sessions", "HTTP calls/s, 8 sessions", ("HTTP, 8 sessions: Bastion / direct",)),
    Ratio("HTTP calls/s, 32 sessions", "HTTP calls/s, 32 sessions", ("HTTP, 32 sessions: Bastion / direct",)),
)


@dataclass(frozen=True)
class Reading:
    """One ratio in one run: its value, the bounds it was held to (`<= 1.5x`, ...) and whether it met the first."""

    value: float
    wanted: tuple[str, ...]
    met: bool


@dataclass(frozen=True)
class Run:
    """The headline ratios of one `make bench` run, in the order of `RATIOS`."""

    run: str
    date: str
    commit: str
    uncommitted_changes: bool
    readings: tuple[Reading, ...]


class MissingFigure(Exception):
    """A summary lacks a figure, a target or the provenance the history needs."""


def target_name(name: str) -> str:
    # Older summaries appended a reference in parentheses to each target's name.
    return re.sub(r" \([^)]*\)$", "", name)


def extract(summary: dict[str, Any]) -> Run:
    """The headline ratios of one summary; `MissingFigure` names what it lacks."""
    figures = {figure["figure"]: figure for figure in summary.get("figures", [])}
    targets = {target_name(target["target"]): target for target in summary.get("targets", [])}
    measured = summary.get("measured")
    if not measured:
        raise MissingFigure("no 'measured' provenance")
    readings = []
    for ratio in RATIOS:
        value = figures.get(ratio.figure, {}).get("ratios", {}).get("bastion/direct")
        if value is None:
            raise MissingFigure(f"no Bastion / direct in {ratio.figure!r}")
        held = [targets[name] for name in ratio.targets if name in targets]
        if not held:
            raise MissingFigure(f"no target for {ratio.figure!r}")
        readings.append(Reading(value, tuple(target["wanted"] for target in held), bool(held[0]["met"])))
    return Run(
        run=measured["run"],
        date=measured["date"][:16].replace("T", " "),
        commit=measured["commit"][:7],
        uncommitted_changes=bool(measured.get("uncommitted_changes")),
        readings=tuple(readings),
    )


def committed_summaries() -> list[tuple[str, dict[str, Any]]]:
    """Every committed version of the summary, oldest first, with the commit that holds it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout

    commits = git("log", "--reverse", "--format=%H", "--", SUMMARY).split()
    return [(commit, json.loads(git("show", f"{commit}:{SUMMARY}"))) for commit in commits]


def runs_of(summaries: list[tuple[str, dict[str, Any]]]) -> tuple[list[Run], list[str]]:
    """The runs of `summaries` (oldest first, each once: its last commit's), and a note for each version left out."""
    runs: dict[str, Run] = {}
    notes = []
    for commit, summary in summaries:
        try:
            run = extract(summary)
        except MissingFigure as exc:
            notes.append(f"{commit[:7]} (skipped: {exc})")
            continue
        if run.run in runs:
            notes.append(f"{commit[:7]} (run {run.run} again, shown once)")
        runs[run.run] = run
    return list(runs.values()), notes


def table(runs: list[Run]) -> str:
    """The runs as a Markdown table; each column's target is the newest run's, each cell marks its own run's."""
    heads = [
        f"{ratio.label} ({', '.join(reading.wanted)})" for ratio, reading in zip(RATIOS, runs[-1].readings, strict=True)
    ]
    lines = ["| run (UTC) | commit | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(RATIOS)]
    for run in runs:
        commit = f"{run.commit}*" if run.uncommitted_changes else run.commit
        cells = [f"{reading.value:.3f}x {'met' if reading.met else 'missed'}" for reading in run.readings]
        lines.append(f"| {run.date} | {commit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bound(wanted: str) -> float:
    """The number of a target such as `<= 1.5x`."""
    return float(wanted.split()[-1].rstrip("x"))


def chart(runs: list[Run], index: int) -> str:
    """A Mermaid xychart of one ratio over the runs, with its first target as a second, flat line."""
    ratio = RATIOS[index]
    values = [run.readings[index].value for run in runs]
    bounds = [bound(run.readings[index].wanted[0]) for run in runs]
    top = round(max(*values, *bounds) * 1.15 + 0.05, 1)
    wanted = runs[-1].readings[index].wanted[0].replace("<=", "at most").replace(">=", "at least")
    return "\n".join(
        [
            "```mermaid",
            "xychart-beta",
            f'    title "{ratio.label}, Bastion / direct (flat line: the target, {wanted})"',
            "    x-axis [" + ", ".join(f'"{run.commit}"' for run in runs) + "]",
            f'    y-axis "Bastion / direct" 0 --> {top}',
            "    line [" + ", ".join(f"{value}" for value in values) + "]",
            "    line [" + ", ".join(f"{value}" for value in bounds) + "]",
            "```",
        ]
    )


def section(runs: list[Run], notes: list[str]) -> str:
    """What goes between the markers: the table, a note on what was left out, and the charts."""
    parts = [table(runs)]
    if notes:
        parts.append("Versions of the summary not shown as a run of their own: " + "; ".join(notes) + ".")
    parts.extend(chart(runs, index) for index in range(len(RATIOS)))
    return "\n\n".join(parts)


def rewrite(readme: str, body: str) -> str:
    """`readme` with what lies between the markers replaced by `body`."""
    start, end = readme.index(START) + len(START), readme.index(END)
    return f"{readme[:start]}\n{body}\n{readme[end:]}"


def main() -> None:
    runs, notes = runs_of(committed_summaries())
    for note in notes:
        print(f"{SUMMARY} at {note}", file=sys.stderr)
    if not runs:
        sys.exit(f"no committed {SUMMARY} holds the headline ratios")
    README.write_text(rewrite(README.read_text(), section(runs, notes)))
    print(f"{README.relative_to(ROOT)}: {len(runs)} runs")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None).parse_args()
    main()
