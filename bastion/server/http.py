"""The HTTP surface (DESIGN.md §10): `/mcp` streamable HTTP, `/sse` + `/messages/` legacy SSE, the approver
API under `/api`, `/healthz`.

Every request passes the Host/Origin guard first (DNS-rebinding protection), then bearer-token
authentication (bastion.server.auth), then routing.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from bastion import __version__
from bastion.errors import ConfigError
from bastion.models import SourceStatus
from bastion.server.api import build_api, routing_error
from bastion.server.auth import BearerAuth
from bastion.server.mcp import FrontDoor

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HostOriginGuard:
    """Refuse requests whose Host or Origin names a host we do not serve (DNS-rebinding protection)."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.allowed_hosts = frozenset(h.lower().strip("[]") for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            host = headers.get("host")
            origin = headers.get("origin")
            if host is None or _hostname(f"//{host}") not in self.allowed_hosts:
                response = PlainTextResponse(f"Host {host!r} is not served here", status_code=421)
                await response(scope, receive, send)
                return
            if origin is not None and origin != "null" and _hostname(origin) not in self.allowed_hosts:
                response = PlainTextResponse(f"Origin {origin!r} is not allowed", status_code=403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _hostname(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


class _SseEndpoint:
    """GET /sse: one legacy SSE connection, served until the host goes away."""

    def __init__(self, front: FrontDoor, transport: SseServerTransport) -> None:
        self.front = front
        self.transport = transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = self.front.server
        async with self.transport.connect_sse(scope, receive, send) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


def health(statuses: Iterable[SourceStatus]) -> str:
    """`ok` when every enabled source is ready, `degraded` when one is starting or down.

    Degraded is still HTTP 200: Bastion serves the ready sources' tools and every approval, and a load
    balancer that took it out of rotation would cut those off without helping (the other instances have the
    same connectors). Monitoring reads `status`, and `sources` says which one is not ready.
    """
    return "degraded" if any(s.state not in ("ready", "disabled") for s in statuses) else "ok"


def build_app(front: FrontDoor, *, allowed_hosts: Iterable[str], non_loopback: bool = False) -> ASGIApp:
    """The Starlette application behind `bastion serve --transport http`.

    `non_loopback` (the server listens beyond loopback) makes a token compulsory on `/mcp` and `/sse`
    even while the ledger holds none; otherwise they are open to anonymous local hosts until the first
    token is created. `/api` always needs one.
    """
    manager = StreamableHTTPSessionManager(app=front.server, json_response=False, stateless=False)
    sse = SseServerTransport("/messages/")

    async def healthz(request: Request) -> Response:
        """200 while Bastion serves: `ok` when every enabled source is ready, else `degraded` (see `health`)."""
        gateway = front.gateway
        statuses = gateway.statuses()
        sources: list[dict[str, Any]] = [{"id": s.source_id, "state": s.state, "tools": s.tools} for s in statuses]
        return JSONResponse(
            {"status": health(statuses), "version": __version__, "tools": len(gateway.tools), "sources": sources}
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = Starlette(
        routes=[
            Route("/mcp", endpoint=StreamableHTTPASGIApp(manager)),
            Route("/sse", endpoint=_SseEndpoint(front, sse), methods=["GET"]),
            Mount("/messages/", app=sse.handle_post_message),
            Route("/healthz", endpoint=healthz, methods=["GET"]),
            Mount("/api", app=build_api(front.gateway.ledger)),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: routing_error},
    )
    return HostOriginGuard(BearerAuth(app, front.gateway.ledger, tokens_required=non_loopback), allowed_hosts)


def allowed_hosts_for(bind_host: str, extra: Iterable[str] = ()) -> set[str]:
    """Loopback names always; the bound address too when it is a real one."""
    hosts = set(LOOPBACK_NAMES) | set(extra)
    if bind_host not in ("0.0.0.0", "::", ""):
        hosts.add(bind_host)
    return hosts


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket for uvicorn, bound before anyone is told the address (`port=0`: any free one).

    IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol says TCP.
    Without it, Nagle holds each response body behind its headers until the client's delayed ACK,
    about 40 ms per request on a kept-alive connection.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_http(
    front: FrontDoor,
    *,
    host: str,
    port: int,
    on_ready: Callable[[str], None] | None = None,
    extra_hosts: Iterable[str] = (),
) -> None:
    """Serve until interrupted (uvicorn handles SIGINT/SIGTERM).

    The socket is bound before `on_ready` is called with the base URL, so a caller that reads it
    (a person, a test, a supervisor) can connect at once; `port=0` picks a free port. Binding beyond
    loopback is refused (ConfigError) while the ledger holds no active token (DESIGN.md §10).
    """
    non_loopback = not is_loopback(host)
    if non_loopback and not await front.gateway.ledger.has_tokens():
        raise ConfigError(
            f"refusing to serve on {host} without tokens: anyone who can reach it could call tools and decide. "
            "Create one first with `bastion tokens create NAME --role admin`, or bind to 127.0.0.1."
        )
    app = build_app(front, allowed_hosts=allowed_hosts_for(host, extra_hosts), non_loopback=non_loopback)
    sock = bind_listener(host, port)
    family = sock.family
    try:
        bound_port = sock.getsockname()[1]
        if on_ready is not None:
            on_ready(f"http://{f'[{host}]' if family == socket.AF_INET6 else host}:{bound_port}")
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()
