"""HTTP server stacks: the same streamable-HTTP MCP endpoint on several ASGI servers, parsers and loops.

Before adopting a server stack, measure it: the demo notes server (direct) and Bastion (ledger on, the demo
server as its stdio connector) are each served by bench/http_serve.py on every stack of `STACKS` (uvicorn with
h11, uvicorn with httptools, both on asyncio, uvicorn with httptools on uvloop, hypercorn, granian on asyncio and
on uvloop), all at once, each Bastion with a ledger of its own. For each concurrency level (8 and 32 sessions)
and each of `--rounds` rounds, every server in turn (the order rotating per round and level) gets that many SDK
client sessions calling `read_note` in a loop (bench/throughput.py's client) for its share of `--seconds`.

Reported: calls/s per app, stack and level, the server's own CPU per call, each stack's ratio to uvicorn + h11
on asyncio (what `pip install bastion` serves with today) in both, the fastest and the cheapest stack per app,
and Bastion over direct on each stack. On a machine shared with other work, CPU per call is the steadier
figure. Every Bastion's ledger must hold exactly one completed `read_note` invocation per call made to it: if
not, or any call failed, or a server printed an error, it exits with status 1 once the results are written.
Run: `python -m bench.http_stack [--seconds S] [--levels 8 32] [--rounds N]`.
Results go to bench/results/http_stack.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from bench import report
from bench.configs import ledger_counts, notes_config, write_notes
from bench.http_serve import Stack
from bench.processes import free_port
from bench.throughput import Clients, Target, summarise
from tests.processes import Running, served

LEVELS = (8, 32)
STACKS = (
    Stack("uvicorn-h11", "uvicorn", "h11", "asyncio"),
    Stack("uvicorn-httptools", "uvicorn", "httptools", "asyncio"),
    Stack("uvicorn-httptools-uvloop", "uvicorn", "httptools", "uvloop"),
    Stack("hypercorn", "hypercorn", "h11", "asyncio"),
    Stack("granian", "granian", "auto", "asyncio"),
    Stack("granian-uvloop", "granian", "auto", "uvloop"),
)
BASELINE = "uvicorn-h11"
APPS = {"direct": ("direct (demo server)", "read_note"), "bastion": ("Bastion (ledger on)", "notes__read_note")}
PACKAGES = ("uvicorn", "h11", "httptools", "uvloop", "hypercorn", "granian")
CPU = "server_cpu_ms_per_call"
"""The server process's own CPU per call (Bastion's without its connector's): the stack's cost."""


@dataclass
class Server:
    """One app on one stack, once started."""

    app: str
    stack: Stack
    running: Running
    ledger: Path | None

    @property
    def target(self) -> Target:
        label, tool = APPS[self.app]
        name, url = f"{self.app}/{self.stack.name}", self.running.mcp_url
        return Target(name, f"{label} on {self.stack.label}", url, tool, self.running.pid)


async def start(stack: AsyncExitStack, workdir: Path, app: str, on: Stack, notes_file: Path) -> Server:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASTION_")}
    env |= {"BASTION_NOTES_FILE": str(notes_file), "HOME": str(workdir)}
    port = free_port()
    argv = [*on.argv(), "--port", str(port), "demo" if app == "direct" else app]
    ledger = None
    if app == "bastion":
        config = workdir / f"config-{on.name}"
        ledger = notes_config(config, notes_file)
        argv += ["--config", str(config)]
        env["XDG_STATE_HOME"] = str(config / "state")
    running = await stack.enter_async_context(served(argv, env=env, port=port))
    return Server(app, on, running, ledger)


async def run(seconds: float, levels: list[int], rounds: int, processes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bastion-bench-http-stack-") as tmp:
        workdir = Path(tmp)
        notes_file = write_notes(workdir / "notes.json")
        rows: list[dict[str, Any]] = []
        async with AsyncExitStack() as stack:
            clients = await stack.enter_async_context(Clients(processes))
            servers = [await start(stack, workdir, app, on, notes_file) for on in STACKS for app in APPS]
            for i, sessions in enumerate(levels):
                for round_ in range(rounds):
                    # Rotate the order per round and level, so no server always runs first (or last) on a busy machine.
                    shift = (i * rounds + round_) % len(servers)
                    for server in servers[shift:] + servers[:shift]:
                        measured = summarise(sessions, [await clients.drive(server.target, sessions, seconds / rounds)])
                        rows.append({"app": server.app, "stack": server.stack.name, "round": round_, **measured})
            running_counts = {s.stack.name: ledger_counts(s.ledger) for s in servers if s.ledger is not None}
            error_lines = {
                s.target.name: sum(1 for line in s.running.stderr if "Traceback" in line or "ERROR" in line)
                for s in servers
            }
        stopped_counts = {s.stack.name: ledger_counts(s.ledger) for s in servers if s.ledger is not None}
    totals = combine(rows)
    return {
        "benchmark": "http_stack",
        "machine": report.machine(),
        "versions": {name: report.version(name) for name in PACKAGES},
        "settings": {
            "seconds_per_level_and_server": seconds,
            "rounds": rounds,
            "levels": levels,
            "client_processes": processes,
        },
        "stacks": {s.name: {"label": s.label, "server": s.server, "http": s.http, "loop": s.loop} for s in STACKS},
        "baseline": BASELINE,
        "runs": rows,
        "totals": totals,
        "over_baseline": {
            app: {s.name: ratios(totals, levels, (app, s.name), (app, BASELINE)) for s in STACKS} for app in APPS
        },
        "bastion_over_direct": {
            s.name: ratios(totals, levels, ("bastion", s.name), ("direct", s.name)) for s in STACKS
        },
        "cpu_over_baseline": {
            app: {s.name: ratios(totals, levels, (app, s.name), (app, BASELINE), CPU) for s in STACKS} for app in APPS
        },
        "fastest": {app: fastest(totals, levels, app) for app in APPS},
        "cheapest": {app: cheapest(totals, levels, app) for app in APPS},
        "ledger": {
            name: ledger_check(rows, name, running_counts[name], counts) for name, counts in stopped_counts.items()
        },
        "stderr_error_lines": error_lines,
    }


def combine(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Per app, stack and level: the rounds added up (calls/s over their total time; CPU per call weighted)."""
    totals: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for row in rows:
        slot = totals.setdefault(row["app"], {}).setdefault(row["stack"], {})
        total = slot.setdefault(str(row["sessions"]), {"calls": 0, "ok_calls": 0, "errors": 0, "seconds": 0.0})
        total["calls"] += row["calls"]
        total["ok_calls"] += row["ok_calls"]
        total["errors"] += row["errors"]
        total["seconds"] += row["seconds"]
        total["server_cpu_ms"] = total.get("server_cpu_ms", 0.0) + row["cpu_ms_per_call"]["server"] * row["calls"]
    for stacks in totals.values():
        for levels in stacks.values():
            for total in levels.values():
                total["calls_per_s"] = round(total["ok_calls"] / total["seconds"], 1) if total["seconds"] else 0.0
                total["server_cpu_ms_per_call"] = round(total.pop("server_cpu_ms") / max(total["calls"], 1), 3)
                total["seconds"] = round(total["seconds"], 3)
    return totals


def ratios(
    totals: dict[str, Any], levels: list[int], over: tuple[str, str], under: tuple[str, str], key: str = "calls_per_s"
) -> dict[str, Any]:
    """Figure `key` (calls/s, or `CPU`) of (app, stack) `over` divided by that of `under`, per level."""
    return {
        str(level): report.ratio(totals[over[0]][over[1]][str(level)][key], totals[under[0]][under[1]][str(level)][key])
        for level in levels
    }


def fastest(totals: dict[str, Any], levels: list[int], app: str) -> dict[str, Any]:
    """The stack with the most calls/s summed over the levels, and its ratio to the baseline per level."""
    best = max(STACKS, key=lambda s: sum(totals[app][s.name][str(level)]["calls_per_s"] for level in levels))
    return {"stack": best.name, "over_baseline": ratios(totals, levels, (app, best.name), (app, BASELINE))}


def cheapest(totals: dict[str, Any], levels: list[int], app: str) -> dict[str, Any]:
    """The stack whose server spends the least CPU per call summed over the levels, and its ratio to the baseline's
    per level: on a machine shared with other work this moves far less with the load than calls/s does."""
    best = min(STACKS, key=lambda s: sum(totals[app][s.name][str(level)][CPU] for level in levels))
    return {"stack": best.name, "cpu_over_baseline": ratios(totals, levels, (app, best.name), (app, BASELINE), CPU)}


def ledger_check(rows: list[dict[str, Any]], stack: str, running: dict[str, int], stopped: dict[str, int]) -> Any:
    made = sum(r["calls"] + r["warmup_calls"] for r in rows if r["app"] == "bastion" and r["stack"] == stack)
    return {
        "calls_made": made,
        "read_note_by_status_while_running": running,
        "read_note_by_status_after_stop": stopped,
        "exactly_one_completed_per_call": stopped.get("completed", 0) == made and sum(stopped.values()) == made,
    }


def problems(results: dict[str, Any]) -> list[str]:
    """Failed calls, error lines from a server, or a Bastion ledger that does not match the calls made to it."""
    found = [
        f"{r['app']} on {r['stack']} at {r['sessions']} sessions: {r['errors']} failed call(s) {r['error_kinds']}"
        for r in results["runs"]
        if r["errors"]
    ]
    found += [
        f"{name} printed {n} error or traceback line(s)" for name, n in results["stderr_error_lines"].items() if n
    ]
    found += [
        f"Bastion on {name}: its ledger holds read_note invocations {check['read_note_by_status_after_stop']} for "
        f"{check['calls_made']} calls made"
        for name, check in results["ledger"].items()
        if not check["exactly_one_completed_per_call"]
    ]
    return found


def markdown(results: dict[str, Any]) -> str:
    levels = [str(level) for level in results["settings"]["levels"]]
    totals = results["totals"]
    stacks = results["stacks"]
    header = ["stack"]
    header += [f"{APPS[app][0]}, {level} sessions: calls/s (server CPU ms/call)" for app in APPS for level in levels]
    rows = [
        [info["label"]]
        + [
            f"{totals[app][name][level]['calls_per_s']} ({totals[app][name][level]['server_cpu_ms_per_call']})"
            for app in APPS
            for level in levels
        ]
        for name, info in stacks.items()
    ]
    ratio_header = ["stack"]
    ratio_header += [f"{app} / baseline, {level}" for app in APPS for level in levels]
    ratio_header += [f"Bastion / direct, {level}" for level in levels]
    ratio_rows = [
        [info["label"]]
        + [results["over_baseline"][app][name][level] for app in APPS for level in levels]
        + [results["bastion_over_direct"][name][level] for level in levels]
        for name, info in stacks.items()
    ]
    cpu_header = ["stack", *(f"{app} / baseline, {level}" for app in APPS for level in levels)]
    cpu_rows = [
        [info["label"], *(results["cpu_over_baseline"][app][name][level] for app in APPS for level in levels)]
        for name, info in stacks.items()
    ]
    baseline = stacks[results["baseline"]]["label"]
    fastest_lines = [
        f"- {APPS[app][0]}: {stacks[best['stack']]['label']}, "
        + ", ".join(
            f"{ratio}x the baseline's calls/s at {level} sessions" for level, ratio in best["over_baseline"].items()
        )
        for app, best in results["fastest"].items()
    ]
    cheapest_lines = [
        f"- {APPS[app][0]}: {stacks[best['stack']]['label']}, "
        + ", ".join(
            f"{ratio}x the baseline's CPU at {level} sessions" for level, ratio in best["cpu_over_baseline"].items()
        )
        for app, best in results["cheapest"].items()
    ]
    ledger = results["ledger"]
    settings = results["settings"]
    versions = ", ".join(f"{name} {version}" for name, version in results["versions"].items())
    return "\n".join(
        [
            f"# HTTP server stacks ({report.machine_line(results['machine'])})",
            "",
            f"The same streamable-HTTP endpoint served by bench/http_serve.py on each stack ({versions}); "
            f"`read_note` in a loop, {settings['seconds_per_level_and_server']} s per level and server over "
            f"{settings['rounds']} round(s), servers interleaved, client sessions spread over "
            f"{settings['client_processes']} process(es).",
            "",
            report.table(header, rows),
            "",
            f"Ratios of calls/s: each stack over the baseline ({baseline}) for the same app, and Bastion over direct "
            "on the same stack.",
            "",
            report.table(ratio_header, ratio_rows),
            "",
            "Ratios of the server's own CPU per call (lower is cheaper; for Bastion without its connector): each stack "
            "over the baseline for the same app. On a machine shared with other work this moves far less with the "
            "load than calls/s does.",
            "",
            report.table(cpu_header, cpu_rows),
            "",
            "Fastest (most calls/s over the levels):",
            *fastest_lines,
            "",
            "Cheapest (least server CPU per call over the levels):",
            *cheapest_lines,
            "",
            "Ledger: exactly one completed read_note invocation per call made, for Bastion on every stack: "
            f"{all(check['exactly_one_completed_per_call'] for check in ledger.values())} "
            f"({sum(check['calls_made'] for check in ledger.values())} calls). Server error or traceback lines: "
            f"{sum(results['stderr_error_lines'].values())}.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--seconds", type=float, default=6, help="timed seconds per level and server, over all rounds (default 6)"
    )
    parser.add_argument(
        "--levels", type=int, nargs="+", default=list(LEVELS), help="concurrent sessions (default 8 32)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds each level is split into (default 2)")
    parser.add_argument(
        "--client-processes", type=int, default=2, help="client processes sharing the sessions (default 2)"
    )
    args = parser.parse_args()
    results = anyio.run(run, args.seconds, args.levels, args.rounds, args.client_processes)
    report.write("http_stack", results, markdown(results))
    report.fail_on(problems(results), "http_stack")


if __name__ == "__main__":
    main()
