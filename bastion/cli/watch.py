"""`bastion approvals watch`: a live view of pending invocations, decided with key presses (the command is
declared in `bastion.cli.approvals`, which imports this module when it runs).

The view lists the pending calls and shows the selected one in detail: what it is, who asked, the time left,
its redacted args, its drift diff and the preview of what it would do. `a` asks for an optional note and `d` for an
optional reason, then each asks for confirmation before anything is decided. Locally the view redraws whenever the
ledger changes (in any process); with `--url` whenever the remote Bastion's event stream (`/api/events`) announces
something; and once a second anyway, so the countdowns move.
Keys are read in cbreak mode; the terminal's mode is restored on every exit.
"""

from __future__ import annotations

import codecs
import json
import os
import shlex
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Final, Protocol

import anyio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from bastion.cli.app import Exit, timestamp
from bastion.cli.approvals import format_seconds, pending_table, summaries
from bastion.cli.compose import load, local_approver, open_ledger, remote_or_local, run_async
from bastion.cli.pins import diff_text
from bastion.cli.remote import RemoteApi
from bastion.config import config_hint
from bastion.errors import BastionError, ChangesLost
from bastion.ledger import OpenLedger
from bastion.models import Invocation, Preview, Principal, utcnow
from bastion.pipeline import authority
from bastion.pipeline.documents import approvals_json, expires_in, pending_invocations
from bastion.pipeline.grants import Grants
from bastion.program import bastion_command
from bastion.terms import DEFAULT_LIMIT

if sys.platform != "win32":
    import termios
    import tty

BROWSE_HELP: Final = "up/down or j/k select   a approve   d deny   q quit"
TYPING_HELP: Final = "type, Backspace erases, Enter continues, Esc cancels"
CONFIRM_HELP: Final = "y confirms, n or Esc cancels"

# -- keys ---------------------------------------------------------------------------------------------

# Arrow keys arrive as escape sequences: `ESC [ A` normally, `ESC O A` in application cursor mode.
_SEQUENCES: Final = ((b"\x1b[A", "up"), (b"\x1bOA", "up"), (b"\x1b[B", "down"), (b"\x1bOB", "down"))
_CONTROLS: Final = {
    0x03: "interrupt",  # Ctrl-C, should the terminal deliver it as a byte rather than as SIGINT
    0x04: "eof",  # Ctrl-D
    0x0A: "enter",
    0x0D: "enter",
    0x08: "backspace",
    0x7F: "backspace",
    0x1B: "escape",
}


class KeyReader:
    """Turns what the terminal sends into keys: a special key's name (`up`, `enter`, ...) or one typed character.

    Typed text is decoded as UTF-8 across reads; other control bytes and escape sequences are skipped.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def keys(self, data: bytes) -> list[str]:
        keys: list[str] = []
        typed = bytearray()

        def flush() -> None:
            keys.extend(self._decoder.decode(bytes(typed)))
            typed.clear()

        i = 0
        while i < len(data):
            sequence = next((s for s in _SEQUENCES if data.startswith(s[0], i)), None)
            if sequence is not None:
                flush()
                keys.append(sequence[1])
                i += len(sequence[0])
            elif data[i] == 0x1B and i + 1 < len(data) and data[i + 1] in b"[O":
                flush()
                i = _skip_escape(data, i)
            elif data[i] in _CONTROLS:
                flush()
                keys.append(_CONTROLS[data[i]])
                i += 1
            else:
                if data[i] >= 0x20:
                    typed.append(data[i])
                i += 1
        flush()
        return keys


def _skip_escape(data: bytes, i: int) -> int:
    """The index after the CSI or SS3 escape sequence starting at `i` (it ends at a byte in 0x40-0x7e)."""
    for j in range(i + 2, len(data)):
        if 0x40 <= data[j] <= 0x7E:
            return j + 1
    return len(data)


@contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Keys one at a time, without echo, until exit; the terminal's previous mode is always restored."""
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd, termios.TCSANOW)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def read_keys(fd: int, on_key: Callable[[str], Awaitable[bool]]) -> None:
    """Hand each key to `on_key` until it answers True (quit) or input ends."""
    reader = KeyReader()
    while True:
        await anyio.wait_readable(fd)
        data = os.read(fd, 1024)
        if not data:
            return
        for key in reader.keys(data):
            if await on_key(key):
                return


# -- what the view shows and how keys change it -------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the approver confirmed: approve or deny this invocation, with this note or reason."""

    invocation: Invocation
    approve: bool
    note: str | None


QUIT: Final = "quit"


@dataclass
class Prompt:
    """A decision being prepared: the note or reason typed so far, then the confirmation."""

    invocation: Invocation
    approve: bool
    text: str = ""
    confirming: bool = False

    def line(self) -> str:
        target = f"{self.invocation.id} ({self.invocation.tool})"
        verb = "approve" if self.approve else "deny"
        if self.confirming:
            said = (
                f" with {'note' if self.approve else 'reason'} {json.dumps(self.text, ensure_ascii=False)}"
                if self.text
                else ""
            )
            return f"{verb} {target}{said}? [y/n]"
        asked = "note (optional)" if self.approve else "reason (optional)"
        return f"{verb} {target}: {asked}: {self.text}"


@dataclass
class WatchView:
    """The screen's state: the pending invocations, the selected one, a decision being prepared, the last outcome."""

    where: str
    hint: str = ""
    """What a printed `bastion ...` hint appends to reach the same ledger (` --config DIR`, ` --url URL`)."""
    pending: list[Invocation] = field(default_factory=list)
    approvals: dict[str, str] = field(default_factory=dict)
    """By invocation id: `1 of 2 approvals, by alice`, for a call that needs several approvers."""
    selected: str | None = None
    status: str = ""
    prompt: Prompt | None = None
    previews: dict[str, Preview] = field(default_factory=dict)
    """The preview each pending call was held with, by id."""
    _index: int = field(default=0, init=False, repr=False)

    def update(
        self,
        pending: list[Invocation],
        approvals: Mapping[str, str] | None = None,
        previews: Mapping[str, Preview] | None = None,
    ) -> None:
        """Take a fresh list (and, by id, the approvals so far of the calls that need several, and the previews the
        calls were held with); the selection follows its invocation, or stays at its row when it left."""
        self.pending = pending
        self.approvals = dict(approvals or {})
        self.previews = dict(previews or {})
        ids = [i.id for i in pending]
        if self.selected in ids:
            self._index = ids.index(self.selected)
        self._index = max(0, min(self._index, len(ids) - 1))
        self.selected = ids[self._index] if ids else None

    def move(self, step: int) -> None:
        self._index = max(0, min(self._index + step, len(self.pending) - 1))
        self.selected = self.pending[self._index].id if self.pending else None

    def handle(self, key: str) -> Decision | str | None:
        """Apply one key: a confirmed Decision to carry out, QUIT, or None (the view changed, or nothing did)."""
        if self.prompt is None:
            return self._browse(key)
        if self.prompt.confirming:
            return self._confirm(self.prompt, key)
        self._type(self.prompt, key)
        return None

    def _browse(self, key: str) -> str | None:
        if key in ("q", "Q", "eof", "interrupt"):
            return QUIT
        if key in ("up", "k", "down", "j"):
            self.move(-1 if key in ("up", "k") else 1)
        elif key in ("a", "d"):
            chosen = next((i for i in self.pending if i.id == self.selected), None)
            if chosen is None:
                self.status = "nothing to decide: no pending invocation is selected"
            else:
                self.prompt = Prompt(chosen, approve=key == "a")
                self.status = ""
        return None

    def _type(self, prompt: Prompt, key: str) -> None:
        if key in ("escape", "eof", "interrupt"):
            self._cancel()
        elif key == "backspace":
            prompt.text = prompt.text[:-1]
        elif key == "enter":
            prompt.text = prompt.text.strip()
            prompt.confirming = True
            self.status = ""
        elif len(key) == 1:
            prompt.text += key

    def _confirm(self, prompt: Prompt, key: str) -> Decision | None:
        if key in ("y", "Y"):
            self.prompt = None
            return Decision(prompt.invocation, prompt.approve, prompt.text or None)
        if key in ("n", "N", "escape", "eof", "interrupt"):
            self._cancel()
        return None

    def _cancel(self) -> None:
        self.prompt = None
        self.status = "cancelled: nothing was decided"

    def render(self, now: datetime, *, width: int, height: int) -> RenderableType:
        # The prompt and the status sit at the top: whatever does not fit the terminal is cut from the bottom.
        top = [Text(f"Bastion approvals: {self.where}   {now:%H:%M:%S} UTC", style="bold")]
        if self.prompt is not None:
            top.append(Text(self.prompt.line(), style="bold"))
        top.append(Text(self.status or " "))
        help_text = BROWSE_HELP if self.prompt is None else CONFIRM_HELP if self.prompt.confirming else TYPING_HELP
        if not self.pending:
            return Group(*top, Text("no pending invocations; waiting for the next one"), Text(help_text, style="dim"))
        rows = max(3, (height - 12) // 3)
        first = max(0, min(self._index - rows // 2, len(self.pending) - rows))
        shown = self.pending[first : first + rows]
        table = pending_table(
            shown, now, width=width, selected=self.selected, total=len(self.pending), approvals=self.approvals
        )
        if len(shown) < len(self.pending):
            table.caption = f"{first + 1}-{first + len(shown)} of {len(self.pending)}"
        selected = self.pending[self._index]
        room = max(4, height - len(shown) - 13)
        pane = detail_pane(selected, now, room, self.hint, self.previews.get(selected.id))
        return Group(*top, table, pane, Text(help_text, style="dim"))


def detail_pane(
    invocation: Invocation, now: datetime, room: int, where: str = "", preview: Preview | None = None
) -> Table:
    """The selected invocation in detail, its args, drift diff and preview cut to about `room` lines; `where` is
    what the hint to see the rest appends to reach the same ledger (` --config DIR`, or ` --url URL`)."""
    grid = Table(show_header=False, box=None, pad_edge=False)
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    mode = f"{invocation.mode} (from {invocation.mode_source})"
    grid.add_row("call", Text(f"{invocation.id}   {invocation.tool}   key {invocation.policy_key}"))
    grid.add_row("policy", Text(f"risk {invocation.risk}   mode {mode}"))
    who = f"{invocation.principal or 'anonymous'} in session {invocation.session_id}"
    grid.add_row("asked by", Text(f"{who}, {timestamp(invocation.created_at)} UTC"))
    grid.add_row("expires in", Text(format_seconds(expires_in(invocation, now))))
    more = f"bastion approvals show {invocation.id}{where}"
    args = json.dumps(invocation.args, indent=2, ensure_ascii=False).splitlines()
    drift = invocation.drift or []
    shown = preview.text.splitlines() if preview is not None else []
    args_room = max(2, room // (1 + bool(drift) + bool(preview)))
    grid.add_row("args", Text("\n".join(_cut(args, args_room, more))))
    if drift:
        grid.add_row("drift", diff_text(_cut(drift, max(2, args_room), more)))
    if preview is not None:
        grid.add_row("preview", Text(preview.summary, style="bold"))
        if shown:
            left = max(2, room - args_room * (1 + bool(drift)) - 1)
            grid.add_row(
                "",
                diff_text(_cut(shown, left, more))
                if preview.kind == "diff"
                else Text("\n".join(_cut(shown, left, more))),
            )
    return grid


def _cut(lines: list[str], room: int, more: str) -> list[str]:
    if len(lines) <= room:
        return lines
    return [*lines[: room - 1], f"... {len(lines) - room + 1} more lines: {more}"]


# -- where the invocations come from ------------------------------------------------------------------


class Wakeup:
    """A level-triggered signal: `set` any number of times, `wait` returns once for all of them."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()


class Feed(Protocol):
    """Where the pending invocations come from and where decisions go: the local ledger, or a remote API."""

    where: str
    hint: str
    """What a printed `bastion ...` hint appends to reach the same ledger (` --config DIR`, ` --url URL`)."""
    actor: str
    """Who the decisions are recorded as, for the status line."""

    async def pending(self) -> list[dict[str, Any]]:
        """The pending invocations as approvers see them (`bastion.pipeline.documents.pending_json`)."""
        ...

    async def decide(self, invocation_id: str, *, approve: bool, note: str | None) -> Invocation: ...

    async def follow(self, wake: Wakeup) -> None:
        """Until cancelled, `wake.set()` whenever the pending invocations may have changed."""
        ...


class LedgerFeed:
    """The local ledger; decisions as the local approver, through the same authority checks as everywhere.

    The approver is asked again (`approver`) before each decision, not only when the screen opened: a watch opened
    while the ledger had no approver token must not go on deciding as the local owner once one exists."""

    def __init__(
        self,
        ledger: OpenLedger,
        principal: Principal,
        where: str,
        hint: str = "",
        *,
        approver: Callable[[], Awaitable[Principal]] | None = None,
    ) -> None:
        self.ledger = ledger
        self.principal = principal
        self.where = where
        self.hint = hint
        self.actor = principal.name
        self._approver = approver

    async def pending(self) -> list[dict[str, Any]]:
        found = await pending_invocations(self.ledger.invocations, utcnow())
        return await approvals_json(
            self.ledger.invocations, found, utcnow(), Grants(self.ledger.grants, always_days=None)
        )

    async def decide(self, invocation_id: str, *, approve: bool, note: str | None) -> Invocation:
        if self._approver is not None:
            self.principal = await self._approver()  # raises when this watch may no longer decide
            self.actor = self.principal.name
        return await authority.decide(
            self.ledger, invocation_id, approve=approve, principal=self.principal, note=note, now=utcnow()
        )

    async def follow(self, wake: Wakeup) -> None:
        feed = self.ledger.changes
        async with anyio.create_task_group() as tg:
            await tg.start(feed.run)
            cursor = feed.cursor
            while True:
                try:
                    cursor = (await feed.next(cursor))[-1].id
                except ChangesLost:
                    cursor = feed.cursor
                wake.set()


class ApiFeed:
    """A remote Bastion's REST API; the view redraws on each event of its stream (`/api/events`), and once a
    second anyway."""

    def __init__(self, api: RemoteApi) -> None:
        self.api = api
        self.where = api.base
        self.hint = f" --url {shlex.quote(api.base)}"
        self.actor = "your token"

    async def pending(self) -> list[dict[str, Any]]:
        return await self.api.pending(DEFAULT_LIMIT)

    async def decide(self, invocation_id: str, *, approve: bool, note: str | None) -> Invocation:
        return Invocation.model_validate(await self.api.decide(invocation_id, approve=approve, note=note))

    async def follow(self, wake: Wakeup) -> None:
        async for _ in self.api.events():
            wake.set()
        await anyio.sleep_forever()  # an older Bastion without an event stream: the once-a-second redraw asks


# -- the live view ------------------------------------------------------------------------------------


async def watch_approvals(feed: Feed, fd: int, console: Console) -> None:
    """Run the live view until `q`, Ctrl-D or the end of input; a failure to fetch is shown, then retried."""
    view = WatchView(where=feed.where, hint=feed.hint)
    view.update(*_rows(await feed.pending()))  # a wrong URL or token fails here, before the screen is taken
    wake = Wakeup()
    async with anyio.create_task_group() as tg:

        async def on_key(key: str) -> bool:
            action = view.handle(key)
            if isinstance(action, Decision):
                view.status = await _carry_out(feed, action)
            wake.set()
            return action == QUIT

        async def keys_then_quit() -> None:
            await read_keys(fd, on_key)
            tg.cancel_scope.cancel()

        tg.start_soon(feed.follow, wake)
        with Live(console=console, auto_refresh=False, transient=False, vertical_overflow="crop") as live:
            tg.start_soon(keys_then_quit)
            while True:
                try:
                    view.update(*_rows(await feed.pending()))
                except BastionError as exc:
                    view.status = f"{exc.error_class}: {exc.message} (retrying)"
                now = utcnow()
                live.update(view.render(now, width=console.width, height=console.height), refresh=True)
                # Redraw on the next change, or at the next whole second for the countdown.
                with anyio.move_on_after(1 - now.microsecond / 1_000_000):
                    await wake.wait()


def _rows(rows: list[dict[str, Any]]) -> tuple[list[Invocation], dict[str, str], dict[str, Preview]]:
    """The pending invocations of `rows`, the approvals so far of those that need several, and their previews."""
    previews = {str(row["id"]): Preview.model_validate(row["preview"]) for row in rows if row.get("preview")}
    return [Invocation.model_validate(row) for row in rows], summaries(rows), previews


async def _carry_out(feed: Feed, decision: Decision) -> str:
    """Send a confirmed decision; the status line it leaves (the error class when refused)."""
    try:
        decided = await feed.decide(decision.invocation.id, approve=decision.approve, note=decision.note)
    except BastionError as exc:
        return f"{exc.error_class}: {exc.message}"
    if decided.status == "pending":  # one approval of a call that needs several: it waits for another approver
        return f"approval recorded for {decided.id} ({decided.tool}) as {feed.actor}; it waits for another approver"
    return f"{decided.status} {decided.id} ({decided.tool}) as {feed.actor}"


def watch_in_terminal(config_dir: Path | None, url: str | None, token: str | None) -> None:
    """`bastion approvals watch`: the live view on this terminal, of the local ledger or (`url`) a remote Bastion."""
    api = remote_or_local(url, token)
    if sys.platform == "win32" or not sys.stdin.isatty():
        where = f" --url {shlex.quote(api.base)}" if api is not None else config_hint(load(config_dir, report=False))
        raise Exit(
            "error: approvals watch needs a terminal to read keys from (stdin is not a TTY); run it in a "
            f"terminal, or decide from scripts with `{bastion_command()} approvals approve ID{where}` / "
            f"`{bastion_command()} approvals deny ID{where}`",
            2,
        )
    fd = sys.stdin.fileno()
    if api is not None:
        client = api

        async def remotely() -> None:
            async with client:
                await watch_approvals(ApiFeed(client), fd, Console())

        run = remotely
    else:
        config = load(config_dir, report=False)

        async def locally() -> None:
            async with open_ledger(config) as ledger:
                principal = await local_approver(ledger, config, token)  # refused before the screen is taken
                feed = LedgerFeed(
                    ledger,
                    principal,
                    config.ledger_display,
                    config_hint(config),
                    approver=partial(local_approver, ledger, config, token),
                )
                await watch_approvals(feed, fd, Console())

        run = locally
    try:
        with cbreak(fd):
            run_async(run)
    except KeyboardInterrupt:
        pass  # Ctrl-C quits, like `q`
