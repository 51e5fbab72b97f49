"""Webhooks: a receiver on loopback gets every event exactly once, signed, across a restart of Bastion and a
receiver that was down for a while (in-process, and from a real `bastion serve` stopped with SIGTERM and started
again); the Slack format; configuration errors."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bastion.config import WebhookSettings
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.models import utcnow
from bastion.pipeline.notify import Notifier, target_of
from tests.processes import bastion_http
from tests.test_api import WAIT, invocation, seed, serving

pytestmark = pytest.mark.anyio

SECRET = "s3cret-for-signing"


@dataclass
class Receiver:
    """A webhook receiver: records every request; answers 503 while `down`."""

    url: str = ""
    down: bool = False
    requests: list[tuple[dict[str, str], bytes, int]] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    async def endpoint(self, request: Request) -> Response:
        status = 503 if self.down else 204
        self.requests.append((dict(request.headers), await request.body(), status))
        self.changed.set()
        self.changed = anyio.Event()
        return Response(status_code=status)

    def accepted(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        return [(headers, json.loads(body)) for headers, body, status in self.requests if status == 204]

    async def wait_for(self, predicate: Any) -> None:
        with anyio.fail_after(WAIT):
            while not predicate():
                await self.changed.wait()


@asynccontextmanager
async def receiving() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = Starlette(routes=[Route("/hook", receiver.endpoint, methods=["POST"])])
    async with serving(app) as url:
        receiver.url = f"{url}/hook"
        yield receiver


@asynccontextmanager
async def notifying(ledger: OpenLedger, *webhooks: WebhookSettings) -> AsyncIterator[None]:
    """A Notifier running on `ledger` (one Bastion's lifetime)."""
    async with httpx2.AsyncClient() as http, anyio.create_task_group() as tg:
        notifier = Notifier(ledger, webhooks, http=http, inbox_url="http://127.0.0.1:8765/inbox")
        await tg.start(notifier.run)
        yield
        tg.cancel_scope.cancel()


def valid_signature(headers: dict[str, str], body: bytes) -> bool:
    expected = hmac.new(SECRET.encode(), f"{headers['x-bastion-timestamp']}.".encode() + body, hashlib.sha256)
    return hmac.compare_digest(headers["x-bastion-signature"], "sha256=" + expected.hexdigest())


async def test_a_receiver_gets_every_event_exactly_once_and_signed_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    async with receiving() as receiver:
        hook = WebhookSettings(url=receiver.url, secret=SECRET)  # type: ignore[arg-type]  # pydantic takes the str

        async with await open_ledger(path, redactor=Redactor()) as ledger, notifying(ledger, hook):
            await seed(ledger, invocation(1))
            await receiver.wait_for(lambda: len(receiver.accepted()) == 1)
            receiver.down = True
            await seed(ledger, invocation(2))
            await receiver.wait_for(lambda: any(status == 503 for _, _, status in receiver.requests))
        # Bastion is stopped. Meanwhile the CLI decides a call and an agent's call waits (another process).
        async with await open_ledger(path, redactor=Redactor()) as cli:
            await cli.invocations.decide("inv-0001", approve=True, principal="alice", note=None, now=utcnow())
            await seed(cli, invocation(3))
        receiver.down = False

        async with await open_ledger(path, redactor=Redactor()) as ledger, notifying(ledger, hook):
            await receiver.wait_for(lambda: len(receiver.accepted()) >= 4)

    accepted = receiver.accepted()
    # A retried event may arrive after newer ones: receivers order by X-Bastion-Event-Id (or the body's id).
    accepted.sort(key=lambda pair: int(pair[0]["x-bastion-event-id"]))
    assert [(body["event"], body["invocation"]["id"]) for _, body in accepted] == [
        ("approval_requested", "inv-0001"),
        ("approval_requested", "inv-0002"),
        ("approval_decided", "inv-0001"),
        ("approval_requested", "inv-0003"),
    ]
    event_ids = [headers["x-bastion-event-id"] for headers, _ in accepted]
    assert len(set(event_ids)) == len(event_ids) == 4
    assert all(valid_signature(headers, body) for headers, body, _ in receiver.requests)
    assert all(body["link"].endswith(f"/inbox/invocations/{body['invocation']['id']}") for _, body in accepted)
    assert "hunter2" not in json.dumps([body for _, body in accepted])


async def test_bastion_serve_delivers_every_event_to_a_webhook_once_and_signed_across_a_sigterm_restart(
    configured: tuple[Path, Path, dict[str, str]],
) -> None:
    config, _, env = configured
    env = env | {"HOOK_SECRET": SECRET}
    write = ("notes__write_note", {"name": "todo", "text": "call mum"})
    async with receiving() as receiver:
        bastion_toml = config / "bastion.toml"
        bastion_toml.write_text(
            bastion_toml.read_text() + f'[[notify.webhook]]\nurl = "{receiver.url}"\nsecret = "${{env:HOOK_SECRET}}"\n'
        )

        def heard(event: str, invocation_id: str | None = None, *, accepted: bool = True) -> str | None:
            """The invocation id of the first such request (taken, or refused while the receiver was down)."""
            for _, body, status in receiver.requests:
                found = json.loads(body)
                taken = status == 204
                if found["event"] == event and invocation_id in (None, found["invocation"]["id"]) and taken == accepted:
                    return str(found["invocation"]["id"])
            return None

        async with bastion_http(["--config", str(config)], env=env) as first, host(first.mcp_url) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(client.call_tool, *write))
                await receiver.wait_for(lambda: heard("approval_requested") is not None)
                approved = heard("approval_requested")
                assert approved is not None
                async with await open_ledger(config / "state" / "ledger.db", redactor=Redactor()) as ledger:
                    await ledger.invocations.decide(approved, approve=True, principal="alice", note=None, now=utcnow())
                await receiver.wait_for(lambda: heard("invocation_finished", approved) is not None)

            receiver.down = True
            async with anyio.create_task_group() as tg:  # a call the host stops waiting for: it stays pending
                other = ("notes__write_note", {"name": "later", "text": "call dad"})  # not a retry of the first
                tg.start_soon(functools.partial(client.call_tool, *other))
                await receiver.wait_for(lambda: heard("approval_requested", accepted=False) is not None)
                tg.cancel_scope.cancel()
            left_pending = heard("approval_requested", accepted=False)
            assert left_pending is not None
        assert first.process.returncode == 0, "stopped by SIGTERM, in its own time (not killed)"
        # Meanwhile the call left pending is denied from another process (this test's), and the receiver is back.
        async with await open_ledger(config / "state" / "ledger.db", redactor=Redactor()) as ledger:
            await ledger.invocations.decide(left_pending, approve=False, principal="alice", note="no", now=utcnow())
        receiver.down = False

        async with bastion_http(["--config", str(config)], env=env) as second, host(second.mcp_url) as client:
            assert not (await client.call_tool("notes__read_note", {"name": "groceries"})).is_error
            await receiver.wait_for(lambda: len(receiver.accepted()) == 6)

    accepted = sorted(receiver.accepted(), key=lambda pair: int(pair[0]["x-bastion-event-id"]))
    assert [(body["event"], body["invocation"]["id"]) for _, body in accepted[:5]] == [
        ("approval_requested", approved),
        ("approval_decided", approved),
        ("invocation_finished", approved),
        ("approval_requested", left_pending),
        ("approval_decided", left_pending),
    ]
    after_restart = accepted[5][1]
    assert (after_restart["event"], after_restart["invocation"]["tool"]) == ("invocation_finished", "notes__read_note")
    event_ids = [headers["x-bastion-event-id"] for headers, _ in accepted]
    assert len(set(event_ids)) == len(event_ids) == 6, "every event exactly once"
    assert all(valid_signature(headers, body) for headers, body, _ in receiver.requests)


@asynccontextmanager
async def host(url: str) -> AsyncIterator[Client]:
    """An MCP host connected to a Bastion over streamable HTTP."""
    async with (
        httpx2.AsyncClient(timeout=WAIT) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client,
    ):
        yield client


async def test_a_tampered_body_fails_the_signature_check(tmp_path: Path) -> None:
    async with receiving() as receiver:
        hook = WebhookSettings(url=receiver.url, secret=SECRET)  # type: ignore[arg-type]
        async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger, notifying(ledger, hook):
            await seed(ledger, invocation(1))
            await receiver.wait_for(lambda: len(receiver.accepted()) == 1)
    ((headers, body, _),) = receiver.requests
    assert valid_signature(headers, body)
    assert not valid_signature(headers, body.replace(b"inv-0001", b"inv-9999"))


async def test_a_slack_webhook_gets_a_message_linking_to_the_inbox_item(tmp_path: Path) -> None:
    async with receiving() as receiver:
        hook = WebhookSettings(url=receiver.url, format="slack", events=["approval_requested"])
        async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger, notifying(ledger, hook):
            await seed(ledger, invocation(1))
            await ledger.invocations.decide("inv-0001", approve=False, principal="alice", note=None, now=utcnow())
            await seed(ledger, invocation(2))
            await receiver.wait_for(lambda: len(receiver.accepted()) == 2)
    texts = [body["text"] for _, body in receiver.accepted()]
    assert texts[0].startswith("<http://127.0.0.1:8765/inbox/invocations/inv-0001|fx__write> waits for an approver")
    assert "ci-agent" in texts[0]


def test_a_json_webhook_without_a_secret_is_a_config_error_naming_the_fix() -> None:
    with pytest.raises(ValidationError, match="needs a secret"):
        WebhookSettings(url="https://example.com/hook")


@asynccontextmanager
async def stuck_receiver() -> AsyncIterator[tuple[str, anyio.Event]]:
    """A webhook receiver that takes the connection and the request and never answers; and an event set once a
    delivery is held open there."""
    holding = anyio.Event()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def hold(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            holding.set()
            await anyio.sleep_forever()

    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hold)
        yield f"http://127.0.0.1:{port}/hook", holding
        tg.cancel_scope.cancel()


PROMPT: Final = 5.0
"""Well under a delivery's SEND_TIMEOUT (10 s): what must not wait for a stuck receiver's delivery to time out."""


async def test_a_stuck_receiver_holds_up_only_its_own_messages_and_stopping_does_not_wait_for_it(
    tmp_path: Path,
) -> None:
    async with stuck_receiver() as (stuck_url, holding), receiving() as fast:
        stuck = WebhookSettings(url=stuck_url, secret=SECRET)  # type: ignore[arg-type]  # pydantic takes the str
        prompt = WebhookSettings(url=fast.url, secret=SECRET)  # type: ignore[arg-type]
        async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
            with anyio.CancelScope() as stopping:
                async with notifying(ledger, stuck, prompt):
                    with anyio.fail_after(WAIT):
                        await seed(ledger, invocation(1), invocation(2))
                        await holding.wait()  # the stuck receiver holds its first delivery open
                    with anyio.fail_after(PROMPT):  # the other receiver is not kept waiting behind it
                        await fast.wait_for(lambda: len(fast.accepted()) == 2)
                    stopping.deadline = anyio.current_time() + PROMPT  # from here: stop, within PROMPT
            assert not stopping.cancelled_caught  # stopping cancelled the stuck delivery, never waited it out
            due = await ledger.outbox.next_due(target_of(stuck))
            assert due is not None and due <= utcnow()  # still to deliver, due at once for the next start
