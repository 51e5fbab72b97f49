"""`bastion approvals watch` in a real pseudo-terminal: keys in, decisions in the ledger, terminal restored."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import termios
from pathlib import Path

import anyio
import pytest

from bastion.models import InvocationEvent, Status
from tests.processes import bastion_command, bastion_env, stop
from tests.test_cli_approvals import make_config, make_invocation, open_ledger, record

ROWS, COLUMNS = 40, 160


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
        while text not in self.screen:
            await self._grew.wait()

    def press(self, keys: bytes) -> None:
        os.write(self.master, keys)


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


@pytest.mark.anyio
async def test_watch_decides_the_selected_invocation_with_key_presses(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home", TERM="xterm-256color", BASTION_PRINCIPAL="alice@example.com")
    config = make_config(tmp_path)
    older, newer = make_invocation(1), make_invocation(2)
    await record(config, older, newer)

    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    try:
        process = await anyio.open_process(
            bastion_command("approvals", "watch", "--config", str(config)),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
    finally:
        os.close(slave)
    terminal = Terminal(master)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(terminal.drain)
            with anyio.fail_after(60):
                await terminal.wait_for(older.id)
                await terminal.wait_for(newer.id)

                terminal.press(b"jd")  # newest first: move down to the older one and deny it
                denied = await wait_for_status(config, older.id, "denied")
                await terminal.wait_for(f"denied {older.id}")
                terminal.press(b"ka")  # back up to the newer one and approve it
                approved = await wait_for_status(config, newer.id, "approved")
                await terminal.wait_for(f"approved {newer.id}")

                terminal.press(b"q")
                status = await process.wait()
            tg.cancel_scope.cancel()
        assert status == 0, terminal.screen
        assert denied[-1].detail == {"by": "alice@example.com", "reason": "denied from bastion approvals watch"}
        assert approved[-1].detail == {"by": "alice@example.com", "note": None}
        local_modes = termios.tcgetattr(master)[3]
        assert local_modes & termios.ICANON, "the terminal was left in cbreak mode"
        assert local_modes & termios.ECHO, "the terminal was left without echo"
    finally:
        await stop(process)
        os.close(master)


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
