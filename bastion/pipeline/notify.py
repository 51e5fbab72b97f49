"""Webhooks: every named event (bastion.pipeline.events) POSTed to each `[[notify.webhook]]`, through an
outbox in the ledger so that neither a restart nor a receiver that is down loses one.

The filler follows the change feed and adds one outbox item per webhook and event; after a restart it resumes after
the newest event it had added for each webhook (the outbox refuses an item twice), so the events made while
Bastion was down (by the CLI, another instance) are added too. A webhook never seen before starts from now. Each
webhook has a sender of its own, so a receiver that is slow or stuck holds up only its own messages: it claims
that webhook's due items, POSTs them one at a time in order, each within `SEND_TIMEOUT` in all (a receiver that
trickles its answer is cut off there), and marks each delivered, or retries it with exponential backoff, giving up
after `MAX_ATTEMPTS`. Stopping cancels a send under way, and makes its item due again at once. An item sent
but not marked (a crash in between) is sent again, the same on every attempt:
receivers dedupe on the event's `id` inside the signed body (`X-Bastion-Event-Id` repeats it for routing, but is
outside the signature, so anyone who can reach the receiver can set it).

A `json` webhook gets the event as JSON with a link to the inbox item, signed: `X-Bastion-Timestamp` (Unix seconds)
and `X-Bastion-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with the webhook's secret>`; receivers
check it and refuse old timestamps (replays). A `slack` webhook gets a Slack incoming-webhook message, unsigned
(Slack's incoming webhooks take no signature; the secret is the URL itself). Bodies carry
only what the ledger stores (arguments redacted); a webhook's URL (a Slack URL is a secret) is never stored or
logged: the outbox names it by a hash.

Signed anchors of the audit chain go to `[ledger] anchor_url` through the same outbox and the same signed POST
(`AnchorWebhook`), sent when the chain is anchored rather than by a sender of their own.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx2
from anyio.abc import TaskStatus

from bastion.config import WebhookSettings
from bastion.ledger.anchors import Anchor, anchor_line
from bastion.models import OutboxItem, utcnow
from bastion.pipeline.events import announcements
from bastion.pipeline.seams import Ledger, Outbox

logger = logging.getLogger(__name__)

MAX_ATTEMPTS: Final = 12
"""Deliveries tried before giving up on an item (backoff 1 s doubling to `MAX_BACKOFF`: about an hour in all)."""
MAX_BACKOFF: Final = 600.0
CLAIM_SECONDS: Final = 60.0
"""How long a claimed item is left to its sender before another may send it (longer than a send takes)."""
POLL_SECONDS: Final = 5.0
"""How often a sender looks for items due that another instance added (its own wake it at once)."""
SEND_TIMEOUT: Final = 10.0
"""The most one delivery may take, from connecting to the end of the answer."""
BATCH: Final = 10
"""Items a sender claims at once: sent one after another, all well within CLAIM_SECONDS."""


def target_of(webhook: WebhookSettings) -> str:
    """The name the outbox knows a webhook by: a hash of its URL (which may be a secret)."""
    return "webhook-" + hashlib.sha256(webhook.url.encode()).hexdigest()[:16]


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-Bastion-Signature` value of `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={mac}"


async def post(
    http: httpx2.AsyncClient,
    url: str,
    body: bytes,
    *,
    event: str,
    event_id: int,
    secret: str | None,
    now: datetime,
) -> str | None:
    """POST one JSON `body` as every webhook message goes (signed with `secret`, when there is one, at `now`); None
    when the receiver took it (2xx), else what went wrong."""
    timestamp = int(now.timestamp())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "bastion-webhook",
        "X-Bastion-Event": event,
        "X-Bastion-Event-Id": str(event_id),
        "X-Bastion-Timestamp": str(timestamp),
    }
    if secret is not None:
        headers["X-Bastion-Signature"] = signature(secret, timestamp, body)
    try:
        response = await http.post(url, content=body, headers=headers, timeout=SEND_TIMEOUT)
    except httpx2.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if 200 <= response.status_code < 300:
        return None
    return f"HTTP {response.status_code}"


def backoff(attempts: int) -> float:
    """Seconds before the next try of an item that failed `attempts` times."""
    return float(min(2 ** max(attempts - 1, 0), MAX_BACKOFF))


class Notifier:
    """Fills the outbox from the change feed and delivers it to the configured webhooks."""

    def __init__(
        self,
        ledger: Ledger,
        webhooks: Sequence[WebhookSettings],
        *,
        http: httpx2.AsyncClient,
        inbox_url: str | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.ledger = ledger
        self.webhooks = {target_of(w): w for w in webhooks}
        self.http = http
        self.inbox_url = inbox_url.rstrip("/") if inbox_url else None
        self._clock = clock
        self._wake = {target: anyio.Event() for target in self.webhooks}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled. Started (`task_status`) once the filler knows where each webhook resumes, so every
        event committed after that is delivered."""
        if not self.webhooks:
            task_status.started()
            await anyio.sleep_forever()
        starts = {target: await self.ledger.outbox.last_event(target) for target in self.webhooks}
        now = self.ledger.changes.cursor
        resume = {target: now if last is None else last for target, last in starts.items()}
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._fill, resume)
            for target in self.webhooks:
                tg.start_soon(self._send_due, target, name=f"webhook sender {target}")
            task_status.started()

    async def _fill(self, resume: dict[str, int]) -> None:
        async for announcement in announcements(self.ledger, after=min(resume.values())):
            body = json.dumps(announcement.json(), separators=(",", ":"), ensure_ascii=False)
            for target, webhook in self.webhooks.items():
                wanted = announcement.id > resume[target] and announcement.name in webhook.events
                if wanted and await self.ledger.outbox.enqueue(target, announcement.id, body, now=self._clock()):
                    self._wake[target].set()

    async def _send_due(self, target: str) -> None:
        """One webhook's sender (see the module docstring)."""
        outbox = self.ledger.outbox
        while True:
            now = self._clock()
            items = await outbox.claim(target, now=now, until=now + timedelta(seconds=CLAIM_SECONDS), limit=BATCH)
            for item in items:
                await self._deliver(item)
            if items:
                continue
            due = await outbox.next_due(target)
            wait = POLL_SECONDS if due is None else (due - self._clock()).total_seconds()
            with anyio.move_on_after(max(0.0, min(wait, POLL_SECONDS))):
                await self._wake[target].wait()
            self._wake[target] = anyio.Event()

    async def _deliver(self, item: OutboxItem) -> None:
        webhook = self.webhooks.get(item.target)
        if webhook is None:  # removed from the configuration since it was added
            await self.ledger.outbox.retry(item.id, at=None, error="this webhook is no longer configured")
            return
        error: str | None = f"no answer within {SEND_TIMEOUT:g} s"
        try:
            with anyio.move_on_after(SEND_TIMEOUT):
                error = await self._post(webhook, item)
        except anyio.get_cancelled_exc_class():  # stopping: the item is due again at once, for the next sender
            with anyio.CancelScope(shield=True):
                await self.ledger.outbox.retry(item.id, at=self._clock(), error="interrupted: Bastion stopped")
            raise
        except Exception as exc:  # supervisor of one delivery: whatever failed, the item is retried
            logger.exception("delivering event %d to a webhook failed unexpectedly", item.event_id)
            error = f"{type(exc).__name__}: {exc}"
        with anyio.CancelScope(shield=True):  # a ledger write: its outcome is recorded even while stopping
            await self._record(item, error)

    async def _record(self, item: OutboxItem, error: str | None) -> None:
        if error is None:
            await self.ledger.outbox.delivered(item.id, now=self._clock())
            return
        attempts = item.attempts + 1
        if attempts >= MAX_ATTEMPTS:
            logger.warning(
                "gave up delivering event %d to %s after %d attempts: %s", item.event_id, item.target, attempts, error
            )
            await self.ledger.outbox.retry(item.id, at=None, error=error)
            return
        logger.info("delivering event %d to %s failed (%s); retrying", item.event_id, item.target, error)
        at = self._clock() + timedelta(seconds=backoff(attempts))
        await self.ledger.outbox.retry(item.id, at=at, error=error)

    async def _post(self, webhook: WebhookSettings, item: OutboxItem) -> str | None:
        """Send one item; None when the receiver took it (2xx), else what went wrong."""
        event = json.loads(item.body)
        link = self._link(event)
        if webhook.format == "slack":
            payload: dict[str, Any] = {"text": slack_text(event, link)}
        else:
            payload = event | {"link": link}
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        return await post(
            self.http,
            webhook.url,
            body,
            event=str(event["event"]),
            event_id=item.event_id,
            secret=webhook.secret.get_secret_value() if webhook.secret is not None else None,
            now=self._clock(),
        )

    def _link(self, event: dict[str, Any]) -> str | None:
        if self.inbox_url is None:
            return None
        return f"{self.inbox_url}/invocations/{event['invocation']['id']}"


_HEADLINES: Final = {
    "approval_requested": "waits for an approver",
    "approval_recorded": "has an approval and waits for another",
    "approval_decided": "was decided",
    "invocation_finished": "finished",
    "drift_detected": "was called with a drifted definition",
}


def slack_text(event: dict[str, Any], link: str | None) -> str:
    """A Slack message (mrkdwn) for one event: the tool, what happened, who asked, and the link to the inbox."""
    invocation = event["invocation"]
    tool = f"<{link}|{invocation['tool']}>" if link else f"`{invocation['tool']}`"
    status = invocation["status"]
    who = invocation.get("principal") or "an anonymous host"
    approvals = event.get("approvals")
    progress = f" · {approvals['summary']}" if approvals else ""
    headline = _HEADLINES.get(event["event"], event["event"])
    return f"{tool} {headline} ({status}, {invocation['risk']}) · asked by {who}{progress}"


ANCHOR_EVENT: Final = "audit_anchor"
"""`X-Bastion-Event` of an anchor's message."""


def anchor_target(url: str) -> str:
    """The name the outbox knows an anchor webhook by: a hash of its URL, as for the event webhooks."""
    return "anchor-" + hashlib.sha256(url.encode()).hexdigest()[:16]


def shown_url(url: str) -> str:
    """`url` as logs and messages name it: scheme, host, port and path, without credentials or query."""
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname or ""
    port = f":{parts.port}" if parts.port is not None else ""
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))


class AnchorWebhook:
    """POSTs signed anchors of the audit chain (bastion.ledger.anchors) to `[ledger] anchor_url`, through the
    ledger's outbox, so that neither a receiver that is down nor a restart loses one.

    Each anchor is added to the outbox under its chain position (the same head anchored twice, by two instances or
    by `serve` and the CLI, is one message), then every anchor due is sent in order, oldest first, one at a time:
    the JSON line `anchor_file` gets, signed as a `json` webhook's body (`X-Bastion-Signature`, with
    `[ledger] anchor_secret`), `X-Bastion-Event: audit_anchor`, `X-Bastion-Event-Id` its position. The first that
    fails ends the round, logged with the URL and what to check; it stays due, and is sent first at the next
    anchoring. Anchors are never given up on: a missing one would leave a stretch of history unanchored.
    """

    def __init__(
        self, outbox: Outbox, url: str, secret: str, *, http: httpx2.AsyncClient, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.outbox = outbox
        self.url = url
        self.target = anchor_target(url)
        self._secret = secret
        self.http = http
        self._clock = clock

    async def send(self, made: Anchor | None) -> str | None:
        """Add `made` to the outbox (when there is one), then deliver what is due; None when all of it was
        delivered, else what went wrong."""
        if made is not None:
            await self.outbox.enqueue(self.target, made.position, anchor_line(made), now=self._clock())
        while True:
            now = self._clock()
            items = await self.outbox.claim(self.target, now=now, until=now + timedelta(seconds=CLAIM_SECONDS), limit=1)
            if not items:
                return None
            error = await self._deliver(items[0])
            if error is not None:
                return error

    async def _deliver(self, item: OutboxItem) -> str | None:
        error: str | None = f"no answer within {SEND_TIMEOUT:g} s"
        try:
            with anyio.move_on_after(SEND_TIMEOUT):
                error = await post(
                    self.http,
                    self.url,
                    item.body.encode(),
                    event=ANCHOR_EVENT,
                    event_id=item.event_id,
                    secret=self._secret,
                    now=self._clock(),
                )
        except anyio.get_cancelled_exc_class():  # stopping: the anchor is due again at once, for the next anchoring
            with anyio.CancelScope(shield=True):
                await self.outbox.retry(item.id, at=self._clock(), error="interrupted: Bastion stopped")
            raise
        except Exception as exc:  # supervisor of one delivery: whatever failed, the anchor is kept and retried
            logger.exception("delivering the anchor of position %d failed unexpectedly", item.event_id)
            error = f"{type(exc).__name__}: {exc}"
        with anyio.CancelScope(shield=True):  # a ledger write: its outcome is recorded even while stopping
            if error is None:
                await self.outbox.delivered(item.id, now=self._clock())
                logger.info("sent the anchor of position %d to %s", item.event_id, shown_url(self.url))
                return None
            await self.outbox.retry(item.id, at=self._clock(), error=error)
        logger.warning(
            "the anchor of position %d was not delivered to %s (%s); it is kept in the ledger's outbox and sent again "
            "at the next anchoring: check that the receiver is up and answers 2xx, and [ledger] anchor_url and "
            "anchor_secret",
            item.event_id,
            shown_url(self.url),
            error,
        )
        return error
