"""Where Bastion's process spends its CPU per call on the allow path (measure first).

A client calls `notes__read_note` through `bastion serve` over stdio (ledger on) while py-spy samples Bastion's
process. Each sample is charged to one part by walking its stack from the innermost frame outwards, the first
frame that names a part deciding:

- ledger: `bastion/ledger/`, aiosqlite, sqlite3;
- SDK client: `mcp/client/` (Bastion's link to the downstream);
- SDK server: `mcp/server/` (Bastion's host server to the host);
- Bastion: the rest of `bastion/` (pipeline, policies, connectors' glue, the host server's handlers), but not
  `bastion/cli/`, which only started the server and is the root of every main-task stack;
- SDK session: only `mcp/shared/` frames (the message loops both sides share: framing, validation, dispatch);
- event loop and other: none of the above (asyncio, anyio, threads).

So pydantic or json work done by the SDK client counts as SDK client, and so on. CPU per call comes from the
process's own counters over the same calls. py-spy samples the wall clock while a thread holds the GIL: a process
that wakes another and is then made to wait for a core (on two cores, often) keeps being sampled at the line that
woke it, so a frame's share is wall time, not only CPU.

Where `perf` can sample the process (Linux, root or perf_event_paranoid <= 1), the same number of calls runs again
under `perf record -e cpu-clock` (CPU time only, in native code): the CPU by library (the Python interpreter,
SQLite, the kernel, the C library, each extension) says how much of the cost is Python bytecode being run at all.
Run: `python -m bench.profile` (py-spy is in .venv-bench). Results go to bench/results/profile.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from bench import report
from bench.configs import NOTE, notes_config, write_notes
from bench.processes import children, cpu_seconds

PARTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("ledger", re.compile(r"(^|/)(bastion/ledger|aiosqlite|sqlite3)/")),
    ("SDK client", re.compile(r"(^|/)mcp/client/")),
    ("SDK server", re.compile(r"(^|/)mcp/server/")),
    ("Bastion", re.compile(r"(^|/)bastion/(?!cli/|__main__)")),  # the command line only started the server
)
SHARED = re.compile(r"(^|/)mcp/shared/")
TOP_FRAMES = 25
FRAME = re.compile(r"\((?P<file>[^():]+):\d+\)$")


def part_of(stack: list[str]) -> tuple[str, str]:
    """The part a sample is charged to (see the module docstring) and the frame that decided it; `stack` is
    outermost first."""
    shared = ""
    for frame in reversed(stack):
        found = FRAME.search(frame)
        where = found.group("file") if found else frame
        for name, pattern in PARTS:
            if pattern.search(where):
                return name, frame
        if not shared and SHARED.search(where):
            shared = frame
    return ("SDK session", shared) if shared else ("event loop and other", stack[-1] if stack else "")


NATIVE_PARTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Python interpreter", re.compile(r"^(libpython|python3)")),
    ("SQLite", re.compile(r"^(libsqlite3|_sqlite3)")),
    ("kernel", re.compile(r"^\[kernel")),
    ("C library", re.compile(r"^(libc|libm|ld-linux)[.-]")),
    ("pydantic-core", re.compile(r"^_pydantic_core")),
    ("uvloop", re.compile(r"^loop\.cpython")),
)
PERF_LINE = re.compile(r"^\s*(?P<share>[\d.]+)%\s+(?P<dso>\S.*?)\s*$")


def native_parts(report_text: str) -> dict[str, float]:
    """Shares of CPU per native part from `perf report --sort dso` text; what no part names is `other extensions`."""
    shares: dict[str, float] = {}
    for line in report_text.splitlines():
        found = PERF_LINE.match(line)
        if found is None:
            continue
        dso = found.group("dso")
        name = next((name for name, pattern in NATIVE_PARTS if pattern.search(dso)), "other extensions")
        shares[name] = shares.get(name, 0.0) + float(found.group("share")) / 100
    return dict(sorted(shares.items(), key=lambda item: -item[1]))


async def read_notes(client: Client, calls: int) -> None:
    """`calls` calls of the allow path through Bastion, each one answered without error."""
    for _ in range(calls):
        result = await client.call_tool("notes__read_note", {"name": NOTE["name"]})
        assert not result.is_error, result


async def perf_split(client: Client, pid: int, calls: int, workdir: Path) -> dict[str, Any] | None:
    """`calls` calls with perf sampling Bastion's CPU (cpu-clock): its share per native part and CPU ms per call, or
    None where perf cannot sample (not installed, not allowed)."""
    perf = shutil.which("perf")
    if perf is None:
        return None
    data = workdir / "perf.data"
    command = [perf, "record", "-e", "cpu-clock", "-F", "2000", "-p", str(pid), "-o", str(data)]
    sampler = await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    await read_notes(client, min(calls, 20))  # perf attaches while these run
    cpu_before = cpu_seconds([pid])
    await read_notes(client, calls)
    cpu = cpu_seconds([pid]) - cpu_before
    if sampler.returncode is not None:  # it could not sample (not allowed here)
        return None
    sampler.send_signal(signal.SIGINT)  # perf writes its data and exits
    with anyio.fail_after(60):
        await sampler.wait()
    if not data.exists():
        return None
    report_command = [perf, "report", "-i", str(data), "--no-children", "--sort", "dso", "--stdio"]
    try:
        shown = await anyio.run_process(report_command, stderr=subprocess.DEVNULL)
    except subprocess.CalledProcessError:
        return None
    parts = native_parts(shown.stdout.decode(errors="replace"))
    if not parts:
        return None
    per_call_ms = cpu / calls * 1000
    return {
        "cpu_ms_per_call": round(per_call_ms, 3),
        "parts": {
            name: {"share": round(share, 3), "cpu_ms_per_call": round(per_call_ms * share, 3)}
            for name, share in parts.items()
        },
    }


def charge(raw: str) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Samples per part, and per (part, deciding frame), from py-spy's raw output (`frame;frame;... count`)."""
    parts: Counter[str] = Counter()
    frames: Counter[tuple[str, str]] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            part, frame = part_of(stack.split(";"))
            parts[part] += int(count)
            frames[(part, frame)] += int(count)
    return parts, frames


async def run(calls: int, warmup: int, rate: int) -> dict[str, Any]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with tempfile.TemporaryDirectory(prefix="bastion-bench-profile-") as tmp:
        workdir = Path(tmp)
        notes_file = write_notes(workdir / "notes.json")
        notes_config(workdir / "config", notes_file)
        env = {"BASTION_NOTES_FILE": str(notes_file), "XDG_STATE_HOME": str(workdir / "state")}
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "bastion", "serve", "--config", str(workdir / "config")], env=env
        )
        before = set(children(os.getpid()))
        async with Client(params, cache=None) as client:
            (pid,) = set(children(os.getpid())) - before
            await read_notes(client, warmup)
            output = workdir / "profile.txt"
            command = [py_spy, "record", "--gil", "--pid", str(pid), "--rate", str(rate), "--format", "raw"]
            sampler = await anyio.open_process([*command, "-o", str(output)], stdout=subprocess.DEVNULL)
            cpu_before = cpu_seconds([pid])
            await read_notes(client, calls)
            cpu = cpu_seconds([pid]) - cpu_before
            sampler.send_signal(signal.SIGINT)  # py-spy writes its profile and exits
            with anyio.fail_after(60):
                await sampler.wait()
            if not output.exists():
                assert sampler.stderr is not None
                errors = await sampler.stderr.receive()
                raise RuntimeError(f"py-spy wrote no profile: {errors.decode(errors='replace')[-500:]}")
            parts, frames = charge(output.read_text())
            native = await perf_split(client, pid, calls, workdir)
    total = sum(parts.values()) or 1
    per_call_ms = cpu / calls * 1000
    return {
        "benchmark": "profile",
        "machine": report.machine(),
        "settings": {"calls": calls, "warmup_calls": warmup, "sampling_rate_hz": rate},
        "cpu_ms_per_call": round(per_call_ms, 3),
        "samples": total,
        "parts": {
            name: {"share": round(count / total, 3), "cpu_ms_per_call": round(per_call_ms * count / total, 3)}
            for name, count in parts.most_common()
        },
        "top_frames": [
            {"part": part, "frame": frame, "share": round(count / total, 3)}
            for (part, frame), count in frames.most_common(TOP_FRAMES)
        ],
        "native": native,
    }


def markdown(results: dict[str, Any]) -> str:
    rows = [[name, f"{p['share'] * 100:.1f} %", p["cpu_ms_per_call"]] for name, p in results["parts"].items()]
    settings = results["settings"]
    return "\n".join(
        [
            f"# Bastion's CPU per call on the allow path ({report.machine_line(results['machine'])})",
            "",
            f"`notes__read_note` through `bastion serve` over stdio, ledger on: {settings['calls']} calls after "
            f"{settings['warmup_calls']} warm-up calls, Bastion's process sampled by py-spy at "
            f"{settings['sampling_rate_hz']} Hz ({results['samples']} samples while it ran). Its CPU: "
            f"{results['cpu_ms_per_call']} ms per call.",
            "",
            report.table(["part", "share of samples", "CPU ms/call"], rows),
            "",
            f"The {TOP_FRAMES} frames that decided the most samples (the innermost frame of their part):",
            "",
            report.table(
                ["part", "frame", "share"],
                [[f["part"], f["frame"], f"{f['share'] * 100:.1f} %"] for f in results["top_frames"]],
            ),
            "",
            "A sample is charged to the innermost frame that names a part: work the SDK's client does (validating, "
            "dumping) is the SDK client's; `SDK session` is the message loops both sides share (bench/profile.py). "
            "py-spy samples wall time while the GIL is held: after a write that wakes another process, the wait for "
            "a core is charged to the line that wrote.",
            "",
            *_native_section(results.get("native")),
        ]
    )


def _native_section(native: dict[str, Any] | None) -> list[str]:
    if native is None:
        return ["CPU by native code: not measured (`perf` is missing or may not sample processes here)."]
    rows = [[name, f"{p['share'] * 100:.1f} %", p["cpu_ms_per_call"]] for name, p in native["parts"].items()]
    return [
        f"CPU by native code (`perf record -e cpu-clock`, the same number of calls again; {native['cpu_ms_per_call']} "
        "ms per call): what runs Python bytecode is the interpreter's share; SQLite's, the kernel's (system calls, "
        "waking other processes, the WAL's writes) and the extensions' are work done below Python.",
        "",
        report.table(["native part", "share of CPU", "CPU ms/call"], rows),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="profiled calls (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up calls before sampling (default 200)")
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples per second (default 1000)")
    args = parser.parse_args()
    results = anyio.run(run, args.calls, args.warmup, args.rate)
    report.write("profile", results, markdown(results))


if __name__ == "__main__":
    main()
