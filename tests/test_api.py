"""The approver REST API and bearer-token authentication, over real HTTP on loopback.

Bastion's app runs under uvicorn in this process on a pre-bound loopback socket, over a real SQLite
ledger; the end-to-end test adds a real gateway with an in-process downstream and a real MCP client.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from bastion.config import Config, ConnectorConfig, PolicyConfig, Settings
from bastion.errors import ConfigError
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.models import Invocation, Pin, PinObservation, Role, utcnow
from bastion.pipeline.gateway import Gateway
from bastion.server.api import OPERATIONS
from bastion.server.auth import BearerAuth, principal_of
from bastion.server.http import allowed_hosts_for, bind_listener, build_app, serve_http
from bastion.server.mcp import HostServer
from bastion.sources.mcp import McpConnector
from bastion.sources.seam import ActionSource
from tests.downstream import FixtureServer
from tests.test_cli import INVOCATION_KEYS

pytestmark = pytest.mark.anyio

WAIT = 20  # seconds: the bound of every wait in this file


# -- a live server -------------------------------------------------------------------------------------


@asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on a free loopback port in this event loop; yield its base URL.

    The socket listens before uvicorn starts, so a request made at once waits in the backlog instead of
    failing; leaving the block asks uvicorn to stop and waits for it (uvicorn bounds its graceful shutdown).
    """
    sock = bind_listener("127.0.0.1", 0)
    config = uvicorn.Config(
        app, lifespan="on", log_config=None, access_log=False, ws="none", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


@dataclass
class Live:
    """A running Bastion HTTP app and what a test needs to drive it."""

    url: str
    ledger: OpenLedger
    gateway: Gateway
    http: httpx2.AsyncClient
    fixture: FixtureServer

    async def token(self, name: str, role: Role) -> dict[str, str]:
        """Create a token and return the headers that present it."""
        secret = await self.ledger.tokens.create_token(name, role=role, profile=None, now=utcnow())
        return {"Authorization": f"Bearer {secret}"}


def _config(tmp_path: Path, modes: dict[str, str]) -> Config:
    return Config(
        directory=None,
        settings=Settings(),
        connectors=[ConnectorConfig(id="fx", command="unused")],
        policy=PolicyConfig.model_validate({"modes": modes}),
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
    )


@asynccontextmanager
async def live_bastion(
    tmp_path: Path, *, gateway_running: bool = False, non_loopback: bool = False, modes: dict[str, str] | None = None
) -> AsyncIterator[Live]:
    """Bastion's HTTP app over a real ledger. With `gateway_running` the gateway serves an in-process
    downstream (tool `fx__echo`) and sweeps expiries; without, only the ledger moves (deterministic
    expiry tests)."""
    fixture = FixtureServer()
    config = _config(tmp_path, modes or {})
    sources: list[ActionSource] = (
        [McpConnector(config.connectors[0], target=lambda: fixture.server)] if gateway_running else []
    )
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, sources)
        app = build_app(HostServer(gateway), allowed_hosts=allowed_hosts_for("127.0.0.1"), non_loopback=non_loopback)
        async with _maybe_running(gateway, gateway_running), serving(app) as url:
            timeout = httpx2.Timeout(WAIT)
            async with httpx2.AsyncClient(base_url=url, timeout=timeout) as http:
                yield Live(url, ledger, gateway, http, fixture)


@asynccontextmanager
async def _maybe_running(gateway: Gateway, running: bool) -> AsyncIterator[None]:
    if not running:
        yield
        return
    async with gateway.running():
        yield


def invocation(number: int, *, principal: str | None = "ci-agent", **overrides: Any) -> Invocation:
    """A pending write call made by `principal`; `number` orders creation (higher is newer)."""
    created = utcnow() - timedelta(minutes=1) + timedelta(seconds=number)
    fields: dict[str, Any] = {
        "id": f"inv-{number:04d}",
        "status": "pending",
        "policy_key": "fx:write",
        "tool": "fx__write",
        "source_id": "fx",
        "action_id": "write",
        "risk": "write",
        "mode": "require_approval",
        "mode_source": "inferred",
        "session_id": f"session-{number}",
        "principal": principal,
        "args": {"name": "groceries", "api_token": "hunter2"},
        "args_hash": "0" * 64,
        "created_at": created,
        "updated_at": created,
        "expires_at": utcnow() + timedelta(minutes=5),
    }
    return Invocation(**(fields | overrides))


async def seed(ledger: OpenLedger, *invocations: Invocation) -> None:
    for item in invocations:
        await ledger.invocations.record(item, ("planned", "pending"))


async def status_of(ledger: OpenLedger, invocation_id: str) -> str:
    found = await ledger.invocations.get(invocation_id)
    assert found is not None
    return found.status


def error_class(response: httpx2.Response) -> str:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"class", "message", "invocation_id"}
    assert response.headers["content-type"] == "application/json"
    return str(body["error"]["class"])


# -- authentication ----------------------------------------------------------------------------------


async def test_healthz_is_open_even_when_tokens_exist(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        await live.token("alice", "admin")
        response = await live.http.get("/healthz")
        assert response.status_code == 200
        assert response.json()["status"] == "ok"
        guarantee = response.json()["guarantee"]
        assert guarantee["level"] == "G1"
        assert guarantee["scope"].startswith("single machine")


async def test_the_api_refuses_a_missing_token_with_401_and_says_how_to_create_one(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        for path in ("/api/invocations", "/api/approvals", "/api/pins", "/api/openapi.json", "/api/nowhere"):
            response = await live.http.get(path)
            assert response.status_code == 401, path
            assert error_class(response) == "unauthenticated"
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert "bastion tokens create NAME --role admin" in response.json()["error"]["message"]


async def test_a_wrong_token_gets_the_same_401_for_an_existing_and_a_missing_invocation(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        await live.token("alice", "admin")
        await seed(live.ledger, invocation(1))
        wrong = {"Authorization": "Bearer bst_" + "x" * 43}
        answers = [
            await live.http.request(method, path, headers=headers)
            for headers in (wrong, {"Authorization": "Basic YWxpY2U6cHc="}, {"Authorization": "Bearer"})
            for method, path in (
                ("GET", "/api/invocations/inv-0001"),
                ("GET", "/api/invocations/inv-9999"),
                ("POST", "/api/approvals/inv-0001/approve"),
                ("POST", "/api/approvals/inv-9999/approve"),
            )
        ]
        assert {a.status_code for a in answers} == {401}
        assert len({(a.content, a.headers["www-authenticate"]) for a in answers}) == 1
        assert error_class(answers[0]) == "unauthenticated"
        assert await status_of(live.ledger, "inv-0001") == "pending"


async def test_a_revoked_token_gets_401(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        headers = await live.token("alice", "admin")
        assert (await live.http.get("/api/invocations", headers=headers)).status_code == 200
        await live.ledger.tokens.revoke_token("alice", now=utcnow())
        response = await live.http.get("/api/invocations", headers=headers)
        assert response.status_code == 401
        assert error_class(response) == "unauthenticated"


async def test_mcp_and_sse_are_open_to_anonymous_local_hosts_until_a_token_exists(tmp_path: Path) -> None:
    async with (
        live_bastion(tmp_path, gateway_running=True) as live,
        Client(f"{live.url}/mcp", mode="legacy", cache=None) as client,
    ):
        assert "fx__echo" in {tool.name for tool in (await client.list_tools()).tools}


async def test_mcp_and_sse_refuse_a_missing_token_once_a_token_exists(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        agent = await live.token("ci-agent", "agent")
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        mcp_headers = {"Accept": "application/json, text/event-stream"}
        refused = [
            await live.http.post("/mcp", json=initialize, headers=mcp_headers),
            await live.http.get("/sse"),
            await live.http.post("/messages/?session_id=0", json=initialize),
            await live.http.post("/mcp", json=initialize, headers=mcp_headers | {"Authorization": "Bearer nope"}),
        ]
        assert [r.status_code for r in refused] == [401] * 4
        assert all(error_class(r) == "unauthenticated" for r in refused)
        assert "bastion tokens create" in refused[0].json()["error"]["message"]
        accepted = await live.http.post("/mcp", json=initialize, headers=mcp_headers | agent)
        assert accepted.status_code != 401


async def test_a_non_loopback_server_needs_a_token_on_mcp_even_before_any_exists(tmp_path: Path) -> None:
    async with live_bastion(tmp_path, non_loopback=True) as live:
        response = await live.http.post("/mcp", json={}, headers={"Accept": "application/json, text/event-stream"})
        assert response.status_code == 401
        assert (await live.http.get("/healthz")).status_code == 200


async def test_serving_beyond_loopback_without_any_token_is_refused_at_start(tmp_path: Path) -> None:
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
        front = HostServer(Gateway(_config(tmp_path, {}), ledger, []))
        with pytest.raises(ConfigError, match="bastion tokens create"):
            await serve_http(front, host="0.0.0.0", port=0)


async def test_the_answer_to_whether_tokens_exist_is_reused_only_within_the_recheck_delay(tmp_path: Path) -> None:
    now = [0.0]

    async def whoami(request: Request) -> Response:
        principal = principal_of(request.scope)
        return PlainTextResponse(principal.name if principal else "anonymous")

    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
        app = BearerAuth(
            Starlette(routes=[Route("/mcp", whoami)]), ledger.tokens, recheck_seconds=1.0, clock=lambda: now[0]
        )
        async with serving(app) as url, httpx2.AsyncClient(base_url=url, timeout=WAIT) as http:
            assert (await http.get("/mcp")).text == "anonymous"
            secret = await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=utcnow())
            assert (await http.get("/mcp")).text == "anonymous"  # the answer of time 0 still stands
            assert (await http.get("/mcp", headers={"Authorization": f"Bearer {secret}"})).text == "ci-agent"
            now[0] = 1.0
            assert (await http.get("/mcp")).status_code == 401


async def test_a_host_refused_for_want_of_a_token_is_told_how_to_reconnect_and_oauth_discovery_says_there_is_none(
    tmp_path: Path,
) -> None:
    """Hosts answer a 401 by looking for an OAuth server (Claude Code and the Inspector do): every place they look
    says Bastion has none and how a host connects, so the host shows that instead of an OAuth failure."""
    async with live_bastion(tmp_path) as live:
        await live.token("ci-agent", "agent")
        refused = await live.http.post("/mcp", json={}, headers={"Accept": "application/json, text/event-stream"})
        assert refused.status_code == 401
        assert "bastion tokens create NAME --role agent" in refused.json()["error"]["message"]
        for path in (
            "/.well-known/oauth-protected-resource/mcp",
            "/.well-known/oauth-authorization-server",
            "/register",
        ):
            looked = await live.http.request("POST" if path == "/register" else "GET", path, json={})
            assert looked.status_code == 404, path
            assert "no OAuth" in looked.json()["error"]["message"] and "--header" in looked.json()["error"]["message"]


async def test_a_running_server_logs_when_the_first_token_is_created_and_when_none_is_left(tmp_path: Path) -> None:
    heard: list[str] = []
    news = [anyio.Event()]

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            heard.append(record.getMessage())
            news[0].set()

    async def until_logged(words: str) -> None:
        while not any(words in message for message in heard):
            news[0] = anyio.Event()
            await news[0].wait()

    handler = Heard(logging.WARNING)
    logging.getLogger("bastion.server.auth").addHandler(handler)
    try:
        async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
            auth = BearerAuth(Starlette(), ledger.tokens, recheck_seconds=0.01)
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    await tg.start(auth.watch_tokens)
                    await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=utcnow())
                    await until_logged("a token now exists")
                    await ledger.tokens.revoke_token("ci-agent", now=utcnow())
                    await until_logged("no token is active")
                    tg.cancel_scope.cancel()
    finally:
        logging.getLogger("bastion.server.auth").removeHandler(handler)
    assert len(heard) == 2  # each change once


async def _posted_raw(url: str, path: str, headers: dict[str, str], size: int, *, declared: bool = False) -> bytes:
    """POST a body of `size` bytes over a raw connection, chunked (its size unknown ahead) or `declared` in its
    Content-Length (and never sent), reading the answer while sending: the head of the answer (its status line)."""
    host, port = url.removeprefix("http://").split(":")
    framing = f"Content-Length: {size}" if declared else "Transfer-Encoding: chunked"
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    chunk = b"x" * 8192
    async with await anyio.connect_tcp(host, int(port)) as raw, anyio.create_task_group() as tg:

        async def send_body() -> None:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                for _ in range(0 if declared else size // len(chunk)):
                    await raw.send(b"2000\r\n" + chunk + b"\r\n")

        await raw.send(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}{framing}\r\n\r\n".encode())
        tg.start_soon(send_body)
        with anyio.fail_after(WAIT):
            answer = await raw.receive()
        tg.cancel_scope.cancel()
    return answer


async def test_a_body_over_its_paths_limit_is_refused_as_it_arrives_before_any_of_it_is_acted_on(
    tmp_path: Path,
) -> None:
    """The inbox's login form takes no token, and any token reaches /api: neither reads a body whole any more. A
    body that says it is too long is refused unread; one that turns out too long, as soon as it passes the limit."""
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        await seed(live.ledger, invocation(1))
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        for size, declared in ((256 * 1024, False), (150 * 1024 * 1024, True)):
            answer = await _posted_raw(live.url, "/inbox/login", form, size, declared=declared)
            assert answer.startswith(b"HTTP/1.1 413 ") and b"request_too_large" in answer, answer[:200]
        approve = "/api/approvals/inv-0001/approve"
        answer = await _posted_raw(live.url, approve, admin | {"Content-Type": "application/json"}, 5 * 1024 * 1024)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert (await live.ledger.invocations.get("inv-0001")).status == "pending"  # type: ignore[union-attr]
        within = await live.http.post(approve, json={"note": "ok"}, headers=admin)
        assert within.status_code == 200


async def test_an_overlong_url_or_overlarge_headers_are_refused_before_any_route(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        long_url = await live.http.get("/api/invocations", params={"source": "x" * (9 * 1024)}, headers=admin)
        assert (long_url.status_code, error_class(long_url)) == (414, "url_too_long")
        big = admin | {f"x-filler-{n}": "y" * 1024 for n in range(40)}
        large = await live.http.get("/api/invocations", headers=big)
        assert (large.status_code, error_class(large)) == (431, "headers_too_large")
        assert (await live.http.get("/api/invocations", headers=admin)).status_code == 200


async def test_a_token_holds_at_most_eight_event_streams_open(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live, contextlib.AsyncExitStack() as streams:
        admin = await live.token("alice", "admin")
        other = await live.token("bob", "admin")
        opened = [
            await streams.enter_async_context(live.http.stream("GET", "/api/events", headers=admin)) for _ in range(8)
        ]
        assert all(stream.status_code == 200 for stream in opened)
        refused = await live.http.get("/api/events", headers=admin)
        assert (refused.status_code, error_class(refused)) == (429, "rate_limited")
        async with live.http.stream("GET", "/api/events", headers=other) as elsewhere:
            assert elsewhere.status_code == 200  # another token's budget
        await opened[0].aclose()
        with anyio.fail_after(WAIT):  # the closed stream's slot comes back once the server sees it gone
            while True:
                async with live.http.stream("GET", "/api/events", headers=admin) as again:
                    if again.status_code == 200:
                        break


async def test_a_failing_ledger_is_answered_500_internal_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        await live.ledger.close()
        response = await live.http.get("/api/invocations", headers=admin)
        assert response.status_code == 500
        assert error_class(response) == "internal"
    assert any(record.exc_info for record in caplog.records if record.name == "bastion.server.auth")


# -- invocations and approvals -----------------------------------------------------------------------


async def test_an_agent_token_lists_and_reads_only_its_own_invocations(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        agent = await live.token("ci-agent", "agent")
        admin = await live.token("alice", "admin")
        await seed(live.ledger, invocation(1), invocation(2, principal="other-agent"), invocation(3, principal=None))

        mine = (await live.http.get("/api/invocations", headers=agent)).json()["invocations"]
        assert [i["id"] for i in mine] == ["inv-0001"]
        assert set(mine[0]) >= INVOCATION_KEYS
        assert "args_hash" not in mine[0]  # a hash of the raw arguments would let a reader guess redacted values
        assert mine[0]["args"]["api_token"] == "[REDACTED]"
        pending = (await live.http.get("/api/approvals", headers=agent)).json()["approvals"]
        assert [i["id"] for i in pending] == ["inv-0001"]
        assert 0 < pending[0]["expires_in_seconds"] <= 300
        assert pending[0]["drifted"] is False

        other = await live.http.get("/api/invocations/inv-0002", headers=agent)
        missing = await live.http.get("/api/invocations/inv-9999", headers=agent)
        assert other.status_code == missing.status_code == 404
        assert error_class(other) == "not_found"
        detail = (await live.http.get("/api/invocations/inv-0001", headers=agent)).json()
        assert [e["kind"] for e in detail["events"]] == ["planned", "pending"]
        assert "args_hash" not in detail and "args_hash" not in pending[0]

        everything = (await live.http.get("/api/invocations", headers=admin)).json()["invocations"]
        assert [i["id"] for i in everything] == ["inv-0003", "inv-0002", "inv-0001"]
        filtered = await live.http.get("/api/invocations", params={"session": "session-2", "limit": 5}, headers=admin)
        assert [i["id"] for i in filtered.json()["invocations"]] == ["inv-0002"]


async def test_an_agents_list_finds_its_calls_behind_any_number_of_newer_ones(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        agent = await live.token("ci-agent", "agent")
        others = [invocation(number, principal="busy-agent") for number in range(2, 1103)]
        await seed(live.ledger, invocation(1), *others)  # its one call is older than 1,100 of another's

        mine = (await live.http.get("/api/invocations", params={"limit": 5}, headers=agent)).json()["invocations"]
        assert [i["id"] for i in mine] == ["inv-0001"]
        pending = (await live.http.get("/api/approvals", headers=agent)).json()["approvals"]
        assert [i["id"] for i in pending] == ["inv-0001"]


async def test_an_agent_token_cannot_approve_or_deny_not_even_its_own_call(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        agent = await live.token("ci-agent", "agent")
        await seed(live.ledger, invocation(1), invocation(2, principal="other-agent"))
        for path in (
            "/api/approvals/inv-0001/approve",
            "/api/approvals/inv-0001/deny",
            "/api/approvals/inv-0002/approve",
            "/api/approvals/inv-9999/approve",  # refused before the lookup: existence stays hidden
        ):
            response = await live.http.post(path, headers=agent)
            assert response.status_code == 403, path
            assert error_class(response) == "forbidden"
        assert {i.status for i in await live.ledger.invocations.list()} == {"pending"}


async def test_an_admin_approves_and_denies_and_gets_the_updated_invocation(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        await seed(live.ledger, invocation(1), invocation(2))

        approved = await live.http.post("/api/approvals/inv-0001/approve", headers=admin)
        assert approved.status_code == 200
        assert approved.json()["status"] == "approved"
        assert set(approved.json()) >= INVOCATION_KEYS
        denied = await live.http.post("/api/approvals/inv-0002/deny", json={"reason": "not today"}, headers=admin)
        assert denied.status_code == 200
        assert denied.json()["status"] == "denied"
        assert "not today" in denied.json()["error_message"]

        events = (await live.http.get("/api/invocations/inv-0001", headers=admin)).json()["events"]
        assert events[-1]["kind"] == "approved"
        assert events[-1]["detail"]["by"] == "alice"


async def test_an_admin_cannot_decide_its_own_call(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        await seed(live.ledger, invocation(1, principal="alice"))
        response = await live.http.post("/api/approvals/inv-0001/approve", json={"note": "mine"}, headers=admin)
        assert response.status_code == 403
        assert error_class(response) == "forbidden"


async def test_deciding_gives_410_when_expired_409_when_decided_404_when_missing(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        past = utcnow() - timedelta(seconds=1)
        await seed(live.ledger, invocation(1, expires_at=past), invocation(2))

        expired = await live.http.post("/api/approvals/inv-0001/approve", headers=admin)
        assert expired.status_code == 410
        assert error_class(expired) == "approval_expired"
        assert expired.json()["error"]["invocation_id"] == "inv-0001"
        assert await status_of(live.ledger, "inv-0001") == "expired"

        assert (await live.http.post("/api/approvals/inv-0002/deny", headers=admin)).status_code == 200
        again = await live.http.post("/api/approvals/inv-0002/approve", headers=admin)
        assert again.status_code == 409
        assert error_class(again) == "conflict"

        missing = await live.http.post("/api/approvals/inv-9999/deny", headers=admin)
        assert missing.status_code == 404
        assert error_class(missing) == "not_found"


async def test_bad_input_is_answered_422_never_500(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        await seed(live.ledger, invocation(1))
        approve = "/api/approvals/inv-0001/approve"
        bad = [
            await live.http.post(approve, content=b"{not json", headers=admin),
            await live.http.post(approve, json={"note": 5}, headers=admin),
            await live.http.post(approve, json={"note": "x", "extra": 1}, headers=admin),
            await live.http.post(approve, json=["note"], headers=admin),
            await live.http.post("/api/approvals/inv-0001/deny", json={"note": "wrong field"}, headers=admin),
            await live.http.get("/api/invocations", params={"status": "nope"}, headers=admin),
            await live.http.get("/api/invocations", params={"limit": "0"}, headers=admin),
            await live.http.get("/api/invocations", params={"limit": "ten"}, headers=admin),
            await live.http.get("/api/invocations", params={"colour": "red"}, headers=admin),
            await live.http.get("/api/invocations?limit=1&limit=2", headers=admin),
            await live.http.get("/api/pins", params={"drifted": "yes"}, headers=admin),
            await live.http.post("/api/pins/accept", headers=admin),
            await live.http.post("/api/pins/accept", json={"key": "fx:echo", "source_id": "fx"}, headers=admin),
            await live.http.post("/api/pins/accept", json={"key": "no-colon"}, headers=admin),
            await live.http.request("GET", "/api/pins", content=b"{}", headers=admin),
        ]
        assert [r.status_code for r in bad] == [422] * len(bad)
        assert {error_class(r) for r in bad} == {"invalid_arguments"}
        assert await status_of(live.ledger, "inv-0001") == "pending"
        wrong_method = await live.http.get(approve, headers=admin)
        assert wrong_method.status_code == 405
        assert error_class(wrong_method) == "method_not_allowed"


# -- pins ----------------------------------------------------------------------------------------------


def observation(description: str) -> PinObservation:
    definition = {"name": "echo", "description": description, "inputSchema": {"type": "object"}}
    return PinObservation(fingerprint=description * 8, structural="s" * 64, definition=definition)


async def test_pins_are_listed_and_accepted_by_approvers_only(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        agent = await live.token("ci-agent", "agent")
        admin = await live.token("alice", "admin")
        drifted = Pin(
            source_id="fx",
            action_id="echo",
            pinned=observation("Echo."),
            pinned_by="first-use",
            drift=observation("Exfiltrate."),
        )
        await live.ledger.pins.save_pin(drifted)

        hidden = await live.http.get("/api/pins", params={"drifted": "true"}, headers=agent)
        assert (hidden.status_code, error_class(hidden)) == (403, "forbidden")
        assert "Exfiltrate" not in hidden.text  # the drifted description hosts are not shown
        listed = (await live.http.get("/api/pins", params={"drifted": "true"}, headers=admin)).json()["pins"]
        assert [(p["key"], p["drifted"]) for p in listed] == [("fx:echo", True)]
        assert '+  "description": "Exfiltrate.",' in listed[0]["diff"]

        refused = await live.http.post("/api/pins/accept", json={"key": "fx:echo"}, headers=agent)
        assert refused.status_code == 403
        assert error_class(refused) == "forbidden"
        assert (await live.ledger.pins.pins("fx"))[0].drift is not None

        accepted = await live.http.post("/api/pins/accept", json={"key": "fx:echo"}, headers=admin)
        assert accepted.status_code == 200
        (pin,) = accepted.json()["pins"]
        assert (pin["key"], pin["drifted"], pin["pinned_by"]) == ("fx:echo", False, "alice")

        again = await live.http.post("/api/pins/accept", json={"key": "fx:echo"}, headers=admin)
        assert again.status_code == 409
        by_source = await live.http.post("/api/pins/accept", json={"source_id": "fx"}, headers=admin)
        assert (by_source.status_code, by_source.json()) == (200, {"pins": []})
        unknown = [
            await live.http.post("/api/pins/accept", json={"source_id": "nope"}, headers=admin),
            await live.http.post("/api/pins/accept", json={"key": "fx:nope"}, headers=admin),
        ]
        assert [r.status_code for r in unknown] == [404, 404]


# -- the document and the whole path --------------------------------------------------------------------


async def test_the_openapi_document_describes_every_route_and_the_bearer_scheme(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        admin = await live.token("alice", "admin")
        document = (await live.http.get("/api/openapi.json", headers=admin)).json()
        assert document["openapi"].startswith("3.1")
        served = {(op.method.lower(), f"/api{op.path}") for op in OPERATIONS}
        documented = {(method, path) for path, item in document["paths"].items() for method in item}
        assert documented == served
        assert document["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
        approve = document["paths"]["/api/approvals/{invocation_id}/approve"]["post"]
        assert set(approve["responses"]) == {"200", "401", "403", "404", "409", "410", "422", "500"}


async def test_an_agent_call_waits_until_an_admin_approves_it_through_the_api(tmp_path: Path) -> None:
    async with live_bastion(tmp_path, gateway_running=True, modes={"fx:echo": "require_approval"}) as live:
        agent = await live.token("ci-agent", "agent")
        admin = await live.token("alice", "admin")
        results: list[types.CallToolResult] = []

        async def agent_calls() -> None:
            async with (
                httpx2.AsyncClient(headers=agent, timeout=WAIT) as http,
                Client(streamable_http_client(f"{live.url}/mcp", http_client=http), mode="legacy", cache=None) as c,
            ):
                results.append(await c.call_tool("fx__echo", {"text": "hello"}))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(agent_calls)
                pending: list[dict[str, Any]] = []
                while not pending:
                    with anyio.move_on_after(1):
                        await live.ledger.changes.next(live.ledger.changes.cursor)
                    pending = (await live.http.get("/api/approvals", headers=admin)).json()["approvals"]
                (waiting,) = pending
                assert waiting["principal"] == "ci-agent"
                own = await live.http.post(f"/api/approvals/{waiting['id']}/approve", headers=agent)
                assert own.status_code == 403
                approved = await live.http.post(
                    f"/api/approvals/{waiting['id']}/approve", json={"note": "fine"}, headers=admin
                )
                assert approved.status_code == 200
        (result,) = results
        assert not result.is_error
        assert await status_of(live.ledger, waiting["id"]) == "completed"


async def test_an_id_prefix_names_one_invocation_among_those_the_token_may_see(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        agent = await live.token("ci-agent", "agent")
        admin = await live.token("alice", "admin")
        mine, theirs = invocation(1, id="abcdef-mine"), invocation(2, id="abcdef-theirs", principal="other-agent")
        await seed(live.ledger, mine, theirs)

        own = await live.http.get("/api/invocations/abcdef", headers=agent)
        assert own.status_code == 200
        assert own.json()["id"] == mine.id
        assert [e["kind"] for e in own.json()["events"]] == ["planned", "pending"]
        ambiguous = await live.http.get("/api/invocations/abcdef", headers=admin)
        assert ambiguous.status_code == 422
        assert error_class(ambiguous) == "ambiguous_id"
        message = ambiguous.json()["error"]["message"]
        assert mine.id in message
        assert theirs.id in message
        hidden = await live.http.get("/api/invocations/abcdef-t", headers=agent)
        assert hidden.status_code == 404
        assert theirs.id not in hidden.text
        assert (await live.http.get("/api/invocations/abcde", headers=admin)).status_code == 404  # too short

        approved = await live.http.post("/api/approvals/abcdef-th/approve", headers=admin)
        assert approved.status_code == 200
        assert approved.json()["id"] == theirs.id
        assert await status_of(live.ledger, theirs.id) == "approved"


# -- reconciliation and the audit trail -------------------------------------------------------------------


async def test_an_approver_reconciles_an_unknown_call_and_only_an_unresolved_one(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        agent = await live.token("ci-agent", "agent")
        admin = await live.token("alice", "admin")
        await seed(live.ledger, invocation(1))
        await live.ledger.invocations.record(invocation(2, status="unknown", expires_at=None), ("planned", "unknown"))
        body = {"outcome": "completed", "note": "the issue exists upstream"}

        refused = await live.http.post("/api/invocations/inv-0002/reconcile", json=body, headers=agent)
        assert refused.status_code == 403
        assert error_class(refused) == "forbidden"
        settled = await live.http.post("/api/invocations/inv-0002/reconcile", json=body, headers=admin)
        assert settled.status_code == 200, settled.text
        assert settled.json()["status"] == "completed"
        events = await live.ledger.invocations.events("inv-0002")
        assert events[-1].kind == "reconciled"
        assert events[-1].detail["by"] == "alice"

        pending = await live.http.post("/api/invocations/inv-0001/reconcile", json=body, headers=admin)
        assert pending.status_code == 409
        bad = await live.http.post("/api/invocations/inv-0002/reconcile", json={"outcome": "maybe"}, headers=admin)
        assert bad.status_code == 422


async def test_the_audit_trail_read_page_by_page_from_a_cursor_equals_it_read_whole(tmp_path: Path) -> None:
    async with live_bastion(tmp_path) as live:
        agent = await live.token("ci-agent", "agent")
        admin = await live.token("alice", "admin")
        await seed(live.ledger, *(invocation(n) for n in range(1, 6)))

        whole = (await live.http.get("/api/audit/events", headers=admin)).json()
        calls = [e for e in whole["events"] if e["record"] is None]
        assert [e["kind"] for e in calls] == ["planned", "pending"] * 5
        assert all(e["invocation"]["args"]["api_token"] == "[REDACTED]" for e in calls)
        # The tokens' records are in the same chain (bastion.ledger.kept), without an invocation.
        tokens = [(e["kind"], e["invocation"]) for e in whole["events"] if str(e["record"]).startswith("token:")]
        assert tokens == [("token_created", None), ("token_created", None)]
        paged: list[dict[str, Any]] = []
        since = 0
        while True:
            page = (await live.http.get("/api/audit/events", params={"since": since, "limit": 3}, headers=admin)).json()
            if not page["events"]:
                assert page["next"] == since
                break
            paged += page["events"]
            since = page["next"]
        assert paged == whole["events"]
        assert whole["next"] == whole["events"][-1]["position"]

        refused = await live.http.get("/api/audit/events", headers=agent)
        assert refused.status_code == 403
        for cursor in ("-1", str(2**63), "9" * 40):
            answer = await live.http.get("/api/audit/events", params={"since": cursor}, headers=admin)
            assert answer.status_code == 422, cursor
        largest = await live.http.get("/api/audit/events", params={"since": str(2**63 - 1)}, headers=admin)
        assert (largest.status_code, largest.json()["events"]) == (200, [])
