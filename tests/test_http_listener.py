"""The HTTP listener Bastion binds itself: Nagle off on every connection, and a port problem reported in one
line before anything starts."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from bastion.server.http import bind_listener
from tests.processes import bastion_env, run_cli, write_config


@pytest.mark.anyio
async def test_connections_accepted_on_the_listener_have_tcp_nodelay() -> None:
    """asyncio sets TCP_NODELAY only when the listening socket says IPPROTO_TCP; without it every
    streamable-HTTP response waits ~40 ms on the client's delayed ACK."""
    accepted = anyio.Event()
    flags: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            flags.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            accepted.set()

    listener = bind_listener("127.0.0.1", 0)
    server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
    try:
        async with await anyio.connect_tcp("127.0.0.1", listener.getsockname()[1]):
            with anyio.fail_after(5):
                await accepted.wait()
    finally:
        server.close()
        await server.wait_closed()
    assert flags
    assert flags[0] != 0


@pytest.fixture
def occupied_port() -> Iterator[int]:
    """A loopback port some other program listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


@pytest.mark.parametrize(
    ("host", "port"),
    [("127.0.0.1", "occupied"), ("127.0.0.1", "70000"), ("127.0.0.1", "-1"), ("no-such-host.invalid", "0")],
    ids=["in-use", "too-large", "negative", "unknown-host"],
)
def test_a_port_problem_is_one_line_and_exit_2_before_the_ledger_or_any_connector_starts(
    tmp_path: Path, occupied_port: int, host: str, port: str
) -> None:
    started = tmp_path / "connector-started"
    marker = f'command = "{sys.executable}"\nargs = ["-c", "open({str(started)!r}, \'w\')"]\n'
    config = write_config(
        tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False, extra_connectors={"m": marker}
    )
    port = str(occupied_port) if port == "occupied" else port
    done = run_cli(
        "serve", "--transport", "http", "--host", host, "--port", port, "--config", str(config),
        env=bastion_env(tmp_path / "home"),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "--port" in lines[0] or "--host" in lines[0]
    assert not started.exists()
    assert not (config / "state").exists()
