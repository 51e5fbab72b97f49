"""`bastion approvals watch`: a live view of pending invocations, decided with single key presses.

The view redraws whenever the ledger changes (in this or any other process) and once a second so the
expiry countdown moves. Keys are read in cbreak mode; the terminal's mode is restored on every exit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

import anyio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from bastion.cli.app import ConfigOption, Exit, approver_principal, load, open_ledger, run_async
from bastion.cli.approvals import approvals_app, pending_invocations, pending_table
from bastion.config import Config
from bastion.errors import BastionError
from bastion.ledger import SqliteLedger
from bastion.models import Invocation, utcnow

if sys.platform != "win32":
    import termios
    import tty

DENY_REASON: Final = "denied from bastion approvals watch"
HELP: Final = "up/down or j/k select   a approve   d deny   q quit"

# Arrow keys arrive as escape sequences: `ESC [ A` normally, `ESC O A` in application cursor mode.
_SEQUENCES: Final = (
    (b"\x1b[A", "up"),
    (b"\x1bOA", "up"),
    (b"\x1b[B", "down"),
    (b"\x1bOB", "down"),
    (b"k", "up"),
    (b"j", "down"),
    (b"a", "approve"),
    (b"d", "deny"),
    (b"q", "quit"),
    (b"Q", "quit"),
    (b"\x03", "quit"),  # Ctrl-C, should the terminal deliver it as a byte rather than as SIGINT
    (b"\x04", "quit"),  # Ctrl-D
)


def parse_keys(data: bytes) -> list[str]:
    """The key names in a chunk read from the terminal; other keys and escape sequences are skipped."""
    keys: list[str] = []
    i = 0
    while i < len(data):
        for sequence, name in _SEQUENCES:
            if data.startswith(sequence, i):
                keys.append(name)
                i += len(sequence)
                break
        else:
            i = _skip_escape(data, i) if data[i] == 0x1B else i + 1
    return keys


def _skip_escape(data: bytes, i: int) -> int:
    """The index after the escape sequence starting at `i` (CSI and SS3 end at a byte in 0x40-0x7e)."""
    if i + 1 < len(data) and data[i + 1] in b"[O":
        for j in range(i + 2, len(data)):
            if 0x40 <= data[j] <= 0x7E:
                return j + 1
        return len(data)
    return i + 1


@contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Keys one at a time, without echo, until exit; the terminal's previous mode is always restored."""
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd, termios.TCSANOW)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class Wakeup:
    """A level-triggered signal: `set` any number of times, `wait` returns once for all of them."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()


@dataclass
class WatchView:
    """What the screen shows: the pending invocations, the selected one and the last action's outcome."""

    where: str
    pending: list[Invocation] = field(default_factory=list)
    selected: str | None = None
    status: str = ""
    _index: int = field(default=0, init=False, repr=False)

    def update(self, pending: list[Invocation]) -> None:
        """Take a fresh list; the selection follows its invocation, or stays at its row when it left."""
        self.pending = pending
        ids = [i.id for i in pending]
        if self.selected in ids:
            self._index = ids.index(self.selected)
        self._index = max(0, min(self._index, len(ids) - 1))
        self.selected = ids[self._index] if ids else None

    def move(self, step: int) -> None:
        self._index = max(0, min(self._index + step, len(self.pending) - 1))
        self.selected = self.pending[self._index].id if self.pending else None

    def render(self) -> RenderableType:
        now = utcnow()
        header = Text(f"Bastion approvals: {self.where}   {now:%H:%M:%S} UTC", style="bold")
        body: RenderableType = pending_table(self.pending, now, width=120, selected=self.selected)
        if not self.pending:
            body = Text("no pending invocations; waiting for the next one")
        return Group(header, body, Text(self.status or " "), Text(HELP, style="dim"))


async def watch_approvals(config: Config, principal: str, fd: int, console: Console) -> None:
    """Run the live view until `q`, Ctrl-D or the end of input."""
    view = WatchView(where=str(config.ledger_url))
    wake = Wakeup()
    async with open_ledger(config) as ledger, anyio.create_task_group() as tg:

        async def follow_ledger() -> None:
            while True:
                await ledger.wait_for_change()
                wake.set()

        async def on_key(key: str) -> None:
            if key in ("up", "down"):
                view.move(-1 if key == "up" else 1)
            elif key in ("approve", "deny"):
                view.status = await _decide(ledger, view.selected, approve=key == "approve", principal=principal)
            wake.set()

        async def keys_then_quit() -> None:
            await read_keys(fd, on_key)
            tg.cancel_scope.cancel()

        await tg.start(ledger.watch)
        tg.start_soon(follow_ledger)
        with Live(console=console, auto_refresh=False, transient=False) as live:
            tg.start_soon(keys_then_quit)
            while True:
                view.update(await pending_invocations(ledger, utcnow()))
                live.update(view.render(), refresh=True)
                # Redraw on the next change, or at the next whole second for the countdown.
                with anyio.move_on_after(1 - utcnow().microsecond / 1_000_000):
                    await wake.wait()


async def read_keys(fd: int, on_key: Callable[[str], Awaitable[None]]) -> None:
    """Hand each key press to `on_key` until a quit key or the end of input."""
    while True:
        await anyio.wait_readable(fd)
        data = os.read(fd, 1024)
        if not data:
            return
        for key in parse_keys(data):
            if key == "quit":
                return
            await on_key(key)


async def _decide(ledger: SqliteLedger, invocation_id: str | None, *, approve: bool, principal: str) -> str:
    """Decide the selected invocation; the status line it leaves (the error class when refused)."""
    if invocation_id is None:
        return "nothing to decide: no pending invocation is selected"
    note = None if approve else DENY_REASON
    try:
        decided = await ledger.decide(invocation_id, approve=approve, principal=principal, note=note, now=utcnow())
    except BastionError as exc:
        return f"{exc.error_class}: {exc.message}"
    return f"{decided.status} {decided.id} ({decided.tool}) as {principal}"


@approvals_app.command("watch")
def approvals_watch(config_dir: ConfigOption = None) -> None:
    """A live view of pending invocations: select with up/down, `a` approve, `d` deny, `q` quit."""
    if sys.platform == "win32" or not sys.stdin.isatty():
        raise Exit(
            "error: approvals watch needs a terminal to read keys from (stdin is not a TTY); run it in a "
            "terminal, or decide from scripts with `bastion approvals approve ID` / `bastion approvals deny ID`",
            2,
        )
    config = load(config_dir, report=False)
    principal = approver_principal()
    fd = sys.stdin.fileno()
    try:
        with cbreak(fd):
            run_async(watch_approvals, config, principal, fd, Console())
    except KeyboardInterrupt:
        pass  # Ctrl-C quits, like `q`
