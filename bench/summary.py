"""The headline figures of one `make bench` run, against their targets: bench/results/summary.{md,json}.

Reads what bench/latency.py, bench/throughput.py and bench/http_stack.py (and bench/profile.py, when there)
wrote in this run: stdio p50 and p95 latency and HTTP calls/s at each level, for direct, the naive relay,
Bastion and FastMCP's proxy, with Bastion's ratio to each, and marks each target (`TARGETS`) met or not.
Targets are goals: missing one is reported, not an error. It exits with status 1 when a file is missing or was
written by another run (another $BENCH_RUN, or another commit), or when a bench's checks failed (a failed call, a
ledger that does not hold one completed invocation per call).
Run: `python -m bench.summary` (`make bench` runs it last).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any

from bench import report
from bench.http_stack import problems as stack_problems
from bench.latency import problems as latency_problems
from bench.throughput import problems as throughput_problems

SOURCES = ("latency", "throughput", "http_stack")
OPTIONAL = ("profile",)
PATHS = {"direct": "direct", "naive": "naive relay", "bastion": "Bastion", "fastmcp": "FastMCP proxy"}
P50 = "stdio latency p50, ms"
HTTP_8, HTTP_32 = "HTTP calls/s, 8 sessions", "HTTP calls/s, 32 sessions"


@dataclass(frozen=True)
class Target:
    """Bastion's ratio to path `under` on figure `figure`, and the bound it must meet (`at_most`, else at least)."""

    name: str
    figure: str
    under: str
    bound: float
    at_most: bool

    def met(self, ratio: float | None) -> bool | None:
        if ratio is None:
            return None
        return ratio <= self.bound if self.at_most else ratio >= self.bound

    @property
    def wanted(self) -> str:
        return f"{'<=' if self.at_most else '>='} {self.bound}x"


TARGETS = (
    Target("stdio p50: Bastion / direct", P50, "direct", 1.5, at_most=True),
    Target("stdio p50: Bastion / direct, the next step", P50, "direct", 1.3, at_most=True),
    Target("HTTP, 8 sessions: Bastion / direct", HTTP_8, "direct", 0.6, at_most=False),
    Target("HTTP, 32 sessions: Bastion / direct", HTTP_32, "direct", 0.6, at_most=False),
    Target("stdio p50: faster than the naive relay", P50, "naive", 1.0, at_most=True),
    Target("HTTP, 8 sessions: faster than the naive relay", HTTP_8, "naive", 1.0, at_most=False),
    Target("HTTP, 32 sessions: faster than the naive relay", HTTP_32, "naive", 1.0, at_most=False),
)


def load() -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The results files of this run, and what is wrong with them (missing, or from another run or commit)."""
    found: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name in (*SOURCES, *OPTIONAL):
        path = report.RESULTS / f"{name}.json"
        if not path.exists():
            if name in SOURCES:
                problems.append(f"bench/results/{name}.json is missing: run `make bench`")
            continue
        found[name] = json.loads(path.read_text())
    run = os.environ.get(report.RUN_ENV_VAR)
    commits = {name: results.get("run", {}).get("commit") for name, results in found.items()}
    for name, results in list(found.items()):
        wrote = results.get("run", {})
        if run and wrote.get("run") != run:
            problems.append(f"bench/results/{name}.json was not written by this run ({run}): {wrote or 'unnamed'}")
        elif len(set(commits.values())) > 1:
            problems.append(f"the results files were written at different commits: {commits}")
            break
    return found, problems


def summarise(found: dict[str, dict[str, Any]], problems: list[str]) -> dict[str, Any]:
    latency, throughput, stack = found["latency"], found["throughput"], found["http_stack"]
    figures: list[dict[str, Any]] = []
    for q in ("p50", "p95"):
        values = {name: p[f"{q}_ms"] for name, p in latency["paths"].items()}
        figures.append({"figure": f"stdio latency {q}, ms", "unit": "ms", **_with_ratios(values, lower_is_better=True)})
    for level in throughput["settings"]["levels"]:
        values = {r["target"]: r["calls_per_s"] for r in throughput["runs"] if r["sessions"] == level}
        figure = f"HTTP calls/s, {level} session{'' if level == 1 else 's'}"
        figures.append({"figure": figure, "unit": "calls/s", **_with_ratios(values)})
    ratios = {f["figure"]: f["ratios"] for f in figures}
    marked = []
    for target in TARGETS:
        ratio = ratios.get(target.figure, {}).get(f"bastion/{target.under}")
        marked.append({"target": target.name, "ratio": ratio, "wanted": target.wanted, "met": target.met(ratio)})
    checks = {
        "latency: no failed call, one completed ledger row per call": latency_problems(latency),
        "throughput: no failed call or error line, one completed ledger row per call": throughput_problems(throughput),
        "http_stack: no failed call or error line, one completed ledger row per call": stack_problems(stack),
    }
    fastest = {
        app: {"label": stack["stacks"][best["stack"]]["label"], **best} for app, best in stack["fastest"].items()
    }
    cheapest = {
        app: {"label": stack["stacks"][best["stack"]]["label"], **best} for app, best in stack["cheapest"].items()
    }
    summary: dict[str, Any] = {
        "benchmark": "summary",
        "machine": latency["machine"],
        "measured": latency.get("run", {}),
        "sources": {name: results.get("run") for name, results in found.items()},
        "figures": figures,
        "targets": marked,
        "checks": checks,
        "provenance_problems": problems,
        "http_stack": {
            "baseline": stack["baseline"],
            "fastest": fastest,
            "cheapest": cheapest,
            "bastion_over_direct": stack["bastion_over_direct"],
            "throughput_stacks": throughput.get("stacks", {}),
        },
    }
    if "profile" in found:
        summary["bastion_cpu_ms_per_stdio_call"] = found["profile"]["cpu_ms_per_call"]
    if "relay_floor" in latency:
        summary["relay_floor"] = latency["relay_floor"]
    if "round_ratios" in latency:
        summary["round_ratios"] = latency["round_ratios"]
    return summary


def _with_ratios(values: dict[str, float], lower_is_better: bool = False) -> dict[str, Any]:
    """The figure per path, and Bastion's over each other path's (a time ratio or a calls/s ratio)."""
    bastion = values.get("bastion")
    return {
        "values": {name: values.get(name) for name in PATHS},
        "ratios": {f"bastion/{name}": report.ratio(bastion, values.get(name)) for name in PATHS if name != "bastion"},
        "lower_is_better": lower_is_better,
    }


def markdown(summary: dict[str, Any]) -> str:
    measured = summary["measured"]
    dirty = " (with uncommitted changes)" if measured.get("uncommitted_changes") else ""
    rows = [[f["figure"], *(f["values"][name] for name in PATHS), *f["ratios"].values()] for f in summary["figures"]]
    ratio_names = list(summary["figures"][0]["ratios"]) if summary["figures"] else []
    figures = report.table(["figure", *PATHS.values(), *ratio_names], rows)
    met = {True: "yes", False: "**no**", None: "-"}
    targets = report.table(
        ["target", "ratio", "wanted", "met"],
        [[t["target"], t["ratio"], t["wanted"], met[t["met"]]] for t in summary["targets"]],
    )
    checks = report.table(
        ["check", "problems"],
        [[name, "; ".join(found) if found else "none"] for name, found in summary["checks"].items()],
    )
    stack = summary["http_stack"]
    fastest = [
        f"- {app}: fastest {best['label']}, "
        + ", ".join(f"{ratio}x the calls/s at {level} sessions" for level, ratio in best["over_baseline"].items())
        + f"; cheapest {cheap['label']}, "
        + ", ".join(f"{ratio}x the CPU per call at {level}" for level, ratio in cheap["cpu_over_baseline"].items())
        for (app, best), cheap in zip(stack["fastest"].items(), stack["cheapest"].values(), strict=True)
    ]
    lines = [
        f"# Benchmark summary ({report.machine_line(summary['machine'])})",
        "",
        f"Commit {measured.get('commit')}{dirty}, measured {measured.get('date')}, "
        f"run {measured.get('run') or 'unnamed (not by make bench)'}. "
        "Latency over stdio (bench/results/latency.md), throughput over streamable HTTP (throughput.md), the "
        "HTTP server stacks (http_stack.md), all from this run; a ratio is Bastion's figure over the other "
        "path's (for latency lower is better, for calls/s higher is better).",
        "",
        figures,
        "",
        targets,
        "",
        checks,
        *(f"\n**Not one run:** {problem}" for problem in summary["provenance_problems"]),
        "",
        f"HTTP server stacks in this run (http_stack.md), against {stack['baseline']}:",
        *fastest,
    ]
    if "relay_floor" in summary:
        floor = summary["relay_floor"]
        lines += [
            "",
            f"A relay that forwards the bytes and reads nothing (bench/pipe_relay.py): {floor['pipe/direct p50']}x "
            f"direct at p50, {floor['pipe/direct p95']}x at p95 (latency.md): what a third process costs by itself. "
            "The same relay recording each call through Bastion's ledger code and nothing else "
            f"(bench/ledger_relay.py): {floor['ledger_relay/direct p50']}x at p50, "
            f"{floor['ledger_relay/direct p95']}x at p95: what the records cost by themselves.",
        ]
        if "bastion_unrecorded/direct p50" in floor:
            lines[-1] += (
                " Bastion recording nothing (a measuring device, bench/without.py `records`): "
                f"{floor['bastion_unrecorded/direct p50']}x at p50, {floor['bastion_unrecorded/direct p95']}x at p95: "
                "the rest of Bastion's path without the ledger records every call requires."
            )
    if "round_ratios" in summary:
        spread = summary["round_ratios"]["bastion/direct"]
        lines += [
            "",
            f"Bastion / direct at stdio p50, round by round (latency.md): lowest {spread['min']}x, median "
            f"{spread['median']}x, highest {spread['max']}x: the spread of one run's figure.",
        ]
    if "bastion_cpu_ms_per_stdio_call" in summary:
        lines += ["", f"Bastion's own CPU per stdio call (profile.md): {summary['bastion_cpu_ms_per_stdio_call']} ms."]
    return "\n".join(lines)


def main() -> None:
    found, problems = load()
    if any(name not in found for name in SOURCES):
        report.fail_on(problems, "summary")
    summary = summarise(found, problems)
    report.write("summary", summary, markdown(summary))
    problems += [problem for found in summary["checks"].values() for problem in found]
    report.fail_on(problems, "summary")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None).parse_args()
    main()
