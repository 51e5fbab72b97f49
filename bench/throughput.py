"""Throughput over streamable HTTP: Bastion against the demo server served directly.

Servers run side by side: `bastion serve --transport http` in front of the demo notes server (a stdio
connector, ledger on, rate limit raised out of the way); the demo notes server itself over streamable HTTP
(its own app, on the stack `bastion serve` runs on: bench/http_serve.py); the naive low-level relay
(bench/naive_relay.py --transport http) in front of the demo server over stdio, the floor any relay on the mcp
SDK pays on this machine; and FastMCP's proxy (bench/fastmcp_proxy.py --transport http) when fastmcp is
installed. For each concurrency level (1, 8, 32 sessions), each target gets that many SDK client sessions calling
`read_note` in a loop for `--seconds` in all, in `--rounds` windows with the targets interleaved (their order
rotating per round), so a change in the machine's load during the run hits every target alike. Reported per
level: calls/s, the latency distribution, errors, CPU per call of the client and the servers, and the ratios of calls/s
(Bastion over direct, the naive relay and FastMCP; the relays over direct). The client may be spread over
`--client-processes` processes; each one's CPU share is reported so a saturated client is visible. At the end
the ledger must hold exactly one completed `read_note` invocation per call made to Bastion: if it does not,
or any call failed, or Bastion printed an error, it exits with status 1 once the results are written.
Run: `python -m bench.throughput [--seconds S] [--levels 1 8 32]`.
Results go to bench/results/throughput.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client
from mcp.shared.exceptions import MCPError

from bench import report
from bench.configs import NOTE, ledger_counts, notes_config, write_notes
from bench.http_serve import Stack
from bench.processes import cpu_seconds, descendants, free_port
from tests.processes import served

LEVELS = (1, 8, 32)
WARMUP_CALLS_PER_SESSION = 5
TARGET_ORDER = ("direct", "naive", "bastion", "fastmcp")
RATIOS = (
    ("bastion", "direct"),
    ("bastion", "naive"),
    ("bastion", "fastmcp"),
    ("naive", "direct"),
    ("fastmcp", "direct"),
)
DIRECT_STACK = Stack("uvicorn-httptools-uvloop", "uvicorn", "httptools", "uvloop")
"""The direct demo server runs on the stack `bastion serve` runs on (uvicorn + httptools on uvloop), so that
Bastion/direct measures Bastion and not its server stack."""
FASTMCP_MISSING = "fastmcp is not installed here; run `make bench` (it installs .venv-bench)"


@dataclass
class Load:
    """What one client process measured over one timed window."""

    calls: int = 0
    errors: int = 0
    warmup_calls: int = 0
    elapsed: float = 0.0
    client_cpu: float = 0.0
    samples: list[float] = field(default_factory=list)
    error_kinds: dict[str, int] = field(default_factory=dict)


@dataclass
class Target:
    name: str
    label: str
    url: str
    tool: str
    pid: int


class Sessions:
    """`count` connected SDK client sessions, warmed up, driven together over one timed window."""

    def __init__(self, url: str, tool: str, count: int) -> None:
        self.url, self.tool, self.count = url, tool, count
        self.load = Load()
        self._stack = AsyncExitStack()
        self._clients: list[Client] = []

    async def __aenter__(self) -> Sessions:
        try:
            for _ in range(self.count):
                client = await self._stack.enter_async_context(Client(self.url, cache=None))
                self._clients.append(client)
                for _ in range(WARMUP_CALLS_PER_SESSION):
                    await self._call(client, None)
                    self.load.warmup_calls += 1
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def run(self, seconds: float) -> Load:
        cpu_before = time.process_time()
        started = time.perf_counter()
        deadline = started + seconds
        async with anyio.create_task_group() as tg:
            for client in self._clients:
                tg.start_soon(self._loop, client, deadline)
        self.load.elapsed = time.perf_counter() - started
        self.load.client_cpu = time.process_time() - cpu_before
        return self.load

    async def _loop(self, client: Client, deadline: float) -> None:
        while time.perf_counter() < deadline:
            await self._call(client, self.load)

    async def _call(self, client: Client, load: Load | None) -> None:
        started = time.perf_counter()
        error: str | None = None
        try:
            result = await client.call_tool(self.tool, {"name": NOTE["name"]})
        except (MCPError, httpx2.HTTPError) as exc:
            error = type(exc).__name__
        else:
            if result.is_error:
                error = "is_error"
        if load is None:
            if error is not None:
                raise RuntimeError(f"a warm-up call to {self.url} failed: {error}")
            return
        load.calls += 1
        load.samples.append(time.perf_counter() - started)
        if error is not None:
            load.errors += 1
            load.error_kinds[error] = load.error_kinds.get(error, 0) + 1


async def worker() -> None:
    """Client process mode, one window after another: read `URL TOOL SESSIONS SECONDS` on stdin, connect and warm
    up, say `ready`, wait for `go`, then report the window's `Load` as JSON; exit at the end of stdin."""
    while line := await anyio.to_thread.run_sync(sys.stdin.readline):
        url, tool, count, seconds = line.split()
        async with Sessions(url, tool, int(count)) as sessions:
            print("ready", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            load = await sessions.run(float(seconds))
        print(json.dumps(asdict(load)), flush=True)


class Clients:
    """`count` client processes (`python -m bench.throughput --worker`), started once and given one window at a
    time, so a window does not wait for Python and the SDK to start; with a count of 1 this process is the client."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._stack = AsyncExitStack()
        self._workers: list[tuple[Process, BufferedByteReceiveStream]] = []

    async def __aenter__(self) -> Clients:
        argv = [sys.executable, "-m", "bench.throughput", "--worker"]
        try:
            for _ in range(self.count if self.count > 1 else 0):
                process = await self._stack.enter_async_context(
                    await anyio.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)
                )
                assert process.stdout is not None
                self._workers.append((process, BufferedByteReceiveStream(process.stdout)))
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.move_on_after(30, shield=True):
            for process, _ in self._workers:
                assert process.stdin is not None
                await process.stdin.aclose()  # the end of its stdin: the worker exits
                await process.wait()
        for process, _ in self._workers:
            if process.returncode is None:
                process.kill()
        await self._stack.aclose()

    async def drive(self, target: Target, sessions: int, seconds: float) -> Window:
        """One timed window of one level on one target: `sessions` sessions over the client processes."""
        if not self._workers:
            async with Sessions(target.url, target.tool, sessions) as local:
                server_before = server_cpu(target)
                loads = [await local.run(seconds)]
                server_after = server_cpu(target)
        else:
            loads, server_before, server_after = await self._drive_workers(target, sessions, seconds)
        return Window(loads, {k: server_after[k] - server_before[k] for k in server_after})

    async def _drive_workers(
        self, target: Target, sessions: int, seconds: float
    ) -> tuple[list[Load], dict[str, float], dict[str, float]]:
        count = len(self._workers)
        shares = [sessions // count + (1 if i < sessions % count else 0) for i in range(count)]
        busy = [(worker, share) for worker, share in zip(self._workers, shares, strict=True) if share]
        for (process, _), share in busy:
            assert process.stdin is not None
            await process.stdin.send(f"{target.url} {target.tool} {share} {seconds}\n".encode())
        with anyio.fail_after(120):
            for (_, replies), _ in busy:
                if await replies.receive_until(b"\n", 100) != b"ready":
                    raise RuntimeError("a client process failed to connect")
        before = server_cpu(target)
        for (process, _), _ in busy:
            assert process.stdin is not None
            await process.stdin.send(b"go\n")
        loads = []
        with anyio.fail_after(seconds + 120):
            for (_, replies), _ in busy:
                loads.append(Load(**json.loads(await replies.receive_until(b"\n", 1 << 26))))
        after = server_cpu(target)
        return loads, before, after


@dataclass
class Window:
    """One timed window on one target: what each client process measured, and the CPU seconds its server and the
    server's children spent meanwhile."""

    loads: list[Load]
    server_cpu: dict[str, float]

    @property
    def elapsed(self) -> float:
        return max(load.elapsed for load in self.loads)  # the client processes run at once


def summarise(sessions: int, windows: list[Window]) -> dict[str, Any]:
    """One level's figures on one target from its timed windows (the rounds of the run)."""
    loads = [load for window in windows for load in window.loads]
    calls = sum(load.calls for load in loads)
    errors = sum(load.errors for load in loads)
    elapsed = sum(window.elapsed for window in windows)
    kinds: dict[str, int] = {}
    for load in loads:
        for kind, n in load.error_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + n
    spent = {k: sum(window.server_cpu[k] for window in windows) for k in windows[0].server_cpu}
    per_call = {k: round(seconds / max(calls, 1) * 1000, 3) for k, seconds in spent.items()}
    return {
        "sessions": sessions,
        "client_processes": len(windows[0].loads),
        "rounds": len(windows),
        "calls": calls,
        "ok_calls": calls - errors,
        "errors": errors,
        "error_kinds": kinds,
        "warmup_calls": sum(load.warmup_calls for load in loads),
        "seconds": round(elapsed, 3),
        "calls_per_s": round((calls - errors) / elapsed, 1),
        "latency": report.distribution([s for load in loads for s in load.samples]),
        "cpu_ms_per_call": {"client": round(sum(x.client_cpu for x in loads) / max(calls, 1) * 1000, 3), **per_call},
        "client_cpu_share_max": round(max(load.client_cpu / load.elapsed for load in loads), 3),
    }


def server_cpu(target: Target) -> dict[str, float]:
    return {"server": cpu_seconds([target.pid]), "downstream": cpu_seconds(descendants(target.pid))}


@dataclass(frozen=True)
class Spec:
    """A server to measure: how it is started, and what it serves."""

    name: str
    label: str
    stack: str
    tool: str
    argv: list[str]
    port: int | None
    """The port it was told to bind (None: it picks one and prints `listening on URL`, as Bastion does)."""


def specs(workdir: Path, with_fastmcp: bool) -> list[Spec]:
    parser = "httptools" if importlib.util.find_spec("httptools") else "h11"  # uvicorn's `auto`
    common = f"uvicorn + {parser} (uvicorn's default) on asyncio"
    python = sys.executable
    direct_port, naive_port, fastmcp_port = free_port(), free_port(), free_port()
    config = str(workdir / "config")
    found = [
        Spec(
            "direct",
            "direct (demo server, HTTP)",
            f"{DIRECT_STACK.label}, as `bastion serve` (bench/http_serve.py)",
            "read_note",
            [*DIRECT_STACK.argv(), "--port", str(direct_port), "demo"],
            direct_port,
        ),
        Spec(
            "bastion",
            "Bastion (HTTP, ledger on)",
            "what `bastion serve` runs: uvicorn + httptools on uvloop",
            "notes__read_note",
            [python, "-m", "bastion", "serve", "--config", config, "--transport", "http", "--port", "0"],
            None,
        ),
        Spec(
            "naive",
            "naive low-level relay (mcp SDK, HTTP)",
            common,
            "read_note",
            [python, str(Path(__file__).with_name("naive_relay.py")), "--transport", "http", "--port", str(naive_port)],
            naive_port,
        ),
    ]
    if with_fastmcp:
        proxy = str(Path(__file__).with_name("fastmcp_proxy.py"))
        found.append(
            Spec(
                "fastmcp",
                "FastMCP proxy (HTTP)",
                f"{common} (FastMCP's run)",
                "read_note",
                [python, proxy, "--transport", "http", "--port", str(fastmcp_port)],
                fastmcp_port,
            )
        )
    return found


async def run(seconds: float, levels: list[int], processes: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bastion-bench-throughput-") as tmp:
        workdir = Path(tmp)
        notes_file = write_notes(workdir / "notes.json")
        ledger = notes_config(workdir / "config", notes_file)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BASTION_")}
        env |= {"BASTION_NOTES_FILE": str(notes_file), "XDG_STATE_HOME": str(workdir / "state"), "HOME": tmp}
        with_fastmcp = importlib.util.find_spec("fastmcp") is not None
        measured = specs(workdir, with_fastmcp)
        rows: list[dict[str, Any]] = []
        async with AsyncExitStack() as stack:
            clients = await stack.enter_async_context(Clients(processes))
            targets = []
            for spec in measured:
                server = await stack.enter_async_context(served(spec.argv, env=env, port=spec.port))
                targets.append((Target(spec.name, spec.label, server.mcp_url, spec.tool, server.pid), server))
            for sessions in levels:
                # Each target's time is split into rounds, the targets interleaved and their order rotating per
                # round, so a change in the machine's load hits them all alike instead of whichever ran then.
                windows: dict[str, list[Window]] = {target.name: [] for target, _ in targets}
                for round_ in range(rounds):
                    shift = round_ % len(targets)
                    for target, _ in targets[shift:] + targets[:shift]:
                        windows[target.name].append(await clients.drive(target, sessions, seconds / rounds))
                for target, _ in targets:
                    measured_level = summarise(sessions, windows[target.name])
                    rows.append({"target": target.name, "label": target.label, **measured_level})
            running_counts = ledger_counts(ledger)
            gateway = next(server for target, server in targets if target.name == "bastion")
            bastion_errors = [line for line in gateway.stderr if "Traceback" in line or "ERROR" in line]
        stopped_counts = ledger_counts(ledger)
    names = [spec.name for spec in measured]
    return {
        "benchmark": "throughput",
        "machine": report.machine(),
        "settings": {"seconds_per_level": seconds, "levels": levels, "client_processes": processes, "rounds": rounds},
        "stacks": {spec.name: spec.stack for spec in measured},
        "runs": rows,
        "ratios": {
            f"{over}/{under}": ratios(rows, levels, over, under)
            for over, under in RATIOS
            if over in names and under in names
        },
        "ledger": ledger_check(rows, "bastion", running_counts, stopped_counts),
        "bastion_stderr_error_lines": len(bastion_errors),
        "target": "Bastion/direct >= 0.6x at 8 and 32 sessions, nothing lost",
        **({} if with_fastmcp else {"fastmcp_missing": FASTMCP_MISSING}),
    }


def ledger_check(
    rows: list[dict[str, Any]], name: str, running: dict[str, int], stopped: dict[str, int]
) -> dict[str, Any]:
    """Whether the ledger holds exactly one completed `read_note` invocation per call made to target `name`
    (timed and warm-up calls), and nothing else."""
    made = sum(r["calls"] + r["warmup_calls"] for r in rows if r["target"] == name)
    answered = sum(r["ok_calls"] + r["warmup_calls"] for r in rows if r["target"] == name)
    return {
        "calls_made_to_bastion": made,
        "calls_bastion_answered_ok": answered,
        "read_note_by_status_while_running": running,
        "read_note_by_status_after_stop": stopped,
        "exactly_one_completed_per_call": stopped.get("completed", 0) == made and sum(stopped.values()) == made,
    }


def problems(results: dict[str, Any]) -> list[str]:
    """What makes this run's figures unusable: failed calls on any target, error lines from Bastion, or a ledger
    that does not hold exactly one completed invocation per call made through Bastion."""
    found = [
        f"{r['target']} at {r['sessions']} sessions: {r['errors']} failed call(s) {r['error_kinds']}"
        for r in results["runs"]
        if r["errors"]
    ]
    if results["bastion_stderr_error_lines"]:
        found.append(f"Bastion printed {results['bastion_stderr_error_lines']} error or traceback line(s)")
    ledger = results["ledger"]
    if not ledger["exactly_one_completed_per_call"]:
        found.append(
            f"Bastion's ledger holds read_note invocations {ledger['read_note_by_status_after_stop']} for "
            f"{ledger['calls_made_to_bastion']} calls made"
        )
    return found


def ratios(rows: list[dict[str, Any]], levels: list[int], over: str, under: str) -> dict[str, Any]:
    """calls/s of target `over` divided by that of `under`, per level."""

    def rate(name: str, level: int) -> float:
        return float(next(r["calls_per_s"] for r in rows if r["target"] == name and r["sessions"] == level))

    return {str(level): report.ratio(rate(over, level), rate(under, level)) for level in levels}


def markdown(results: dict[str, Any]) -> str:
    rows = [
        [
            r["sessions"],
            r["label"],
            r["calls_per_s"],
            r["latency"].get("p50_ms"),
            r["latency"].get("p95_ms"),
            r["errors"],
            " / ".join(str(r["cpu_ms_per_call"][k]) for k in ("client", "server", "downstream")),
            r["client_cpu_share_max"],
        ]
        for r in sorted(results["runs"], key=lambda r: (r["sessions"], TARGET_ORDER.index(r["target"])))
    ]
    runs = report.table(
        [
            "sessions",
            "target",
            "calls/s",
            "p50 ms",
            "p95 ms",
            "errors",
            "CPU ms/call: client / server / downstream",
            "client CPU share",
        ],
        rows,
    )
    names = list(results["ratios"])
    levels = [str(level) for level in results["settings"]["levels"]]
    ratio_table = report.table(
        ["sessions", *(f"{name} calls/s" for name in names)],
        [[level, *(results["ratios"][name][level] for name in names)] for level in levels],
    )
    stacks = report.table(["target", "HTTP server stack"], list(results["stacks"].items()))
    ledger = results["ledger"]
    settings = results["settings"]
    lines = [
        f"# Throughput over streamable HTTP ({report.machine_line(results['machine'])})",
        "",
        f"`read_note` in a loop, {settings['seconds_per_level']} s per level and target in "
        f"{settings.get('rounds', 1)} rounds (the targets interleaved), "
        f"client sessions spread over {settings['client_processes']} process(es). "
        "Client CPU share: the busiest client process's CPU time over wall time (1.0 = one core saturated).",
        "",
        runs,
        "",
        ratio_table,
        "",
        "The naive relay (bench/naive_relay.py) forwards calls through the mcp SDK's low-level server and client "
        "with nothing else: Bastion/naive is what Bastion costs beyond what any relay on this SDK pays here.",
        "",
        stacks,
        "",
        f"Ledger: {ledger['calls_made_to_bastion']} calls made through Bastion, "
        f"{ledger['calls_bastion_answered_ok']} answered without error; read_note invocations by status after stop "
        f"{ledger['read_note_by_status_after_stop']} (while running: "
        f"{ledger['read_note_by_status_while_running']}); exactly one completed per call: "
        f"{ledger['exactly_one_completed_per_call']}. Bastion printed {results['bastion_stderr_error_lines']} "
        "error or traceback line(s) on stderr.",
        "",
        f"Target: {results['target']}.",
    ]
    if "fastmcp_missing" in results:
        lines += ["", results["fastmcp_missing"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=15, help="timed seconds per level and target (default 15)")
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS), help="concurrent sessions")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=2,
        help="client processes sharing the sessions (default 2: one process saturates before the direct server)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds each target's seconds are split into, targets interleaved (3)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        anyio.run(worker)
        return
    results = anyio.run(run, args.seconds, args.levels, args.client_processes, args.rounds)
    report.write("throughput", results, markdown(results))
    report.fail_on(problems(results), "throughput")


if __name__ == "__main__":
    main()
