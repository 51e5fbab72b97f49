"""The HTTP surface: `/mcp` streamable HTTP, `/sse` + `/messages/` legacy SSE, the approver
API under `/api` (its event stream `/api/events`), the approvers' MCP endpoint `/approver/mcp`, the approvers'
web page `/inbox`, `/healthz`.

Every request passes the Host/Origin guard first (DNS-rebinding protection), then bearer-token
authentication (bastion.server.auth), then routing.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict
from functools import lru_cache
from typing import Any, Final
from urllib.parse import urlsplit

import anyio
import uvicorn
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from sse_starlette.sse import AppStatus
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from bastion import __version__
from bastion.config import LOOPBACK_NAMES, config_hint, host_name, is_loopback
from bastion.errors import BastionError, ConfigError, HostNotAllowed, OriginNotAllowed
from bastion.ledger import guarantee_of
from bastion.models import SourceStatus
from bastion.pipeline.seams import TokenStore
from bastion.program import bastion_command
from bastion.server.api import build_api
from bastion.server.approver import APPROVER_PATH, ApproverEndpoint
from bastion.server.auth import BearerAuth
from bastion.server.errors import http_response
from bastion.server.events import events_endpoint
from bastion.server.express import ExpressCounts
from bastion.server.express_http import HttpExpressLane
from bastion.server.inbox import Inbox
from bastion.server.limits import BodyLimits, StreamSlots
from bastion.server.mcp import HostServer
from bastion.server.metrics import METRICS_PATH, Metrics
from bastion.server.rest import routing_error

logger = logging.getLogger(__name__)

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
"""Bind addresses that listen on every address of the machine."""

STREAMS_CLOSE_TIMEOUT: Final = 3
"""Seconds connections get to close when serving stops before uvicorn cancels what is left."""
FORCED_LIFESPAN_END: Final = 2.0
"""Seconds the app's lifespan gets to end when serving is stopped at once (a second signal)."""

_NAMES_KEPT: Final = 256
"""How many Host and Origin values the request guard keeps parsed."""


async def require_tokens_beyond_loopback(host: str, tokens: TokenStore, config_option: str = "") -> None:
    """Refuse (ConfigError) to serve on a non-loopback `host` while the ledger holds no active token: anyone who
    could reach it could call tools and decide. `bastion serve` asks before starting anything;
    `serve_http` asks again for every other caller."""
    if not is_loopback(host) and not await tokens.has_tokens():
        raise ConfigError(
            f"refusing to serve on {host} without tokens: anyone who can reach it could call tools and decide. "
            f"Create one first with `{bastion_command()} tokens create NAME --role admin{config_option}` (and agent "
            "tokens for hosts), or bind to 127.0.0.1."
        )


class AllowedHosts:
    """The names and addresses hosts may reach Bastion by: the Host and Origin check against DNS rebinding.

    A rebinding attack points a name the attacker controls at Bastion's address, so that a web page of theirs
    calls Bastion from a browser that can reach it: the request then carries the attacker's name in Host (and
    Origin). So names are served only when listed (loopback names always, the bound address, `[server]
    allowed_hosts`, `serve --allowed-host`), while an IP address cannot have been rebound: loopback addresses
    are always served, and every IP address once Bastion listens beyond loopback (where tokens are required).
    Ports are not checked.
    """

    def __init__(self, bind_host: str, names: Iterable[str] = ()) -> None:
        self.names = frozenset({*(host_name(n) for n in LOOPBACK_NAMES), *(host_name(n) for n in names)})
        self.any_address = not is_loopback(bind_host)
        if bind_host not in WILDCARD_HOSTS:
            try:
                self.names |= {host_name(bind_host)}
            except ValueError:
                logger.debug("the bound host %r is not a host name; not added to the allowed hosts", bind_host)

    def allows(self, host: str) -> bool:
        """Whether `host` (a hostname as `hostname_of` gives it, no port) is served."""
        if host in self.names:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return address.is_loopback or self.any_address


class HostOriginGuard:
    """Refuse requests whose Host or Origin names a host we do not serve (`AllowedHosts`): 421 and 403."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(Headers(scope=scope))
            if refusal is not None:
                logger.info("refused an HTTP request to %s: %s", scope["path"], refusal.message)
                await http_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, headers: Headers) -> BastionError | None:
        host = headers.get("host")
        if host is None:
            return HostNotAllowed("a request without a Host header is not served; send one")
        name = _host_header_name(host)
        if not self.allowed.allows(name):
            fix = f"--allowed-host {name}" if name else "--allowed-host NAME"
            return HostNotAllowed(
                f"Host {host!r} is not served here (DNS-rebinding protection); if this Bastion is reached by that "
                f"name, add it to [server] allowed_hosts in bastion.toml, or pass {fix} to bastion serve"
            )
        origin = headers.get("origin")
        if origin is not None and origin != "null" and not self.allowed.allows(hostname_of(origin)):
            return OriginNotAllowed(
                f"Origin {origin!r} is not allowed: a web page of another site may not call Bastion (DNS-rebinding "
                "protection); if the page is yours, add its host name to [server] allowed_hosts in bastion.toml"
            )
        return None


@lru_cache(maxsize=_NAMES_KEPT)
def hostname_of(url: str) -> str:
    """The host of a URL (an Origin) as `AllowedHosts` compares it; "" when there is none. Kept for the values
    seen last: every request of a host sends the same ones."""
    try:
        return _comparable((urlsplit(url).hostname or "").rstrip("."))
    except ValueError:
        return ""


@lru_cache(maxsize=_NAMES_KEPT)
def _host_header_name(value: str) -> str:
    """The host of a Host header, which is `host` or `host:port` and nothing else ("" then); kept, as `hostname_of`."""
    try:
        parts = urlsplit(f"//{value}")
        _ = parts.port  # reading it checks that the port is a number
    except ValueError:
        return ""
    if parts.username is not None or parts.password is not None or parts.path or parts.query or parts.fragment:
        return ""
    return _comparable((parts.hostname or "").rstrip("."))


def _comparable(host: str) -> str:
    """A host name as found (urlsplit lowers it), or an IP address in its usual form."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


class _SseEndpoint:
    """GET /sse: one legacy SSE connection, served until the host goes away."""

    def __init__(self, front: HostServer, transport: SseServerTransport) -> None:
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


def build_app(front: HostServer, *, allowed_hosts: AllowedHosts, non_loopback: bool = False) -> ASGIApp:
    """The Starlette application behind `bastion serve --transport http`.

    `non_loopback` (the server listens beyond loopback) makes a token compulsory on `/mcp` and `/sse`
    even while the ledger holds none; otherwise they are open to anonymous local hosts until the first
    token is created. `/api` always needs one. Plain allowed calls of 2026-07-28 hosts take the express lane
    (bastion.server.express) unless `[server] express_lane = false`.
    """
    manager = StreamableHTTPSessionManager(app=front.server, json_response=False, stateless=False)
    express = ExpressCounts()
    sse = SseServerTransport("/messages/")
    approver = ApproverEndpoint(front.gateway)
    streams = StreamSlots()
    inbox = Inbox(front.gateway, slots=streams)
    metrics = Metrics(front.gateway, express)

    async def healthz(request: Request) -> Response:
        """200 while Bastion serves: `ok` when every enabled source is ready, else `degraded` (see `health`)."""
        gateway = front.gateway
        statuses = gateway.statuses()
        sources: list[dict[str, Any]] = [{"id": s.source_id, "state": s.state, "tools": s.tools} for s in statuses]
        guarantee = asdict(guarantee_of(gateway.config.ledger_url))
        return JSONResponse(
            {
                "status": health(statuses),
                "version": __version__,
                "tools": len(gateway.tools),
                "sources": sources,
                "guarantee": guarantee,
            }
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run(), approver.running(), anyio.create_task_group() as watching:
            await watching.start(auth.watch_tokens)
            yield
            watching.cancel_scope.cancel()

    app = Starlette(
        routes=[
            Route("/mcp", endpoint=StreamableHTTPASGIApp(manager)),
            Route(APPROVER_PATH, endpoint=approver),
            Route("/sse", endpoint=_SseEndpoint(front, sse), methods=["GET"]),
            Mount("/messages/", app=sse.handle_post_message),
            Route("/healthz", endpoint=healthz, methods=["GET"]),
            Route(METRICS_PATH, endpoint=metrics.endpoint, methods=["GET"]),
            Route("/api/events", endpoint=events_endpoint(front.gateway.ledger, streams), methods=["GET"]),
            Mount(
                "/api", app=build_api(front.gateway.ledger, front.gateway.grants, front.gateway.listings.sources.get)
            ),
            *inbox.routes(),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPException: routing_error},
    )
    served: ASGIApp = app
    if front.gateway.config.settings.server.express_lane:
        # In front of the routing: a call the lane answers costs no Starlette request, route or middleware.
        served = HttpExpressLane(app, front, manager, express, path="/mcp")
    auth = BearerAuth(served, front.gateway.ledger.tokens, tokens_required=non_loopback)  # its watch runs in `lifespan`
    return HostOriginGuard(BodyLimits(auth), allowed_hosts)


def allowed_hosts_for(bind_host: str, extra: Iterable[str] = ()) -> AllowedHosts:
    """What a server bound to `bind_host` answers to, `extra` names included (see `AllowedHosts`)."""
    return AllowedHosts(bind_host, extra)


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


def listener_problem(host: str, port: int, exc: OSError | OverflowError) -> str:
    """What went wrong binding `host`:`port`, in one line that names the fix (for `bastion serve`)."""
    if isinstance(exc, OverflowError):
        return f"--port {port} is not a TCP port; pass one from 1 to 65535 (or 0 for any free one)"
    if isinstance(exc, socket.gaierror):
        return f"--host {host} is not an address of this machine ({exc.strerror}); pass one, such as 127.0.0.1"
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use (another Bastion?); stop it or pass another --port"
    if exc.errno == errno.EACCES:
        return f"port {port} on {host} needs privileges this user does not have; pass a --port above 1023"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine; pass one of its addresses, such as 127.0.0.1"
    return f"cannot listen on {host} port {port} ({exc.strerror or exc}); pass another --host or --port"


async def serve_http(
    front: HostServer,
    *,
    host: str,
    port: int,
    on_ready: Callable[[str], None] | None = None,
    extra_hosts: Iterable[str] = (),
    listener: socket.socket | None = None,
    stop: anyio.Event | None = None,
) -> None:
    """Serve until `stop` is set, or without one until interrupted (uvicorn then handles SIGINT/SIGTERM).

    The socket is bound before `on_ready` is called with the base URL, so a caller that reads it
    (a person, a test, a supervisor) can connect at once; `port=0` picks a free port. A caller that
    bound `listener` itself (`bastion serve`, before starting anything) passes it, and it is closed here.
    Binding beyond loopback is refused (ConfigError) while the ledger holds no active token.

    A caller that passes `stop` owns the signals (`bastion serve` lets running calls finish first). When it
    is set, the listener closes, open event streams end, connections get `STREAMS_CLOSE_TIMEOUT` seconds
    to close, and the MCP sessions end.
    """
    non_loopback = not is_loopback(host)
    try:
        await require_tokens_beyond_loopback(host, front.gateway.ledger.tokens, config_hint(front.gateway.config))
    except ConfigError:
        if listener is not None:
            listener.close()
        raise
    app = build_app(front, allowed_hosts=allowed_hosts_for(host, extra_hosts), non_loopback=non_loopback)
    sock = listener if listener is not None else bind_listener(host, port)
    family = sock.family
    try:
        bound_port = sock.getsockname()[1]
        if on_ready is not None:
            on_ready(f"http://{f'[{host}]' if family == socket.AF_INET6 else host}:{bound_port}")
        # log_config=None: uvicorn's loggers propagate to the handler the CLI set up (redacting) instead of its own.
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,
            lifespan="on",
            access_log=False,
            timeout_graceful_shutdown=STREAMS_CLOSE_TIMEOUT,
        )
        if stop is None:
            await uvicorn.Server(config).serve(sockets=[sock])
        else:
            await _serve_until(_Server(config), sock, stop, front)
    finally:
        sock.close()


class _Server(uvicorn.Server):
    """uvicorn without signal handlers of its own (it would also re-raise the signal once stopped: exit 143)."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _EndedStreams(logging.Filter):
    """Drops uvicorn's complaint about the SSE responses that sse-starlette ends without a last chunk once
    serving stops: Bastion ended them on purpose, so the line would only alarm whoever stopped it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "ASGI callable returned without completing response."


async def _serve_until(server: _Server, sock: socket.socket, stop: anyio.Event, front: HostServer) -> None:
    uvicorn_log = logging.getLogger("uvicorn.error")
    ended = _EndedStreams()

    async def shut_down() -> None:
        await stop.wait()
        # Long-lived responses end first, so connections can close: 2026-07-28 listen streams, and the SDK's
        # SSE responses (sse-starlette ends them when this is set; uvicorn's signal handler would set it).
        uvicorn_log.addFilter(ended)
        front.end_streams()
        AppStatus.should_exit = True
        server.should_exit = True

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(shut_down)
            await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    except anyio.get_cancelled_exc_class():
        # Stopped at once (`bastion serve`'s second signal): uvicorn leaves the app's lifespan (the MCP sessions'
        # manager, the approver endpoint) running in a task of its own, which the loop's end would cancel and
        # uvicorn report as a failed shutdown, traceback and all. End it here, briefly.
        if server.started:
            with anyio.CancelScope(shield=True), anyio.move_on_after(FORCED_LIFESPAN_END):
                await server.lifespan.shutdown()
        raise
    finally:
        AppStatus.should_exit = False  # a process-wide flag: another server in this process starts afresh
        uvicorn_log.removeFilter(ended)
