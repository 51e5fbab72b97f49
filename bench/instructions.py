"""Instructions per call of Bastion's process on the allow path, counted by valgrind (a measure that
does not move with the machine's load).

CPU time per call on this machine moves by +-5 % and more from one run to the next (the other processes, the
caches), so a change worth 2-3 % cannot be told apart in a timed run. The number of instructions a process runs
per call is the same to a fraction of a percent in every run: valgrind's callgrind counts them. For each tree given
(default: this checkout), `bastion serve` from that tree runs under callgrind (its downstream, the demo notes
server, runs natively), a client makes `--warmup` calls over stdio, callgrind's counters are dumped, then
`--calls` more calls, each answered without error, and dumped again: the second dump holds exactly those calls.
With `--direct`, the demo server itself is counted the same way (the work a call costs the downstream, for scale).
With `--parts`, this checkout is also counted without each part of the allow path named (bench/without.py: the
ledger's writes, the whole record, redaction, the result's check, the argument hash, the observers): what a part
costs is the count with it less the count without it, a profile by part that does not move with the machine.

Under valgrind a call takes ~50 times as long, so timed background work (the ledger feed's poll every 50 ms, the
instance's heartbeat) runs more often per call than it does natively, and how often depends on how fast valgrind
runs at the moment. So the process is also counted idle for `--idle` seconds before the calls, and that rate of
background instructions over the calls' wall time is taken off their count. Each tree is counted `--repeat` times,
the trees interleaved: the median is reported with the spread (about +-1 %, against +-5 % and more for CPU time).

Reported per tree: instructions per call, and the share of each shared object (the Python interpreter, SQLite, the
C library, each extension module) in the calls' count. What is not counted: the kernel's work (system calls, the
WAL's writes, waking other processes), and cache misses. Needs valgrind (`apt-get install -y valgrind`).
Run: `python -m bench.instructions [--calls N] [--direct] [--parts all|PART,...] [TREE ...]`. Results go to
bench/results/instructions.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from bench import report, without
from bench.configs import NOTE, notes_config, write_notes
from bench.processes import children

REPO = Path(__file__).resolve().parent.parent
TOP_OBJECTS = 8
_NAMED = re.compile(r"\((?P<id>\d+)\)(?: (?P<name>.*))?")
_EXTENSION_TAG = re.compile(r"\.cpython-[^.]*(?=\.so)")
"""`_sqlite3.cpython-311-x86_64-linux-gnu.so` reads `_sqlite3.so`."""
MISSING = "valgrind is not installed here; install it (`apt-get install -y valgrind`) and run again"


def self_cost_by_object(dump: Path) -> tuple[int, Counter[str]]:
    """The total instructions of a callgrind dump, and each shared object's own (its functions' self cost)."""
    names: dict[str, str] = {}
    by_object: Counter[str] = Counter()
    total = 0
    current = "?"
    inclusive_next = False  # the cost line after `calls=` is the callee's inclusive cost, not the caller's own
    with dump.open() as lines:
        for line in lines:
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
            elif line.startswith("ob="):
                current = _name(names, line[3:].rstrip("\n"))
            elif line.startswith("cob="):
                _name(names, line[4:].rstrip("\n"))
            elif line.startswith("calls="):
                inclusive_next = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if inclusive_next:
                    inclusive_next = False
                    continue
                fields = line.split()
                if len(fields) >= 2:
                    by_object[_EXTENSION_TAG.sub("", Path(current).name) or "?"] += int(fields[1])
    return total, by_object


def _name(names: dict[str, str], text: str) -> str:
    """callgrind's name compression: `(7) /lib/x.so` defines object 7, a later `(7)` refers to it."""
    found = _NAMED.fullmatch(text)
    if found is None:
        return text
    if found["name"] is not None:
        names[found["id"]] = found["name"]
    return names.get(found["id"], "?")


async def count(
    name: str, tree: Path, calls: int, warmup: int, idle: float, direct: bool, workdir: Path, part: str | None = None
) -> dict[str, Any]:
    """Instructions per call of one process: `bastion serve` from `tree` (without `part`, when given: see
    bench/without.py), or (`direct`) the demo server."""
    notes = write_notes(workdir / f"{name}-notes.json")
    config = workdir / f"{name}-config"
    notes_config(config, notes)
    out = workdir / f"{name}.cg"
    bastion = ["-m", "bench.without", part] if part else ["-m", "bastion"]
    target = ["-m", "bastion.demo.notes"] if direct else [*bastion, "serve", "--config", str(config)]
    tool = "read_note" if direct else "notes__read_note"
    valgrind = ["--tool=callgrind", "--trace-children=no", f"--callgrind-out-file={out}.%p", sys.executable]
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(tree),
        "BASTION_NOTES_FILE": str(notes),
        "XDG_STATE_HOME": str(workdir / f"{name}-state"),
    }
    params = StdioServerParameters(command="valgrind", args=[*valgrind, *target], env=env, cwd=str(tree))
    before = set(children(os.getpid()))
    async with Client(params, cache=None, read_timeout_seconds=600) as client:
        (pid,) = set(children(os.getpid())) - before
        await _calls(client, tool, warmup)
        await _dump(pid)
        started = anyio.current_time()
        await anyio.sleep(idle)
        await _dump(pid)
        idle_rate = self_cost_by_object(Path(f"{out}.{pid}.2"))[0] / (anyio.current_time() - started)
        started = anyio.current_time()
        await _calls(client, tool, calls)
        await _dump(pid)
        background = idle_rate * (anyio.current_time() - started)
        total, by_object = self_cost_by_object(Path(f"{out}.{pid}.3"))
    per_call = {obj: round(cost / calls) for obj, cost in by_object.most_common(TOP_OBJECTS)}
    return {
        "tree": str(tree),
        "commit": _commit(tree),
        "direct": direct,
        "part": part,
        "calls": calls,
        "per_call": round((total - background) / calls),
        "background_per_call": round(background / calls),
        "objects": per_call,
    }


def _commit(tree: Path) -> str:
    """The checkout's commit, `+` when its files differ from it (or `?` outside git)."""
    try:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, check=True)
        changed = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"], capture_output=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head.stdout.decode().strip() + ("+" if changed.stdout.strip() else "")


async def _calls(client: Client, tool: str, calls: int) -> None:
    for _ in range(calls):
        result = await client.call_tool(tool, {"name": NOTE["name"]})
        assert not result.is_error, result


async def _dump(pid: int) -> None:
    """Write callgrind's counters so far to a numbered dump and zero them."""
    with anyio.fail_after(120):
        await anyio.run_process(["callgrind_control", "--dump", str(pid)])


async def run(
    trees: list[Path], calls: int, warmup: int, idle: float, repeat: int, direct: bool, parts: list[str]
) -> dict[str, Any]:
    targets: list[tuple[str, Path, bool, str | None]] = [("direct", REPO, True, None)] if direct else []
    targets += [(f"tree{index}", tree, False, None) for index, tree in enumerate(trees, start=1)]
    targets += [(f"without-{part}", REPO, False, part) for part in parts]
    counts: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _, _ in targets}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(repeat):
            for name, tree, is_direct, part in targets:
                counts[name].append(
                    await count(f"{name}-{round_}", tree, calls, warmup, idle, is_direct, Path(tmp), part)
                )
    results = []
    for name, _, _, _ in targets:
        ordered = sorted(counts[name], key=lambda counted: counted["per_call"])
        median = ordered[len(ordered) // 2]
        results.append({**median, "runs": [counted["per_call"] for counted in counts[name]]})
    return {"machine": report.machine(), "warmup": warmup, "idle_seconds": idle, "results": results}


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Instructions per call of Bastion's process ({report.machine_line(results['machine'])})",
        "",
        f"`notes__read_note` over stdio, ledger on, counted by valgrind's callgrind: {results['results'][0]['calls']} "
        f"calls after {results['warmup']}, less the background work counted idle ({results['idle_seconds']} s) over "
        "the calls' time. User-space instructions only (no kernel work, no cache misses); the median of the runs, "
        "each tree counted in every round (bench/instructions.py).",
        "",
        "| process | tree (commit) | instructions per call | runs | background taken off | largest shares "
        "(shared object: instructions per call, background included) |",
        "|---|---|---|---|---|---|",
    ]
    whole = next(
        (r for r in results["results"] if not r["direct"] and not r.get("part") and Path(r["tree"]) == REPO), None
    )
    for result in results["results"]:
        if result.get("part"):
            continue
        process = "demo server (direct)" if result["direct"] else "bastion serve"
        shares = ", ".join(f"{obj}: {cost}" for obj, cost in result["objects"].items())
        runs = " / ".join(str(run) for run in result["runs"])
        lines.append(
            f"| {process} | {result['tree']} ({result['commit']}) | {result['per_call']} | {runs} | "
            f"{result['background_per_call']} | {shares} |"
        )
    parted = [result for result in results["results"] if result.get("part")]
    if parted and whole is not None:
        lines += [
            "",
            f"What each part of the allow path costs: the count of `bastion serve` ({whole['tree']}, "
            f"{whole['commit']}) less its count without the part (bench/without.py), in the same rounds.",
            "",
            "| part | what is left out | instructions per call without it | the part's cost per call | share |",
            "|---|---|---|---|---|",
        ]
        for result in parted:
            cost = whole["per_call"] - result["per_call"]
            lines.append(
                f"| {result['part']} | {without.describe(result['part'])} | {result['per_call']} | {cost} | "
                f"{cost / whole['per_call']:.1%} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, help="checkouts of Bastion to count (default: this one)")
    parser.add_argument("--calls", type=int, default=200, help="counted calls (default 200)")
    parser.add_argument("--warmup", type=int, default=100, help="calls before counting (default 100)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds counted idle, for the background (default 3)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tree, interleaved (default 3)")
    parser.add_argument("--direct", action="store_true", help="also count the demo server called directly")
    parser.add_argument(
        "--parts",
        default="",
        help=f"also count this checkout without the parts named (comma-separated) or `all`: {', '.join(without.PARTS)}",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit(MISSING)
    trees = [tree.resolve() for tree in args.trees] or [REPO]
    parts = list(without.PARTS) if args.parts == "all" else [part for part in args.parts.split(",") if part]
    unknown = sorted(set(parts) - without.PARTS.keys())
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(without.PARTS)}")
    if parts and REPO not in trees:
        parser.error("--parts measures this checkout: pass it among the trees (or none)")
    results = anyio.run(run, trees, args.calls, args.warmup, args.idle, args.repeat, args.direct, parts)
    report.write("instructions", results, markdown(results))


if __name__ == "__main__":
    main()
