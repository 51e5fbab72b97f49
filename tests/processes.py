"""Real processes for end-to-end tests: Bastion itself, configured with real downstream servers.

Every process is stopped by the context manager that started it; readiness is a line the process
prints, waited for with a bounded wait.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

READY = re.compile(r"listening on (http://\S+)")


def write_config(
    directory: Path,
    *,
    notes_file: Path,
    time_server: bool = True,
    policy: str = "",
    extra_connectors: Mapping[str, str] | None = None,
    list_timeout: float = 20,
    startup_wait: float | None = 20,
) -> Path:
    """A configuration directory with the demo notes server (and mcp-server-time) as stdio connectors.

    By default a host's first listing waits (`startup_wait`) until every connector has listed, as long as
    one may take (`list_timeout`), so a test that lists at once sees the whole catalog; None leaves
    Bastion's default start-up wait.
    """
    (directory / "connectors").mkdir(parents=True, exist_ok=True)
    (directory / "policies").mkdir(exist_ok=True)
    wait = "" if startup_wait is None else f"startup_wait_seconds = {startup_wait}\n"
    (directory / "bastion.toml").write_text(
        f'[server]\nledger = "sqlite:///state/ledger.db"\n{wait}[limits]\nlist_timeout_seconds = {list_timeout}\n'
    )
    (directory / "connectors" / "notes.toml").write_text(
        f'command = {_toml(sys.executable)}\nargs = ["-m", "bastion.demo.notes"]\n'
        f"env = {{ BASTION_NOTES_FILE = {_toml(str(notes_file))} }}\n"
    )
    if time_server:
        (directory / "connectors" / "time.toml").write_text(
            f'command = {_toml(sys.executable)}\nargs = ["-m", "mcp_server_time", "--local-timezone", "UTC"]\n'
        )
    for name, text in (extra_connectors or {}).items():
        (directory / "connectors" / f"{name}.toml").write_text(text)
    (directory / "policies" / "default.toml").write_text(policy)
    return directory


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def bastion_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment for a Bastion process that cannot touch the real user's files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASTION_")}
    env |= {"HOME": str(home), "XDG_STATE_HOME": str(home / ".local" / "state"), "PYTHONUNBUFFERED": "1"}
    return env | extra


def bastion_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "bastion", *args]


def run_cli(*args: str, env: Mapping[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run one `bastion` command to completion."""
    return subprocess.run(
        bastion_command(*args), env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )


class Lines(list[str]):
    """The lines a process printed so far, growing while it runs; `wait_for` waits for one to come."""

    def __init__(self) -> None:
        super().__init__()
        self._grew = anyio.Event()

    def add(self, line: str) -> None:
        self.append(line)
        self._grew.set()
        self._grew = anyio.Event()

    async def wait_for(self, predicate: Callable[[str], bool], timeout: float = 30) -> str:
        """The first line that satisfies `predicate`, once it has been printed (a bounded wait)."""
        with anyio.fail_after(timeout):
            while True:
                found = next((line for line in self if predicate(line)), None)
                if found is not None:
                    return found
                await self._grew.wait()


@dataclass
class Running:
    """A server process started by `served`, with what it printed on stderr so far."""

    process: Process
    base_url: str
    stderr: Lines = field(default_factory=Lines)
    started_at: float = 0.0
    ready_at: float = 0.0
    """`time.perf_counter()` when it was started, and when it first served."""

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"

    @property
    def pid(self) -> int:
        return self.process.pid


@asynccontextmanager
async def bastion_http(
    args: Sequence[str], *, env: Mapping[str, str], command: Sequence[str] | None = None
) -> AsyncIterator[Running]:
    """Start `bastion serve --transport http --port 0 ...`, yield once it listens, always stop it."""
    argv = list(command) if command else bastion_command("serve", "--transport", "http", "--port", "0", *args)
    async with served(argv, env=env) as running:
        yield running


@asynccontextmanager
async def served(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    port: int | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
) -> AsyncIterator[Running]:
    """Start an HTTP server, yield once it serves, then stop it and everything it started.

    Serving means its `listening on URL` line on stderr (Bastion), or, given `port`, that the port
    accepts connections (a server that prints nothing). Waits are bounded by `timeout`.
    """
    started_at = time.perf_counter()
    # A session of its own, so stopping it reaches every process it started (make -> bastion -> connectors).
    process = await anyio.open_process(
        list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )
    lines = Lines()
    announced: list[str] = []
    ready = anyio.Event()
    url: str | None = None

    async def drain() -> None:
        assert process.stderr is not None
        buffer = ""
        async for chunk in TextReceiveStream(process.stderr):
            buffer += chunk
            *complete, buffer = buffer.split("\n")
            for line in complete:
                lines.add(line)
                match = READY.search(line)
                if match and not ready.is_set():
                    announced.append(match.group(1))
                    ready.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            try:
                with anyio.move_on_after(timeout):
                    url = await _serving(process, ready, announced, port, lines)
                if url is None:
                    raise AssertionError(f"{list(argv)[:4]} did not serve within {timeout} s:\n" + _tail(lines))
                yield Running(process, url, lines, started_at, time.perf_counter())
            finally:
                tg.cancel_scope.cancel()  # stop draining before stop() closes the pipe
                await stop(process, group=True)
    finally:
        if process.returncode is None:
            process.kill()


def _tail(lines: list[str]) -> str:
    return "\n".join(lines[-20:])


async def _serving(
    process: Process, ready: anyio.Event, announced: list[str], port: int | None, lines: list[str]
) -> str | None:
    """The server's base URL once it serves; raises if it exits first."""
    while True:
        if process.returncode is not None:
            raise AssertionError(f"the server exited with status {process.returncode} before serving:\n" + _tail(lines))
        if port is None:
            with anyio.move_on_after(0.5):
                await ready.wait()
            if announced:
                return announced[0]
            continue
        try:
            stream = await anyio.connect_tcp("127.0.0.1", port)
        except OSError:
            with anyio.move_on_after(0.05):  # not listening yet: look again shortly (or when it exits)
                await process.wait()
        else:
            await stream.aclose()
            return f"http://127.0.0.1:{port}"


async def stop(process: Process, *, group: bool = False) -> None:
    """Terminate (the whole process group when `group`), wait (bounded), then kill."""
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            _signal(process, signal.SIGTERM, group)
            with anyio.move_on_after(15):
                await process.wait()
        if process.returncode is None:
            _signal(process, signal.SIGKILL, group)
        await process.aclose()


def _signal(process: Process, signum: int, group: bool) -> None:
    try:
        if group:
            os.killpg(process.pid, signum)
        else:
            os.kill(process.pid, signum)
    except ProcessLookupError:
        pass
