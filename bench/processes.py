"""The processes under test: starting a server and waiting until it serves, and reading what each one costs.

CPU time and memory come from /proc (Linux), so every figure belongs to one named process: Bastion's
own cost is told apart from its connectors' and from the benchmark client's.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

LISTENING = re.compile(r"listening on (http://\S+)")
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


@dataclass
class Server:
    """A server process started by `serving`, with the stderr lines it printed so far."""

    process: Process
    url: str
    started_at: float
    ready_at: float
    stderr: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid


@asynccontextmanager
async def serving(
    argv: Sequence[str], *, env: Mapping[str, str], port: int | None = None, timeout: float = 120
) -> AsyncIterator[Server]:
    """Start an HTTP server, yield once it serves, then stop it and everything it started.

    Ready means the `listening on URL` line on stderr (Bastion), or, given `port`, that the port
    accepts connections (the demo server, which prints nothing). Waits are bounded by `timeout`.
    """
    started_at = time.perf_counter()
    # A session of its own, so stopping it reaches every process it started.
    process = await anyio.open_process(
        list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )
    lines: list[str] = []
    urls: list[str] = []
    announced = anyio.Event()

    async def drain() -> None:
        assert process.stderr is not None
        buffer = ""
        async for chunk in TextReceiveStream(process.stderr):
            buffer += chunk
            *complete, buffer = buffer.split("\n")
            for line in complete:
                lines.append(line)
                match = LISTENING.search(line)
                if match and not announced.is_set():
                    urls.append(match.group(1))
                    announced.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            try:
                with anyio.fail_after(timeout):
                    url = await _ready(process, announced, urls, port)
                yield Server(process, url, started_at, time.perf_counter(), lines)
            except TimeoutError as exc:
                raise RuntimeError(f"{argv[:4]} did not serve within {timeout} s:\n" + "\n".join(lines[-20:])) from exc
            finally:
                tg.cancel_scope.cancel()
                await stop(process)
    finally:
        if process.returncode is None:
            process.kill()


async def _ready(process: Process, announced: anyio.Event, urls: list[str], port: int | None) -> str:
    while True:
        if process.returncode is not None:
            raise RuntimeError(f"the server exited with status {process.returncode} before serving")
        if port is None:
            with anyio.move_on_after(0.5):
                await announced.wait()
            if urls:
                return urls[0]
        else:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)
            else:
                await stream.aclose()
                return f"http://127.0.0.1:{port}"


async def stop(process: Process) -> None:
    """SIGTERM the process group, wait (bounded), then SIGKILL it."""
    with anyio.CancelScope(shield=True):
        for signum, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            if process.returncode is not None:
                break
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                break
            with anyio.move_on_after(grace):
                await process.wait()
        await process.aclose()
