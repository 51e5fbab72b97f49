"""Resource subscriptions on one downstream, kept across reconnects.

`ResourceWatch` holds the URIs hosts want updates for. On a 2025-era connection each one is a
`resources/subscribe` request (replayed after a reconnect); on 2026-07-28, where that request no
longer exists, one `subscriptions/listen` stream carries every watched URI and is reopened whenever
the set changes. Either way the downstream's `notifications/resources/updated` reaches the client's
message handler, which hands the URI to `updated()`; a task forwards it to the subscriber.
"""

from __future__ import annotations

import logging
from typing import Final

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import Client, MCPError
from mcp.client.subscriptions import Subscription, SubscriptionLost
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from bastion.errors import ConnectorUnavailable, UpstreamError
from bastion.sources.seam import UpdatedFn

logger = logging.getLogger(__name__)


UPDATE_BUFFER: Final = 256
"""Updates waiting to be forwarded; beyond this they are dropped (each is only a hint to re-read)."""


class ResourceWatch:
    """The URIs a connector keeps subscribed on its downstream, and where their updates go."""

    def __init__(self, source_id: str, *, timeout: float) -> None:
        """`timeout` bounds waiting for a 2026-07-28 downstream to acknowledge a changed set."""
        self._source_id = source_id
        self._timeout = timeout
        self._watched: dict[str, UpdatedFn] = {}
        self._client: Client | None = None
        self._updates: MemoryObjectSendStream[str] | None = None
        # 2026-07-28: the generation of the watched set wanted, and the one the open stream carries.
        self._wanted = 0
        self._applied = 0
        self._changed = anyio.Event()
        self._acknowledged = anyio.Event()

    def watching(self, uri: str) -> bool:
        return uri in self._watched

    async def attach(self, client: Client, tg: anyio.abc.TaskGroup) -> None:
        """A connection is ready: subscribe it to every watched URI and start forwarding updates."""
        send, receive = anyio.create_memory_object_stream[str](UPDATE_BUFFER)
        self._updates = send
        tg.start_soon(self._forward, receive)
        self._client = client
        if _modern(client):
            self._applied = 0
            await tg.start(self._keep_listening, client)
            return
        for uri in list(self._watched):
            try:
                await _legacy_request(client, types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)))
            except MCPError as exc:
                logger.warning("connector %s: could not subscribe again to %s (%s)", self._source_id, uri, exc.message)

    def detach(self) -> None:
        """The connection is gone; the watched URIs are kept for the next one."""
        self._client = None
        if self._updates is not None:
            self._updates.close()
            self._updates = None

    def updated(self, uri: str) -> None:
        """The downstream says `uri` changed (called from the message handler: never blocks)."""
        if self._updates is None:
            return
        try:
            self._updates.send_nowait(uri)
        except anyio.WouldBlock:
            logger.warning("connector %s: too many resource updates waiting; dropped one for %s", self._source_id, uri)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def subscribe(self, uri: str, on_updated: UpdatedFn) -> None:
        """Watch `uri`; on a live connection, return once the downstream has taken the subscription."""
        first = uri not in self._watched
        self._watched[uri] = on_updated
        client = self._client
        if client is None or not first:
            return
        try:
            _require_subscriptions(client, self._source_id)
            if _modern(client):
                await self._apply()
            else:
                await _legacy_request(client, types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)))
        except MCPError as exc:
            self._watched.pop(uri, None)
            raise UpstreamError(f"{self._source_id} refused the subscription to {uri}: {exc.message}") from exc
        except BaseException:
            self._watched.pop(uri, None)
            raise

    async def unsubscribe(self, uri: str) -> None:
        if self._watched.pop(uri, None) is None:
            return
        client = self._client
        if client is None:
            return
        if _modern(client):
            await self._apply()
            return
        try:
            await _legacy_request(client, types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri)))
        except MCPError as exc:
            logger.info("connector %s: unsubscribing from %s failed (%s)", self._source_id, uri, exc.message)

    async def _apply(self) -> None:
        """2026-07-28: have the listen stream reopened with the current set, and wait for its acknowledgment."""
        self._wanted += 1
        wanted = self._wanted
        self._changed.set()
        try:
            with anyio.fail_after(self._timeout):
                while self._applied < wanted:
                    acknowledged = self._acknowledged
                    await acknowledged.wait()
        except TimeoutError as exc:
            raise ConnectorUnavailable(
                f"connector {self._source_id} did not acknowledge a resource subscription within {self._timeout:g}s"
            ) from exc

    def _acknowledge(self, generation: int) -> None:
        if generation > self._applied:
            self._applied = generation
            self._acknowledged.set()
            self._acknowledged = anyio.Event()

    async def _keep_listening(self, client: Client, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """2026-07-28: one listen stream for every watched URI, reopened when the set changes.

        Started once the stream for the set watched at connect time is acknowledged. The stream's
        frames are teed to the message handler, which does the reacting; here they are only drained.
        A lost stream is left to the connection's own watcher, which notices the connection dying.
        """
        started = False
        while True:
            changed = self._changed = anyio.Event()
            generation, uris = self._wanted, sorted(self._watched)
            try:
                if uris:
                    async with client.listen(resource_subscriptions=uris) as subscription:
                        self._acknowledge(generation)
                        if not started:
                            started = True
                            task_status.started()
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(_drain, subscription)
                            await changed.wait()
                            tg.cancel_scope.cancel()
                    continue
            except (SubscriptionLost, MCPError) as exc:
                logger.info("connector %s: resource subscription stream ended (%s)", self._source_id, exc)
            self._acknowledge(generation)
            if not started:
                started = True
                task_status.started()
            await changed.wait()

    async def _forward(self, receive: MemoryObjectReceiveStream[str]) -> None:
        async with receive:
            async for uri in receive:
                on_updated = self._subscriber(uri)
                if on_updated is None:
                    continue
                try:
                    await on_updated(uri)
                except Exception:  # supervisor: a faulty subscriber must not stop the forwarding
                    logger.exception("connector %s: forwarding an update of %s failed", self._source_id, uri)

    def _subscriber(self, uri: str) -> UpdatedFn | None:
        """Who watches `uri`: its own subscriber, else (an update of a sub-resource) the longest watched prefix's."""
        exact = self._watched.get(uri)
        if exact is not None:
            return exact
        prefixes = [watched for watched in self._watched if uri.startswith(watched)]
        return self._watched[max(prefixes, key=len)] if prefixes else None


def _modern(client: Client) -> bool:
    return client.protocol_version in MODERN_PROTOCOL_VERSIONS


def _require_subscriptions(client: Client, source_id: str) -> None:
    resources = client.server_capabilities.resources
    if resources is None or not resources.subscribe:
        raise UpstreamError(f"connector {source_id} does not offer resource subscriptions")


async def _legacy_request(client: Client, request: types.SubscribeRequest | types.UnsubscribeRequest) -> None:
    # Sent as a plain request: the SDK's subscribe helpers are deprecated (they do not exist on 2026-07-28).
    await client.session.send_request(request, types.EmptyResult)


async def _drain(subscription: Subscription) -> None:
    async for _event in subscription:
        pass
