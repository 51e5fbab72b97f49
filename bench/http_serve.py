"""Serve the demo notes server or Bastion over streamable HTTP on a chosen ASGI server, HTTP parser and event loop.

Bench-only: bench/http_stack.py compares server stacks with it, and bench/throughput.py serves the direct demo
server with it on the stack `bastion serve` uses, so that no target gets a faster loop just because the bench
environment has uvloop installed (`uvicorn.run`, which the demo server's own `main` calls, would pick it).

- `demo`: the demo notes server's app, built as `python -m bastion.demo.notes --transport http` builds it
  (`create_server(NoteStore(notes_file())).streamable_http_app(...)`, notes file from $BASTION_NOTES_FILE);
- `bastion`: Bastion's app, built as `bastion serve --transport http` builds it (bastion/cli/serve.py and
  bastion/server/http.py): the configuration loaded, the gateway opened without waiting for its connectors,
  a `HostServer` over it, `build_app` with the loopback hosts allowed, uvicorn's settings of `serve_http`.

Servers: uvicorn (`--http h11|httptools|auto`), hypercorn (h11) and granian (embedded in this process's
loop; its HTTP is Rust's hyper). `--loop uvloop` runs the whole process on uvloop (anyio's `use_uvloop`).
SIGTERM or SIGINT stops it. Run:
`python bench/http_serve.py demo|bastion --server S [--http P] [--loop L] --port N [--config DIR]`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from starlette.types import ASGIApp

HOST = "127.0.0.1"
SERVERS = ("uvicorn", "hypercorn", "granian")
PARSERS = ("auto", "h11", "httptools")
LOOPS = ("asyncio", "uvloop")
CLOSE_TIMEOUT = 3
"""Seconds open connections get once stopping (as `bastion serve`'s STREAMS_CLOSE_TIMEOUT)."""


@dataclass(frozen=True)
class Stack:
    """An ASGI server, its HTTP/1.1 parser and the event loop: what bench/http_stack.py compares."""

    name: str
    server: str
    http: str
    loop: str

    @property
    def label(self) -> str:
        parser = {"granian": "hyper (Rust)", "hypercorn": "h11"}.get(self.server, self.http)
        return f"{self.server} + {parser} on {self.loop}"

    def argv(self) -> list[str]:
        """The launcher's command line for this stack (the app, port and configuration follow)."""
        return [sys.executable, str(Path(__file__)), "--server", self.server, "--http", self.http, "--loop", self.loop]


@asynccontextmanager
async def demo_app() -> AsyncIterator[tuple[ASGIApp, Callable[[], None]]]:
    # Each app's modules are imported only when it is served, so the demo server's process holds no more than
    # `python -m bastion.demo.notes` does (a larger heap costs the garbage collector on every call).
    from bastion.demo.notes import NoteStore, create_server, notes_file

    server = create_server(NoteStore(notes_file()))
    yield server.streamable_http_app(streamable_http_path="/mcp", host=HOST), lambda: None


@asynccontextmanager
async def bastion_app(config_dir: Path) -> AsyncIterator[tuple[ASGIApp, Callable[[], None]]]:
    from bastion.cli.compose import load, open_gateway
    from bastion.cli.logs import LOG_LEVEL_ENV_VAR, configure_logging, parse_level
    from bastion.server.http import allowed_hosts_for, build_app
    from bastion.server.mcp import HostServer
    from bastion.server.tracing import exporting_traces

    configure_logging(parse_level(os.environ.get(LOG_LEVEL_ENV_VAR)))
    config = load(config_dir)
    with exporting_traces():
        async with open_gateway(config, wait_for_sources=False) as gateway:
            front = HostServer(gateway)
            # Once stopping, long-lived responses end first so connections can close (as serve_http does).
            yield build_app(front, allowed_hosts=allowed_hosts_for(HOST)), front.end_streams


class _Uvicorn(uvicorn.Server):
    """uvicorn without signal handlers of its own: this process stops it."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_uvicorn(app: ASGIApp, port: int, http: str, stop: anyio.Event) -> None:
    from bastion.server.http import bind_listener  # IPPROTO_TCP: TCP_NODELAY on accepted sockets

    config = uvicorn.Config(
        app,
        http=http,
        log_level="warning",
        log_config=None,
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=CLOSE_TIMEOUT,
    )
    server = _Uvicorn(config)
    sock = bind_listener(HOST, port)
    try:
        async with anyio.create_task_group() as tg:

            async def shut_down() -> None:
                await stop.wait()
                server.should_exit = True

            tg.start_soon(shut_down)
            await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    finally:
        sock.close()


async def serve_hypercorn(app: ASGIApp, port: int, stop: anyio.Event) -> None:
    # hypercorn and granian are installed only in the bench environment (.venv-bench); `make lint`
    # type-checks this file where they are absent, so they are imported by name.
    hypercorn_config: Any = importlib.import_module("hypercorn.config")
    hypercorn_asyncio: Any = importlib.import_module("hypercorn.asyncio")
    config = hypercorn_config.Config()
    config.bind = [f"{HOST}:{port}"]  # hypercorn sets TCP_NODELAY on the sockets it binds
    config.loglevel = "WARNING"
    config.accesslog = None
    config.graceful_timeout = CLOSE_TIMEOUT
    await hypercorn_asyncio.serve(app, config, shutdown_trigger=stop.wait, mode="asgi")


async def serve_granian(app: ASGIApp, port: int, stop: anyio.Event) -> None:
    embed: Any = importlib.import_module("granian.server.embed")
    server = embed.Server(
        app,
        address=HOST,
        port=port,
        interface=embed.Interfaces.ASGI,
        http=embed.HTTPModes.http1,
        websockets=False,
        runtime_threads=1,
        log_level=embed.LogLevels.warning,
    )
    async with anyio.create_task_group() as tg:

        async def shut_down() -> None:
            await stop.wait()
            server.stop()

        tg.start_soon(shut_down)
        await server.serve()
        tg.cancel_scope.cancel()


async def main(app_name: str, server: str, http: str, port: int, config_dir: Path | None) -> None:
    stop = anyio.Event()
    opened = demo_app() if app_name == "demo" else bastion_app(config_dir or Path.cwd())
    async with anyio.create_task_group() as tg, opened as (app, end_streams):

        async def watch_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    end_streams()
                    stop.set()
                    return

        tg.start_soon(watch_signals)
        if server == "uvicorn":
            await serve_uvicorn(app, port, http, stop)
        elif server == "hypercorn":
            await serve_hypercorn(app, port, stop)
        else:
            await serve_granian(app, port, stop)
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("app", choices=["demo", "bastion"])
    parser.add_argument("--server", choices=SERVERS, default="uvicorn")
    parser.add_argument("--http", choices=PARSERS, default="auto", help="uvicorn's HTTP/1.1 parser (default auto)")
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    parser.add_argument("--port", type=int, required=True, help="port to bind on 127.0.0.1")
    parser.add_argument("--config", type=Path, help="Bastion's configuration directory (bastion mode)")
    args = parser.parse_args()
    anyio.run(
        main,
        args.app,
        args.server,
        args.http,
        args.port,
        args.config,
        backend_options={"use_uvloop": args.loop == "uvloop"},
    )
