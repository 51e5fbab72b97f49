"""Per-call latency over stdio: direct, through Bastion, a naive relay and FastMCP's proxy.

The same SDK client code calls `read_note` on the same downstream (the bundled demo notes server,
one note in its file) eight ways: directly; through `bastion serve` (allow path, ledger on), with its express
lane and without (`[server] express_lane = false`: the MCP SDK's server and client); through the same Bastion
recording nothing (bench/without.py `records`, a measuring device: what the rest of its path costs without the
ledger records every call requires); through a naive relay
on the mcp SDK's low-level server (bench/naive_relay.py), the floor any SDK-based relay pays; through a
relay that forwards the bytes and reads nothing (bench/pipe_relay.py), the price of a third process alone; through
that relay recording each call in a ledger file with Bastion's ledger code and nothing else (bench/ledger_relay.py),
the price of the records by themselves; and through FastMCP's proxy (bench/fastmcp_proxy.py), when fastmcp is
installed. Calls are sequential, the paths interleaved in rounds (their order rotating) so machine noise hits all
alike, after a warm-up on each. Besides the latency distribution it reports the CPU each process spent per call,
and that Bastion's ledger (and the recording relay's) holds one completed invocation per call: if not, or any call
failed, it exits with status 1 once the results are written. Run: `python -m bench.latency [--calls N]`.
Results go to bench/results/latency.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from bench import report
from bench.configs import NOTE, ledger_counts, notes_config, write_notes
from bench.processes import children, cpu_seconds, descendants


@dataclass
class Route:
    """One path to the demo server's `read_note` (direct, Bastion, naive relay, FastMCP) and what was measured on it."""

    name: str
    label: str
    tool: str
    params: StdioServerParameters
    samples: list[float] = field(default_factory=list)
    errors: int = 0
    calls: int = 0
    cpu: dict[str, float] = field(default_factory=lambda: {"client": 0.0, "front": 0.0, "downstream": 0.0})
    round_p50s: list[float] = field(default_factory=list)
    """The p50 of each round's calls: a round measures every path in turn, so their ratios show one run's spread."""
    protocol_version: str = ""
    pid: int = 0


def routes(workdir: Path, notes_file: Path, with_fastmcp: bool, relay_ledger: Path) -> list[Route]:
    env = {"BASTION_NOTES_FILE": str(notes_file), "XDG_STATE_HOME": str(workdir / "state")}
    python = sys.executable
    found = [
        Route("direct", "direct (demo server)", "read_note", StdioServerParameters(
            command=python, args=["-m", "bastion.demo.notes"], env=env)),
        Route("bastion", "Bastion (stdio, ledger on)", "notes__read_note", StdioServerParameters(
            command=python, args=["-m", "bastion", "serve", "--config", str(workdir / "config")], env=env)),
        Route("bastion_sdk", "Bastion, express lane off (the SDK's server and client)", "notes__read_note",
            StdioServerParameters(
                command=python, args=["-m", "bastion", "serve", "--config", str(workdir / "config-sdk")], env=env)),
        Route("bastion_unrecorded", "Bastion recording nothing (measuring device, bench/without.py)",
            "notes__read_note", StdioServerParameters(command=python, args=[
                "-m", "bench.without", "records", "serve", "--config", str(workdir / "config-unrecorded")], env=env)),
        Route("naive", "naive low-level relay (mcp SDK)", "read_note", StdioServerParameters(
            command=python, args=[str(Path(__file__).with_name("naive_relay.py"))], env=env)),
        Route("pipe", "zero-work relay (bytes forwarded, nothing read)", "read_note", StdioServerParameters(
            command=python, args=[str(Path(__file__).with_name("pipe_relay.py"))], env=env)),
        Route("ledger_relay", "recording relay (bytes forwarded, each call recorded by Bastion's ledger code)",
            "read_note", StdioServerParameters(
                command=python, args=[str(Path(__file__).with_name("ledger_relay.py")), str(relay_ledger)], env=env)),
    ]  # fmt: skip
    if with_fastmcp:
        proxy = str(Path(__file__).with_name("fastmcp_proxy.py"))
        found.append(
            Route("fastmcp", "FastMCP proxy", "read_note", StdioServerParameters(command=python, args=[proxy], env=env))
        )
    return found


async def call(client: Client, route: Route) -> float:
    started = time.perf_counter()
    try:
        result = await client.call_tool(route.tool, {"name": NOTE["name"]})
    except MCPError:
        route.errors += 1
    else:
        if result.is_error:
            route.errors += 1
    route.calls += 1
    return time.perf_counter() - started


def process_cpu(route: Route) -> dict[str, float]:
    """CPU seconds so far of the path's front process (server, gateway or proxy) and of what it started."""
    return {"front": cpu_seconds([route.pid]), "downstream": cpu_seconds(descendants(route.pid))}


async def measure(route: Route, client: Client, calls: int) -> None:
    before, client_before = process_cpu(route), time.process_time()
    timed = [await call(client, route) for _ in range(calls)]
    route.samples.extend(timed)
    route.round_p50s.append(statistics.median(timed))
    after = process_cpu(route)
    route.cpu["client"] += time.process_time() - client_before
    for key in ("front", "downstream"):
        route.cpu[key] += after[key] - before[key]


async def run(calls: int, warmup: int, rounds: int) -> dict[str, Any]:
    per_round = max(1, calls // rounds)
    with tempfile.TemporaryDirectory(prefix="bastion-bench-latency-") as tmp:
        workdir = Path(tmp)
        notes_file = write_notes(workdir / "notes.json")
        ledgers = {  # the paths that record each call, and their ledger files
            "bastion": notes_config(workdir / "config", notes_file),
            "bastion_sdk": notes_config(workdir / "config-sdk", notes_file, express_lane=False),
            "ledger_relay": workdir / "ledger-relay.db",
        }
        notes_config(workdir / "config-unrecorded", notes_file)  # its ledger stays empty: nothing to count
        with_fastmcp = importlib.util.find_spec("fastmcp") is not None
        measured = routes(workdir, notes_file, with_fastmcp, ledgers["ledger_relay"])
        async with AsyncExitStack() as stack:
            clients = []
            for route in measured:
                before = set(children(os.getpid()))
                client = await stack.enter_async_context(Client(route.params, cache=None))
                (route.pid,) = set(children(os.getpid())) - before
                route.protocol_version = client.protocol_version
                clients.append(client)
            for route, client in zip(measured, clients, strict=True):
                for _ in range(warmup):
                    await call(client, route)
            warm_errors = {p.name: p.errors for p in measured}
            pairs = list(zip(measured, clients, strict=True))
            for round_ in range(rounds):
                turn = round_ % len(pairs)
                for route, client in pairs[turn:] + pairs[:turn]:
                    await measure(route, client, per_round)
        # Every path has stopped: everything it answered is committed.
        counts = {name: ledger_counts(path) for name, path in ledgers.items()}
    by_name = {p.name: p for p in measured}
    results: dict[str, Any] = {
        "benchmark": "latency",
        "machine": report.machine(),
        "settings": {"timed_calls_per_path": per_round * rounds, "warmup_calls_per_path": warmup, "rounds": rounds},
        "paths": {
            p.name: {
                "label": p.label,
                "protocol_version": p.protocol_version,
                **report.distribution(p.samples),
                "errors": p.errors - warm_errors[p.name],
                "warmup_errors": warm_errors[p.name],
                "cpu_ms_per_call": {k: round(v / len(p.samples) * 1000, 3) for k, v in p.cpu.items()},
            }
            for p in measured
        },
        "ledger": {name: ledger_check(counts[name], by_name[name].calls) for name in ledgers},
        "target": "Bastion/direct <= 1.5x at p50 first, then 1.3x",
    }
    results["ratios"] = {
        f"bastion/{other}": {
            q: report.ratio(results["paths"]["bastion"][f"{q}_ms"], results["paths"][other][f"{q}_ms"])
            for q in ("p50", "p95", "mean")
        }
        for other in ("direct", "bastion_sdk", "bastion_unrecorded", "naive", "pipe", "ledger_relay", "fastmcp")
        if other in results["paths"]
    }
    results["round_ratios"] = {
        f"bastion/{other}": _spread(by_name["bastion"].round_p50s, by_name[other].round_p50s)
        for other in ("direct", "ledger_relay", "bastion_unrecorded", "naive")
    }
    results["relay_floor"] = {
        f"{relay}/direct {q}": report.ratio(results["paths"][relay][f"{q}_ms"], results["paths"]["direct"][f"{q}_ms"])
        for relay in ("pipe", "ledger_relay", "bastion_unrecorded")
        for q in ("p50", "p95")
    }
    if not with_fastmcp:
        results["fastmcp_missing"] = "fastmcp is not installed here; run `make bench` (it installs .venv-bench)"
    return results


def _spread(numerators: list[float], denominators: list[float]) -> dict[str, float | None]:
    """The lowest, median and highest of the rounds' p50 ratios."""
    ratios = sorted(n / d for n, d in zip(numerators, denominators, strict=True) if d)
    if not ratios:
        return {"min": None, "median": None, "max": None}
    return {"min": round(ratios[0], 3), "median": round(statistics.median(ratios), 3), "max": round(ratios[-1], 3)}


def ledger_check(counts: dict[str, int], calls: int) -> dict[str, Any]:
    """What one path's ledger holds for the calls made through it, and whether that is one completed per call."""
    return {
        "calls_made": calls,
        "read_note_invocations_by_status": counts,
        "exactly_one_completed_per_call": counts.get("completed", 0) == calls and sum(counts.values()) == calls,
    }


def markdown(results: dict[str, Any]) -> str:
    settings = results["settings"]
    rows = [
        [
            p["label"],
            p["protocol_version"],
            p["p50_ms"],
            p["p95_ms"],
            p["mean_ms"],
            p["errors"],
            " / ".join(str(p["cpu_ms_per_call"][k]) for k in ("client", "front", "downstream")),
        ]
        for p in results["paths"].values()
    ]
    paths_table = report.table(
        ["path", "protocol", "p50 ms", "p95 ms", "mean ms", "errors", "CPU ms/call: client / front / downstream"], rows
    )
    ratio_rows = [[name, r["p50"], r["p95"], r["mean"]] for name, r in results["ratios"].items()]
    ratios_table = report.table(["ratio", "p50", "p95", "mean"], ratio_rows)
    spread_rows = [[name, r["min"], r["median"], r["max"]] for name, r in results["round_ratios"].items()]
    spread_table = report.table(["ratio of the rounds' p50s", "lowest", "median", "highest"], spread_rows)
    ledger = results["ledger"]
    lines = [
        f"# Per-call latency over stdio ({report.machine_line(results['machine'])})",
        "",
        f"`read_note` on the demo notes server, {settings['timed_calls_per_path']} sequential calls per path "
        f"after {settings['warmup_calls_per_path']} warm-up calls, interleaved in {settings['rounds']} rounds.",
        "",
        paths_table,
        "",
        ratios_table,
        "",
        f"Each of the {settings['rounds']} rounds measures every path in turn; the ratios of their p50s show how far "
        "one round's figure strays from another's in this run:",
        "",
        spread_table,
        "",
        "The naive relay (bench/naive_relay.py) forwards calls through the mcp SDK's low-level server and client "
        "with nothing else: the floor any SDK-based relay pays here; bastion/naive is what Bastion adds beyond it. "
        "bastion/bastion_sdk is the express lane's effect: the same Bastion with `[server] express_lane = false`. "
        "The zero-work relay (bench/pipe_relay.py) forwards the bytes and reads nothing: what a third process on "
        f"the way costs by itself, {results['relay_floor']['pipe/direct p50']}x direct at p50 in this run. The "
        "recording relay (bench/ledger_relay.py) is that relay recording each call through Bastion's own ledger code "
        "(intent durable before the line goes on, outcome after the answer) and doing nothing else: "
        f"{results['relay_floor']['ledger_relay/direct p50']}x direct at p50; what Bastion costs beyond it is the "
        "rest of its path (catalog, policy, redaction, argument and result checks, the MCP messages). Bastion "
        "recording nothing (`python -m bench.without records`: the recorder scrubs and stores nothing, a measuring "
        "device, never a way to run Bastion) is that rest by itself: "
        f"{results['relay_floor']['bastion_unrecorded/direct p50']}x direct at p50; bastion/bastion_unrecorded is "
        "what the records cost on Bastion's path.",
        "",
        "Ledgers: "
        + "; ".join(
            f"{results['paths'][name]['label']}: {check['calls_made']} calls made, read_note invocations by status "
            f"{check['read_note_invocations_by_status']}, exactly one completed per call: "
            f"{check['exactly_one_completed_per_call']}"
            for name, check in ledger.items()
        )
        + ".",
        "",
        f"Target: {results['target']}.",
    ]
    if "fastmcp_missing" in results:
        lines += ["", results["fastmcp_missing"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per path (default 1000)")
    parser.add_argument("--warmup", type=int, default=100, help="warm-up calls per path (default 100)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds the timed calls are split into (default 10)")
    args = parser.parse_args()
    results = anyio.run(run, args.calls, args.warmup, args.rounds)
    report.write("latency", results, markdown(results))
    report.fail_on(problems(results), "latency")


def problems(results: dict[str, Any]) -> list[str]:
    """What makes this run's figures unusable: a failed call on any path, or a ledger (Bastion's, with its express
    lane and without, and the recording relay's) that does not hold exactly one completed invocation per call."""
    found = [
        f"{name}: {path['errors']} failed call(s) timed, {path['warmup_errors']} in the warm-up"
        for name, path in results["paths"].items()
        if path["errors"] or path["warmup_errors"]
    ]
    for name, ledger in results["ledger"].items():
        if not ledger["exactly_one_completed_per_call"]:
            found.append(
                f"{name}'s ledger holds {ledger['read_note_invocations_by_status']} read_note invocations for "
                f"{ledger['calls_made']} calls made"
            )
    return found


if __name__ == "__main__":
    main()
