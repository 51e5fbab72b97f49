"""The command line's start: how long `bastion --version` and `bastion ... --help` take, from exec to exit.

Each round runs every command once, in turn, so a change in the machine's load hits them alike: the interpreter
alone (`python -c pass`, the floor any Python command pays), `--version`, the top-level help and the help of a
group and of a command. Reported: the median and the slowest wall time of each over the rounds, its ratio to the
interpreter alone, and whether it answers in under `TARGET_MS`. The commands run with the interpreter's normal
settings (bytecode caches written and read: PYTHONDONTWRITEBYTECODE is dropped), as on a person's machine; one
unmeasured round warms the caches first. Run: `python -m bench.cli_start` (`make bench-cli`). Results go to
bench/results/cli_start.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from bench import report

TARGET_MS: Final = 300.0
"""What `--version` and `--help` must answer within on the bench machine."""
COMMANDS: Final = {
    "python -c pass": ["-c", "pass"],
    "bastion --version": ["-m", "bastion", "--version"],
    "bastion --help": ["-m", "bastion", "--help"],
    "bastion audit --help": ["-m", "bastion", "audit", "--help"],
    "bastion approvals approve --help": ["-m", "bastion", "approvals", "approve", "--help"],
}
FLOOR: Final = "python -c pass"


def _script() -> list[str]:
    """The installed `bastion` script when it sits beside this interpreter (what a person runs); else `-m`."""
    beside = Path(sys.executable).with_name("bastion")
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", "bastion"]


def _argv(args: list[str]) -> list[str]:
    if args[:2] == ["-m", "bastion"]:
        return [*_script(), *args[2:]]
    return [sys.executable, *args]


def _run_once(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, check=False, timeout=60)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench cli_start: FAILED: {' '.join(argv)} exited {done.returncode}: {done.stderr!r}")
    return elapsed


def measure(rounds: int) -> dict[str, list[float]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"COLUMNS": "80"}
    argvs = {name: _argv(args) for name, args in COMMANDS.items()}
    for argv in argvs.values():  # warm: bytecode written, files in the page cache
        _run_once(argv, env)
    seconds: dict[str, list[float]] = {name: [] for name in argvs}
    for _ in range(rounds):
        for name, argv in argvs.items():
            seconds[name].append(_run_once(argv, env))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    rounds = parser.parse_args().rounds
    seconds = measure(rounds)
    floor = statistics.median(seconds[FLOOR]) * 1000
    commands = {}
    for name, values in seconds.items():
        median = statistics.median(values) * 1000
        commands[name] = {
            "median_ms": round(median, 1),
            "max_ms": round(max(values) * 1000, 1),
            "over_interpreter": report.ratio(median, floor),
            "met": None if name == FLOOR else median < TARGET_MS,
        }
    machine = report.machine()
    results = {
        "benchmark": "cli_start",
        "machine": machine,
        "settings": {"rounds": rounds, "target_ms": TARGET_MS},
        "commands": commands,
    }
    rows = [
        (
            f"`{name}`",
            c["median_ms"],
            c["max_ms"],
            f"{c['over_interpreter']}x",
            "-" if c["met"] is None else ("met" if c["met"] else "NOT met"),
        )
        for name, c in commands.items()
    ]
    markdown = "\n\n".join(
        [
            "# The command line's start",
            f"{report.machine_line(machine)}; {rounds} rounds, each command once per round. "
            f"Target: under {TARGET_MS:.0f} ms.",
            report.table(("command", "median, ms", "slowest, ms", "over the interpreter", "target"), rows),
        ]
    )
    report.write("cli_start", results, markdown)
    report.fail_on([f"{name} took {c['median_ms']} ms" for name, c in commands.items() if c["met"] is False], "cli")


if __name__ == "__main__":
    main()
