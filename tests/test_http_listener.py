"""The HTTP listener Bastion binds itself must still get Nagle turned off on every connection."""

from __future__ import annotations

import asyncio
import socket

import anyio
import pytest

from bastion.server.http import bind_listener

pytestmark = pytest.mark.anyio


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
