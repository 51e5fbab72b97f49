"""The host server's resources, prompts, completion and logging handlers.

They answer from the gateway's merged content catalog and forward to the source that owns a URI or
prompt; during start-up they first wait for the sources still starting (`Gateway.first_listings`).
Policy gates tools only: reading a resource, getting a prompt or completing an argument is neither
gated nor recorded in the ledger.

Resource subscriptions are counted per host: a 2025-era connection subscribes with
`resources/subscribe` (and hears `notifications/resources/updated` on its connection); a
2026-07-28 host names URIs in a `subscriptions/listen` stream, which holds its subscriptions for as
long as the stream is open. The gateway subscribes a source once, for all hosts together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError

from bastion.errors import BastionError, NotFound, UpstreamError
from bastion.pipeline.gateway import Gateway
from bastion.server.pages import Pager, page_cursor
from bastion.server.relay import set_host_log_level
from bastion.server.sdk import connection_of

logger = logging.getLogger(__name__)


def mcp_error(exc: BastionError) -> MCPError:
    """The one translation of a refusal of a resources, prompts or completion request into a protocol error.

    A downstream's own error passes through unchanged; an unknown URI or prompt is invalid params
    (as the SDK's own servers answer, SEP-2164); anything else is an internal error naming its class.
    """
    cause = exc.__cause__
    if isinstance(exc, UpstreamError) and isinstance(cause, MCPError):
        return MCPError(cause.error.code, cause.error.message, cause.error.data)
    data = {"class": exc.error_class, "retriable": exc.retriable}
    if isinstance(exc, NotFound):
        return MCPError(types.INVALID_PARAMS, exc.message, data)
    return MCPError(types.INTERNAL_ERROR, f"{exc.error_class}: {exc.message}", data)


@dataclass(eq=False)
class _Subscriber:
    """A 2025-era host connection and the URIs it subscribed to."""

    session: ServerSession
    uris: set[str] = field(default_factory=set)


class ContentHandlers:
    """`resources/*`, `prompts/*`, `completion/complete`, `logging/setLevel` and `subscriptions/listen`."""

    def __init__(self, gateway: Gateway, bus: InMemorySubscriptionBus) -> None:
        self.gateway = gateway
        self._bus = bus
        self._listen = ListenHandler(bus)
        self._subscribers: dict[int, _Subscriber] = {}
        self._resource_pages = Pager[types.Resource]("resources")
        self._template_pages = Pager[types.ResourceTemplate]("resource templates")
        self._prompt_pages = Pager[types.Prompt]("prompts")
        gateway.content.on_resource_updated(self.resource_updated)

    def end_listen_streams(self) -> None:
        """End every open `subscriptions/listen` stream with its final result (the server is stopping)."""
        self._listen.close()

    async def list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        await self.gateway.first_listings()
        resources, next_cursor = self._resource_pages.page(self.gateway.content.catalog.resources, page_cursor(params))
        return types.ListResourcesResult(resources=resources, next_cursor=next_cursor)

    async def list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        await self.gateway.first_listings()
        templates, next_cursor = self._template_pages.page(self.gateway.content.catalog.templates, page_cursor(params))
        return types.ListResourceTemplatesResult(resource_templates=templates, next_cursor=next_cursor)

    async def read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        await self.gateway.first_listings()
        try:
            return await self.gateway.content.read_resource(params.uri)
        except BastionError as exc:
            raise mcp_error(exc) from exc

    async def list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        await self.gateway.first_listings()
        prompts, next_cursor = self._prompt_pages.page(self.gateway.content.catalog.prompts, page_cursor(params))
        return types.ListPromptsResult(prompts=prompts, next_cursor=next_cursor)

    async def get_prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        await self.gateway.first_listings()
        try:
            return await self.gateway.content.get_prompt(params.name, params.arguments)
        except BastionError as exc:
            raise mcp_error(exc) from exc

    async def complete(
        self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        await self.gateway.first_listings()
        try:
            return await self.gateway.content.complete(params.ref, params.argument, params.context)
        except BastionError as exc:
            raise mcp_error(exc) from exc

    async def set_logging_level(
        self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        """2025-era: the lowest level of downstream log messages this connection hears from now on."""
        set_host_log_level(ctx, params.level)
        return types.EmptyResult()

    # -- subscriptions -------------------------------------------------------------------------------

    async def subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        """2025-era `resources/subscribe`: idempotent per connection, released when it closes."""
        await self.gateway.first_listings()
        connection = connection_of(ctx)
        key = id(connection)
        subscriber = self._subscribers.get(key)
        if subscriber is not None and params.uri in subscriber.uris:
            return types.EmptyResult()
        try:
            await self.gateway.content.subscribe(params.uri)
        except BastionError as exc:
            raise mcp_error(exc) from exc
        if subscriber is None:
            subscriber = self._subscribers[key] = _Subscriber(ctx.session)
            connection.exit_stack.push_async_callback(self._release, key)
        subscriber.uris.add(params.uri)
        return types.EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        subscriber = self._subscribers.get(id(connection_of(ctx)))
        if subscriber is not None and params.uri in subscriber.uris:
            subscriber.uris.discard(params.uri)
            await self.gateway.content.unsubscribe(params.uri)
        return types.EmptyResult()

    async def _release(self, key: int) -> None:
        subscriber = self._subscribers.pop(key, None)
        for uri in subscriber.uris if subscriber else ():
            await self.gateway.content.unsubscribe(uri)

    async def listen(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """2026-07-28 `subscriptions/listen`: the stream's resource URIs are subscribed while it is open.

        A URI nothing routes to is still honoured, as the SDK does: it simply never fires.
        """
        held: list[str] = []
        try:
            for uri in params.notifications.resource_subscriptions or ():
                try:
                    await self.gateway.content.subscribe(uri)
                except BastionError as exc:
                    logger.info("listen: not subscribing %s (%s)", uri, exc.message)
                    continue
                held.append(uri)
            return await self._listen(ctx, params)
        finally:
            with anyio.CancelScope(shield=True):
                for uri in held:
                    await self.gateway.content.unsubscribe(uri)

    async def resource_updated(self, uri: str) -> None:
        """A subscribed resource changed: tell the hosts that subscribed to it, in both eras."""
        await self._bus.publish(ResourceUpdated(uri))
        for subscriber in list(self._subscribers.values()):
            if uri not in subscriber.uris:
                continue
            try:
                await subscriber.session.send_resource_updated(uri)
            except Exception:  # one broken host connection must not stop the others from hearing
                logger.exception("could not tell a host that %s was updated", uri)
