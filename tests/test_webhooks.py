"""Webhooks (issue 14): a receiver on loopback gets every event exactly once, signed, across a restart of Bastion and a
receiver that was down for a while; the Slack format; configuration errors."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bastion.config import WebhookSettings
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.models import utcnow
from bastion.pipeline.notify import Notifier
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
