"""`bastion approvals watch` in a real pseudo-terminal: keys in, decisions in the ledger, terminal restored.

The key handling and the view's states are also driven directly, key by key, without a terminal.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import struct
import subprocess
import termios
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import pytest
from rich.console import Console

from bastion.cli.compose import local_approver
from bastion.cli.watch import QUIT, Decision, KeyReader, LedgerFeed, WatchView
from bastion.config import load_config
from bastion.errors import Unauthenticated
from bastion.models import InvocationEvent, Status, utcnow
from tests.ledger_contract.samples import unsigned
from tests.processes import bastion_command, bastion_env, bastion_http, run_cli, stop
from tests.test_cli_approvals import DRIFT, create_token, make_config, make_invocation, open_ledger, record

ROWS, COLUMNS = 40, 160
WAIT = 60  # seconds: the bound of every wait on a terminal


class Terminal:
    """The master side of a pseudo-terminal: everything the program wrote, and a way to wait for text."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.screen = ""
        self._grew = anyio.Event()

    async def drain(self) -> None:
        """Read the program's output until it closes its side of the terminal."""
        while True:
            await anyio.wait_readable(self.master)
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every slave descriptor is closed, the program has exited
                return
            if not data:
                return
            self.screen += data.decode(errors="replace")
            self._grew.set()
            self._grew = anyio.Event()

    async def wait_for(self, text: str) -> None:
        """Wait until `text` appears in what the program wrote since the last key press."""
        while text not in self.screen[self._since :]:
            await self._grew.wait()

    def press(self, keys: bytes) -> None:
        self._since = len(self.screen)
        os.write(self.master, keys)

    _since = 0


@asynccontextmanager
async def watching(args: Sequence[str], env: dict[str, str]) -> AsyncIterator[tuple[Terminal, anyio.abc.Process]]:
    """`bastion approvals watch ARGS` on a fresh pseudo-terminal; always stopped, the terminal always closed."""
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    try:
        process = await anyio.open_process(
            bastion_command("approvals", "watch", *args),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            # The terminal's size, also where a program looks first (pytest-xdist's workers carry COLUMNS=80).
            env=env | {"COLUMNS": str(COLUMNS), "LINES": str(ROWS)},
            start_new_session=True,
        )
    finally:
        os.close(slave)
    terminal = Terminal(master)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(terminal.drain)
            yield terminal, process
            tg.cancel_scope.cancel()
        local_modes = termios.tcgetattr(master)[3]
        assert local_modes & termios.ICANON, "the terminal was left in cbreak mode"
        assert local_modes & termios.ECHO, "the terminal was left without echo"
    finally:
        await stop(process)
        os.close(master)


async def wait_for_status(config: Path, invocation_id: str, status: Status) -> list[InvocationEvent]:
    """Wait (unbounded: the caller bounds it) until the ledger shows the invocation in `status`."""
    async with open_ledger(config) as ledger, anyio.create_task_group() as tg:
        await tg.start(ledger.changes.run)
        while (invocation := await ledger.invocations.get(invocation_id)) is None or invocation.status != status:
            # A commit between the read and this wait is only noticed at the next one: re-read each second.
            with anyio.move_on_after(1):
                await ledger.changes.next(ledger.changes.cursor)
        events = await ledger.invocations.events(invocation_id)
        tg.cancel_scope.cancel()
    return events


async def status_of(config: Path, invocation_id: str) -> Status:
    async with open_ledger(config) as ledger:
        invocation = await ledger.invocations.get(invocation_id)
    assert invocation is not None
    return invocation.status


@pytest.mark.anyio
async def test_watch_details_the_selected_call_and_decides_only_after_a_reason_and_a_confirmation(
    tmp_path: Path,
) -> None:
    env = bastion_env(tmp_path / "home", TERM="xterm-256color", BASTION_PRINCIPAL="alice@example.com")
    config = make_config(tmp_path)
    older, newer = make_invocation(1), make_invocation(2, drift=DRIFT)
    await record(config, older, newer)

    async with watching(["--config", str(config)], env) as (terminal, process):
        with anyio.fail_after(WAIT):
            await terminal.wait_for(older.id)
            await terminal.wait_for(newer.id)
            # Newest first: the drifted call is selected, in detail with its redacted args and its diff.
            await terminal.wait_for('"api_token": "[REDACTED]"')
            await terminal.wait_for(DRIFT[-1])
            await terminal.wait_for("key notes:write_note")

            terminal.press(b"j")  # down to the older call
            await terminal.wait_for("in session session-1")
            terminal.press(b"d")
            await terminal.wait_for(f"deny {older.id} (notes__write_note): reason (optional):")
            terminal.press("not tod\x7fday ☂".encode())
            await terminal.wait_for("reason (optional): not today ☂")
            terminal.press(b"\r")
            await terminal.wait_for(f'deny {older.id} (notes__write_note) with reason "not today ☂"? [y/n]')
            assert await status_of(config, older.id) == "pending"
            terminal.press(b"y")
            denied = await wait_for_status(config, older.id, "denied")
            await terminal.wait_for(f"denied {older.id} (notes__write_note) as alice@example.com")

            terminal.press(b"k")  # back up to the newer one: approving asks for a note, then a confirmation
            await terminal.wait_for("in session session-2")
            terminal.press(b"a")
            await terminal.wait_for("note (optional)")
            terminal.press(b"\x1b")
            await terminal.wait_for("cancelled")
            terminal.press(b"a")
            await terminal.wait_for("note (optional)")
            terminal.press(b"\r")
            await terminal.wait_for(f"approve {newer.id} (notes__write_note)? [y/n]")
            terminal.press(b"n")
            await terminal.wait_for("cancelled")
            assert await status_of(config, newer.id) == "pending"
            terminal.press(b"a")
            await terminal.wait_for("note (optional)")
            terminal.press(b"looks fine\r")
            await terminal.wait_for('with note "looks fine"? [y/n]')
            terminal.press(b"y")
            approved = await wait_for_status(config, newer.id, "approved")
            await terminal.wait_for(f"approved {newer.id}")

            terminal.press(b"q")
            status = await process.wait()
        assert status == 0, terminal.screen
    assert unsigned(denied[-1].detail) == {"by": "alice@example.com", "reason": "not today ☂"}
    assert unsigned(approved[-1].detail) == {"by": "alice@example.com", "note": "looks fine", "scope": "once"}


@pytest.mark.anyio
async def test_watch_decides_on_a_remote_bastion_through_its_api(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home", TERM="xterm-256color")
    config = make_config(tmp_path)
    made = run_cli("tokens", "create", "alice", "--role", "admin", "--json", "--config", str(config), env=env)
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    waiting = make_invocation(1)
    await record(config, waiting)

    async with bastion_http(["--config", str(config)], env=env) as bastion:
        wrong = await anyio.run_process(
            bastion_command("approvals", "watch", "--url", bastion.base_url), env=env, check=False
        )
        assert wrong.returncode == 2  # --url without --token: named before any terminal is needed
        remote = ("--url", bastion.base_url, "--token", token, "--json")
        shown = await anyio.run_process(bastion_command("approvals", "show", waiting.id[:6], *remote), env=env)
        assert json.loads(shown.stdout)["id"] == waiting.id  # the API resolves an id prefix too

        remote_env = env | {"BASTION_URL": bastion.base_url, "BASTION_TOKEN": token}
        async with watching([], remote_env) as (terminal, process):
            with anyio.fail_after(WAIT):
                await terminal.wait_for(f"Bastion approvals: {bastion.base_url}")
                await terminal.wait_for(waiting.id)
                await terminal.wait_for('"api_token": "[REDACTED]"')
                terminal.press(b"d")
                await terminal.wait_for("reason (optional")
                terminal.press(b"not from here\r")
                await terminal.wait_for("[y/n]")
                terminal.press(b"y")
                denied = await wait_for_status(config, waiting.id, "denied")
                await terminal.wait_for(f"denied {waiting.id}")
                await terminal.wait_for("no pending invocations")
                terminal.press(b"q")
                assert await process.wait() == 0, terminal.screen
    assert unsigned(denied[-1].detail) == {"by": "alice", "reason": "not from here"}


@pytest.mark.anyio
async def test_watch_on_a_ledger_with_approver_tokens_needs_one_and_decides_as_its_holder(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home", TERM="xterm-256color", BASTION_PRINCIPAL="agent-said-so")
    config = make_config(tmp_path)
    admin = await create_token(config, "alice", "admin")
    waiting = make_invocation(1)
    await record(config, waiting)

    async with watching(["--config", str(config)], env) as (terminal, process):
        with anyio.fail_after(WAIT):
            assert await process.wait() == 1
            await terminal.wait_for("unauthenticated")
    assert waiting.id not in terminal.screen  # refused before the screen shows anything
    async with watching(["--config", str(config), "--token", admin], env) as (terminal, process):
        with anyio.fail_after(WAIT):
            await terminal.wait_for(waiting.id)
            terminal.press(b"a")
            await terminal.wait_for("note (optional)")
            terminal.press(b"\r")
            await terminal.wait_for("[y/n]")
            terminal.press(b"y")
            approved = await wait_for_status(config, waiting.id, "approved")
            await terminal.wait_for(f"approved {waiting.id} (notes__write_note) as alice")
            terminal.press(b"q")
            assert await process.wait() == 0, terminal.screen
    assert unsigned(approved[-1].detail) == {"by": "alice", "note": None, "scope": "once"}


def test_watch_without_a_terminal_exits_2_and_names_the_alternatives(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    watched = subprocess.run(
        bastion_command("approvals", "watch", "--config", str(config)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert watched.returncode == 2
    assert "terminal" in watched.stderr
    assert "bastion approvals approve" in watched.stderr


# -- keys and the view's states, without a terminal --------------------------------------------------


def test_key_reader_names_special_keys_and_decodes_typed_text_across_reads() -> None:
    reader = KeyReader()
    assert reader.keys(b"\x1b[A\x1bOBjk") == ["up", "down", "j", "k"]
    assert reader.keys(b"\x1b") == ["escape"]
    assert reader.keys(b"\x1b[1;5C\x01x\r\x7f") == ["x", "enter", "backspace"]  # Ctrl-Right and Ctrl-A skipped
    umbrella = "☂".encode()
    assert reader.keys(b"a" + umbrella[:1]) == ["a"]
    assert reader.keys(umbrella[1:] + b"\x04") == ["☂", "eof"]


def _view() -> WatchView:
    view = WatchView(where="test")
    view.update([make_invocation(2), make_invocation(1)])
    return view


def press(view: WatchView, *keys: str) -> list[Decision | str | None]:
    return [view.handle(key) for key in keys]


def test_denying_takes_an_optional_reason_then_a_confirmation() -> None:
    """A reason is optional on every surface (the REST API, the inbox, the approver MCP): here too."""
    view = _view()
    *_, decision = press(view, "j", "d", "enter", "y")
    assert decision == Decision(view.pending[1], approve=False, note=None)
    *_, decision = press(view, "d", "n", "o", "e", "backspace", "enter", "y")
    assert decision == Decision(view.pending[1], approve=False, note="no")
    assert view.prompt is None


def test_approving_takes_an_optional_note_and_can_be_cancelled_at_each_step() -> None:
    view = _view()
    assert press(view, "a", "escape") == [None, None]
    assert (view.prompt, view.status) == (None, "cancelled: nothing was decided")
    assert press(view, "a", "enter", "n") == [None, None, None]
    assert view.prompt is None
    *_, decision = press(view, "a", "enter", "x", "Y")  # keys other than y/n/Esc leave the question open
    assert decision == Decision(view.pending[0], approve=True, note=None)


def test_q_quits_only_outside_a_prompt_and_nothing_is_decided_without_a_selection() -> None:
    view = _view()
    assert press(view, "d", "q") == [None, None]
    assert view.prompt is not None
    assert view.prompt.text == "q"
    assert press(view, "escape", "q") == [None, QUIT]
    empty = WatchView(where="test")
    assert press(empty, "a") == [None]
    assert empty.prompt is None
    assert "nothing to decide" in empty.status


def test_a_small_terminal_shows_the_prompt_on_top_a_window_of_rows_and_whole_ids() -> None:
    invocations = [make_invocation(n, id=f"0190abcdef{n:02d}" + "9" * 12, drift=DRIFT) for n in range(9, 0, -1)]
    view = WatchView(where="test")
    view.update(invocations)
    press(view, *["j"] * 6, "d", "n", "o")
    console = Console(file=io.StringIO(), width=80, height=24, color_system=None)
    console.print(view.render(utcnow(), width=80, height=24))
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    selected = invocations[6].id
    assert lines[1] == f"deny {selected} (notes__write_note): reason (optional): no"
    assert "9 pending" in lines[3]
    assert any(line.startswith(selected) for line in lines)  # its row
    assert any(line.startswith(f"call        {selected}") for line in lines)  # the detail pane
    assert any(line.strip().endswith("of 9") for line in lines)
    assert invocations[0].id not in "\n".join(lines)  # scrolled out of the window
    assert len(lines) <= 24


@pytest.mark.anyio
async def test_a_local_watch_asks_again_who_decides_before_each_decision(tmp_path: Path) -> None:
    """Opened while the ledger had no approver token, it decided as the local owner; once a token exists it must
    be given one: the next decision is refused, and the call stays pending."""
    config_dir = make_config(tmp_path)
    await record(config_dir, make_invocation(1), make_invocation(2))
    config = load_config(config_dir)
    async with open_ledger(config_dir) as ledger:
        principal = await local_approver(ledger, config, None)
        feed = LedgerFeed(ledger, principal, "test", approver=partial(local_approver, ledger, config, None))
        decided = await feed.decide("inv-0001", approve=False, note=None)
        assert decided.status == "denied"
        await ledger.tokens.create_token("alice", role="admin", profile=None, now=utcnow())
        with pytest.raises(Unauthenticated):
            await feed.decide("inv-0002", approve=True, note=None)
        still = await ledger.invocations.get("inv-0002")
        assert still is not None and still.status == "pending"


@pytest.mark.anyio
async def test_watch_shows_the_preview_the_selected_call_was_held_with(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home", TERM="xterm-256color", BASTION_PRINCIPAL="alice@example.com")
    config = make_config(tmp_path)
    held = make_invocation(1)
    preview = {
        "kind": "diff",
        "summary": "write_note todo: 1 line(s) added, 1 removed",
        "text": "--- todo\n+++ todo\n@@ -1 +1 @@\n-buy milk\n+buy oat milk\n",
    }
    async with open_ledger(config) as ledger:
        await ledger.invocations.record(held, ["planned", "pending"], {"preview": preview})

    async with watching(["--config", str(config)], env) as (terminal, process):
        with anyio.fail_after(WAIT):
            await terminal.wait_for(held.id)
            await terminal.wait_for("write_note todo: 1 line(s) added, 1 removed")
            await terminal.wait_for("-buy milk")
            await terminal.wait_for("+buy oat milk")
            terminal.press(b"q")
            status = await process.wait()
        assert status == 0, terminal.screen
