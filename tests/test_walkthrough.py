"""The walkthroughs of the README and the guides run as written: their shell blocks marked runnable, in order, on a
fresh install (a throwaway HOME, no configuration: the embedded default), against a Bastion this test starts as
`make run` does and always stops, so the documentation cannot drift from what Bastion does.

A block is runnable when the line before its fence is one of these HTML comments (invisible on GitHub and in the
site):

- `<!-- runnable -->`: typed into one terminal, where the runnable blocks before it were typed (shell variables
  carry over); it must succeed.
- `<!-- runnable: background until "TEXT" -->`: run in a terminal of its own, left running; what follows runs once
  it printed TEXT, as a reader would wait to see it. It must end with status 0 before the test does.
- `<!-- runnable: after background -->`: as `runnable`, once every background block has ended.

The blocks name Bastion by `make run`'s address, `http://127.0.0.1:8765`; the test's Bastion listens on a free
port instead, and that address is put in its place.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from tests.processes import Lines, bastion_command, bastion_env, served, stop

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
MAKE_RUN_ADDRESS = "http://127.0.0.1:8765"
MARKER = re.compile(r'^<!-- runnable(?:: (?:background until "(?P<until>[^"]+)"|(?P<after>after background)))? -->$')
FENCE = re.compile(r"^```(?:sh|bash|console)\s*$")
BLOCK_SECONDS = 120.0
"""The bound on each block (and on a background block to print what it is waited for): a few CLI commands on a
busy machine."""
DONE = "__walkthrough_block_done__"


@dataclass(frozen=True)
class Block:
    """One runnable shell block: its text, where it is, and how it is run."""

    text: str
    line: int
    until: str | None = None
    after_background: bool = False


def runnable_blocks(path: Path) -> list[Block]:
    """The runnable blocks of a Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for number, line in enumerate(lines):
        marker = MARKER.match(line.strip())
        if marker is None:
            continue
        fence = number + 1
        assert fence < len(lines) and FENCE.match(lines[fence]), f"{path}:{number + 1}: no ```sh block after the marker"
        end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
        text = "\n".join(lines[fence + 1 : end])
        blocks.append(Block(text, number + 1, marker.group("until"), marker.group("after") is not None))
    return blocks


WALKTHROUGHS = [path for path in DOCUMENTS if runnable_blocks(path)]


def test_the_readme_has_a_runnable_walkthrough() -> None:
    assert ROOT / "README.md" in WALKTHROUGHS


class Terminal:
    """One bash session blocks are typed into, one after another, as a reader types them into a terminal."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.output: list[str] = []
        self._lines = TextReceiveStream(process.stdout) if process.stdout is not None else None

    async def type(self, block: Block, where: str) -> None:
        assert self.process.stdin is not None and self._lines is not None
        await self.process.stdin.send(f"{block.text}\nprintf '\\n%s\\n' {DONE}\n".encode())
        buffer = ""
        with anyio.fail_after(BLOCK_SECONDS):
            async for chunk in self._lines:
                buffer += chunk
                if f"\n{DONE}\n" in buffer:
                    self.output.append(buffer.split(f"\n{DONE}\n")[0])
                    return
        raise AssertionError(f"{where} failed (the shell stopped: a command in it failed):\n{buffer}")


@asynccontextmanager
async def terminal(cwd: Path, env: dict[str, str]) -> AsyncIterator[Terminal]:
    process = await anyio.open_process(
        ["bash", "--noprofile", "--norc"],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert process.stdin is not None
        await process.stdin.send(b"set -euo pipefail\n")
        yield Terminal(process)
    finally:
        await stop(process, group=True)


@dataclass
class Background:
    """A block left running in a terminal of its own, with what it printed so far."""

    process: Process
    where: str
    lines: Lines


async def _collect(process: Process, lines: Lines) -> None:
    assert process.stdout is not None
    buffer = ""
    async for chunk in TextReceiveStream(process.stdout):
        buffer += chunk
        *complete, buffer = buffer.split("\n")
        for line in complete:
            lines.add(line)
    if buffer:
        lines.add(buffer)


def _says(text: str, line: str) -> bool:
    return text in line


async def _ended(background: Background) -> None:
    with anyio.fail_after(BLOCK_SECONDS):
        code = await background.process.wait()
    said = "\n".join(background.lines)
    assert code == 0, f"{background.where} ended with status {code}:\n{said}"


@pytest.mark.parametrize("document", WALKTHROUGHS, ids=lambda path: path.relative_to(ROOT).as_posix())
async def test_the_walkthrough_runs_as_written(document: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = bastion_env(home, XDG_CONFIG_HOME=str(home / ".config"))
    # The reader's checkout: its .venv is the one running these tests (it holds bastion and its demo programs).
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    venv = Path(sys.executable).parent.parent
    assert (venv / "bin" / "bastion").is_file(), f"{venv}/bin/bastion is missing: install Bastion into {venv}"
    (checkout / ".venv").symlink_to(venv)
    # What `make run` starts, on a free port: no --config, so the embedded default, as on a fresh install.
    argv = bastion_command("serve", "--transport", "http", "--host", "127.0.0.1", "--port", "0")
    running_in_background: list[Background] = []
    async with (
        served(argv, env=env, cwd=checkout) as bastion,
        terminal(checkout, env) as shell,
        anyio.create_task_group() as tg,
    ):
        try:
            for block in runnable_blocks(document):
                where = f"{document.relative_to(ROOT)}:{block.line}"
                text = block.text.replace(MAKE_RUN_ADDRESS, bastion.base_url)
                assert "127.0.0.1:8765" not in text, f"{where}: name Bastion as {MAKE_RUN_ADDRESS}"
                if block.until is not None:
                    process = await anyio.open_process(
                        ["bash", "--noprofile", "--norc", "-euo", "pipefail", "-c", text],
                        cwd=checkout,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                    background = Background(process, where, Lines())
                    running_in_background.append(background)
                    tg.start_soon(_collect, process, background.lines)
                    try:
                        await background.lines.wait_for(functools.partial(_says, block.until), BLOCK_SECONDS)
                    except TimeoutError:
                        said = "\n".join(background.lines)
                        raise AssertionError(f"{where} never printed {block.until!r}:\n{said}") from None
                    continue
                if block.after_background:
                    for background in running_in_background:
                        await _ended(background)
                await shell.type(Block(text, block.line), where)
            for background in running_in_background:
                await _ended(background)
        finally:
            for background in running_in_background:
                await stop(background.process, group=True)
            tg.cancel_scope.cancel()
