"""One step of a plugin action in a child process: an argument vector (never a shell), the configured working
directory, an environment of the bound credentials only, JSON on stdin and stdout, a timeout and an output cap,
confined as its package's permissions say (bastion.sources.plugins.sandbox).

A step that runs too long or writes too much is killed (its whole process group) and reported as such; nothing
of it outlives the call, nor Bastion (the sandbox dies with it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
from anyio.abc import Process

STDERR_TAIL: Final = 2000
"""How much of a step's stderr is kept for its report (the end of it)."""


@dataclass(frozen=True)
class StepRun:
    """What came of one step: `ok` when it exited 0 in time, within the cap, with a JSON object (or nothing)."""

    argv: tuple[str, ...]
    exit_code: int | None
    output: dict[str, Any] | None
    error: str | None
    """Why it did not succeed: the timeout, the cap, an exit status, output that is not a JSON object."""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def report(self) -> dict[str, Any]:
        """The step as the result envelope shows it."""
        shown: dict[str, Any] = {"command": list(self.argv), "ok": self.ok, "exitCode": self.exit_code}
        if self.error is not None:
            shown["error"] = self.error
        if self.stderr:
            shown["stderr"] = self.stderr
        return shown


async def run_step(
    argv: Sequence[str],
    payload: Mapping[str, Any] | None,
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    max_output: int,
    confine: Callable[[Sequence[str]], Sequence[str]] | None = None,
) -> StepRun:
    """Run `argv` with `payload` as JSON on its stdin (nothing for a verification command) and read its stdout;
    `confine` turns the command into the one that runs it confined (bastion.sources.plugins.sandbox)."""
    shown = tuple(argv)
    program = shutil.which(argv[0]) if os.sep not in argv[0] else argv[0]
    if program is None:
        return StepRun(shown, None, None, f"{argv[0]!r} is not found on Bastion's PATH; install it")
    stdin = b"" if payload is None else json.dumps(payload, ensure_ascii=False).encode()
    command = [program, *argv[1:]]
    try:
        process = await anyio.open_process(
            list(confine(command)) if confine is not None else command,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return StepRun(shown, None, None, f"it could not be started ({exc.strerror or exc})")
    stdout = bytearray()
    stderr = bytearray()
    too_much = False
    try:
        with anyio.move_on_after(timeout) as deadline:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_write, process, stdin)
                tg.start_soon(_drain, process, stderr, STDERR_TAIL)
                assert process.stdout is not None
                async for chunk in process.stdout:
                    stdout += chunk
                    if len(stdout) > max_output:
                        too_much = True
                        _kill(process)
                        break
                await process.wait()
    finally:
        with anyio.CancelScope(shield=True):
            _kill(process)
            await process.wait()
    tail = bytes(stderr[-STDERR_TAIL:]).decode(errors="replace").strip()
    if deadline.cancelled_caught:
        return StepRun(shown, None, None, f"it ran longer than {timeout:g} s and was stopped", tail)
    if too_much:
        return StepRun(shown, None, None, f"it wrote more than {max_output} bytes and was stopped", tail)
    code = process.returncode
    if code != 0:
        return StepRun(shown, code, None, f"it exited with status {code}", tail)
    text = bytes(stdout).decode(errors="replace").strip()
    if not text:
        return StepRun(shown, code, None, None, tail)
    try:
        output = json.loads(text)
    except json.JSONDecodeError:
        output = None
    if not isinstance(output, dict):
        return StepRun(shown, code, None, "its stdout is not one JSON object", tail)
    return StepRun(shown, code, output, None, tail)


async def _write(process: Process, data: bytes) -> None:
    assert process.stdin is not None
    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        if data:
            await process.stdin.send(data)
    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()


async def _drain(process: Process, into: bytearray, keep: int) -> None:
    """Read stderr to its end, keeping only its last `keep` bytes."""
    assert process.stderr is not None
    async for chunk in process.stderr:
        into += chunk
        del into[:-keep]


def _kill(process: Process) -> None:
    """SIGKILL the step's process group, whatever its leader did: a step is stopped, never asked (its outcome is a
    failure either way), and a child it left behind must not outlive the call."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
