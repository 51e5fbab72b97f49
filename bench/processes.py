"""What each process under test costs, read from /proc (Linux): CPU time and memory, per named process, so
Bastion's own cost is told apart from its connectors' and from the benchmark client's. Servers are started
and stopped with `tests.processes.served`, the end-to-end tests' helper.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The direct children of `pid`, from each process's parent id in /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat_fields(int(entry.name))
        if stat is not None and int(stat[1]) == pid:
            found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, grandchildren...)."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        below = [c for p in frontier for c in children(p)]
        found.extend(below)
        frontier = below
    return found


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU time the processes have used so far; a process that has gone counts 0."""
    total = 0
    for pid in pids:
        stat = _stat_fields(pid)
        if stat is not None:
            total += int(stat[11]) + int(stat[12])  # utime, stime (fields 14 and 15 of /proc/PID/stat)
    return total / _CLOCK_TICKS


def memory_kib(pid: int, key: str = "VmRSS") -> int:
    """One line of /proc/PID/status in KiB (VmRSS: resident now; VmHWM: the resident peak); 0 if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state is [0], ppid [1])."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


def free_port() -> int:
    """A loopback port nobody listens on right now (for servers that cannot be told `--port 0`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
