"""The MCP host server: one low-level `Server` over the Gateway, for both protocol eras.

Tools go through the gateway's call pipeline; resources, prompts, completion and logging are
relayed (`content.py`); what a downstream logs or asks during a call reaches the host request that
made it (`relay.py`). Handshake-era hosts (2025-11-25 and before) learn of listing changes through
`notifications/*/list_changed` on their connection; 2026-07-28 hosts through `subscriptions/listen`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.connection import Connection
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.session import ServerSession
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    PromptsListChanged,
    ResourcesListChanged,
    ServerEvent,
    ToolsListChanged,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.types import Scope

from bastion import __version__
from bastion.errors import BastionError
from bastion.models import CallContext, Invocation, caller_session_id
from bastion.pipeline.approvals import AwaitingInput
from bastion.pipeline.gateway import Gateway
from bastion.pipeline.listings import ListingKind
from bastion.server import inline, tasks
from bastion.server.auth import principal_of
from bastion.server.content import ContentHandlers
from bastion.server.errors import tool_result
from bastion.server.pages import Pager, page_cursor
from bastion.server.relay import HostRequests, background
from bastion.server.sdk import connection_of
from bastion.sources.seam import HostRequest, ProgressFn

logger = logging.getLogger(__name__)

_SESSION_KEY = "bastion.session_id"

_LIST_CHANGED: dict[ListingKind, ServerEvent] = {
    "tools": ToolsListChanged(),
    "resources": ResourcesListChanged(),
    "prompts": PromptsListChanged(),
}

ALL_CHANGES = NotificationOptions(tools_changed=True, resources_changed=True, prompts_changed=True)


class GatewayServer(Server[Any]):
    """A low-level Server that always advertises `listChanged` (the SDK's HTTP manager passes no options)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or ALL_CHANGES, experimental_capabilities, extensions
        )


class HostServer:
    """Serves the gateway's catalog to hosts and tells them when it changes."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        profile: str | None = None,
        principal: str | None = None,
        session_id: str | None = None,
    ) -> None:
        """`session_id` fixes the session for a transport that carries exactly one host (stdio)."""
        self.gateway = gateway
        self.profile = profile
        self.principal = principal
        self.session_id = session_id
        self._stdio_context: CallContext | None = None
        self._bus = InMemorySubscriptionBus()
        self._handshake_sessions: dict[int, tuple[ServerSession, Connection]] = {}
        self._http_sessions: dict[str, Connection] = {}
        """The initialized handshake-era connections of streamable HTTP, by their `Mcp-Session-Id`."""
        self._relays = HostRequests(answer_timeout=gateway.config.settings.limits.call_timeout_seconds)
        self._tool_pages = Pager[types.Tool]("tools")
        self._answering = 0
        self._answered = anyio.Event()
        self._content = content = ContentHandlers(gateway, self._bus)
        self.server = GatewayServer(
            "bastion",
            version=__version__,
            title="Bastion",
            instructions=(
                "Bastion gates every tool call by policy and records it in a ledger. "
                "A refused call returns isError with structuredContent.error.class naming why."
            ),
            lifespan=background,
            get_tool_input_schema=self._input_schema,
            on_list_tools=self._list_tools,
            on_list_resources=content.list_resources,
            on_list_resource_templates=content.list_resource_templates,
            on_read_resource=content.read_resource,
            on_subscribe_resource=content.subscribe,
            on_unsubscribe_resource=content.unsubscribe,
            on_subscriptions_listen=content.listen,
            on_list_prompts=content.list_prompts,
            on_get_prompt=content.get_prompt,
            on_completion=content.complete,
        )
        # Registered as a request handler, not with `on_call_tool`: its answer may also be a task handle (SEP-2663).
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._answer_call)
        # Not the constructor argument, which warns: logging is deprecated at 2026-07-28, yet 2025-era hosts use it.
        self.server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, content.set_logging_level)
        self.server.add_notification_handler("notifications/initialized", types.NotificationParams, self._initialized)
        # Seals the request_state of inline approvals on 2026-07-28, so a host cannot forge one.
        self.server.middleware.append(
            RequestStateBoundary(RequestStateSecurity.ephemeral(), default_audience="bastion")
        )
        # SEP-2663 tasks: `tasks/get` and the like, and the extension in the capabilities (see `_call_tool`).
        tasks.install(
            self.server,
            tasks.TasksExtension(gateway.ledger, context_of=self._context, declares_output=self.declares_output),
        )
        gateway.on_listings_changed(self.notify_listings_changed)

    async def calls_answered(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) until no `tools/call` is being answered: a stopping server waits for
        the answers of the calls the gateway let finish or cancelled, so they reach their hosts."""
        with anyio.move_on_after(timeout):
            while self._answering:
                await self._answered.wait()

    def end_streams(self) -> None:
        """End the hosts' open `subscriptions/listen` streams gracefully, so a stopping server can close."""
        self._content.end_listen_streams()

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        entry = self.gateway.catalog.get(name)
        return entry.tool.input_schema if entry else None

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        await self.gateway.first_listings()
        tools, next_cursor = self._tool_pages.page(self.gateway.tools, page_cursor(params))
        return types.ListToolsResult(tools=tools, next_cursor=next_cursor)

    async def _answer_call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        with self.answering():
            return await self._call_tool(ctx, params)

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Count a `tools/call` being answered for the block (`calls_answered` waits for none to be left)."""
        self._answering += 1
        try:
            yield
        finally:
            self._answering -= 1
            if self._answered.statistics().tasks_waiting:  # `calls_answered` waits: tell it, and start afresh
                self._answered.set()
                self._answered = anyio.Event()

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        """Run one call through the gateway. A call held for approval blocks (with heartbeats), or asks the host's
        user inline, or, for a request that declares the tasks extension, answers at once with a task handle."""
        context = self._context(ctx)
        progress_token = ctx.meta.get("progress_token") if ctx.meta else None

        async def relay_progress(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

        on_progress = relay_progress if progress_token is not None else None
        arguments = params.arguments or {}
        logger.debug("tools/call %s arguments %s", params.name, arguments)  # redacted by the CLI's log handler
        if self.gateway.catalog.get(params.name) is None:  # maybe a tool of a source still starting
            await self.gateway.first_listings()
        tasked = False
        try:
            hashed = self.gateway.hash_args(arguments)
            if params.request_state is not None:
                parked = self._relays.resumed(params, hashed)
                if parked is not None:
                    return await parked.outcome(ctx, params.input_responses)
                invocation_id, answer = inline.resumed_invocation(params, hashed)
                if answer is not None:
                    await inline.apply(self.gateway, invocation_id, answer, context.session_id)
                return await self.gateway.resume(invocation_id, on_progress=on_progress)
            asking = self._inline_approval(ctx, context)
            tasked = asking is None and tasks.declared(ctx)

            async def ask(invocation: Invocation) -> None:
                await inline.ask_over_back_channel(ctx, self.gateway, invocation, arguments)

            async def call(relay: HostRequest, on_progress: ProgressFn | None) -> types.CallToolResult:
                return await self.gateway.call(
                    params.name,
                    arguments,
                    context,
                    on_progress=on_progress,
                    on_pending=ask if asking == "back_channel" else None,
                    defer=asking == "in_result" or tasked,
                    relay=relay,
                )

            return await self._relays.run(
                ctx, call, tool=params.name, args_hash=hashed, with_progress=progress_token is not None
            )
        except AwaitingInput as waiting:
            if tasked:
                return tasks.created(waiting.invocation)
            return inline.input_required(waiting.invocation, arguments)
        except BastionError as exc:
            return tool_result(exc, version=ctx.protocol_version, output_schema=self.declares_output(params.name))
        except Exception as exc:  # the MCP boundary translator: a bug must still answer the host
            logger.exception("tools/call %s failed unexpectedly", params.name)
            internal = BastionError(f"internal error: {exc}")
            return tool_result(internal, version=ctx.protocol_version, output_schema=self.declares_output(params.name))

    def declares_output(self, name: str) -> bool:
        """Whether the tool the host called declares an outputSchema (its error results must then not carry
        structuredContent that breaks it)."""
        entry = self.gateway.catalog.get(name)
        return entry is not None and entry.tool.output_schema is not None

    def _context(self, ctx: ServerRequestContext[Any]) -> CallContext:
        """Who calls: the token's principal on HTTP (and its profile, for agent tokens), else this door's."""
        scope = getattr(ctx.request, "scope", None)
        principal, profile = self._caller(scope)
        if self.session_id is not None:
            return CallContext(session_id=self.session_id, profile=profile, principal=principal, local_session=True)
        session_id, local = _session_id(ctx, principal)
        return CallContext(session_id=session_id, profile=profile, principal=principal, local_session=local)

    def http_context(self, scope: Scope, session_id: str) -> CallContext:
        """Who calls in a handshake-era HTTP request of the session `session_id`, as `_context` tells it."""
        principal, profile = self._caller(scope)
        return CallContext(
            session_id=self.session_id or session_id, profile=profile, principal=principal, local_session=True
        )

    def modern_http_context(self, scope: Scope, client_info: Any) -> CallContext:
        """Who calls in a 2026-07-28 HTTP request (`client_info`: its envelope's), as `_context` tells it."""
        principal, profile = self._caller(scope)
        try:
            name = types.Implementation.model_validate(client_info).name if client_info is not None else None
        except ValidationError:  # the SDK's server reads a malformed client info as none
            name = None
        return CallContext(session_id=caller_session_id(principal, name), profile=profile, principal=principal)

    def _caller(self, scope: Scope | None) -> tuple[str | None, str | None]:
        """The principal and profile of a request: its token's on HTTP (and its profile, for agent tokens), else
        this door's."""
        token = principal_of(scope) if scope is not None else None
        principal = token.name if token is not None else self.principal
        profile = token.profile if token is not None and token.profile else self.profile
        return principal, profile

    def stdio_context(self) -> CallContext:
        """Who calls over stdio: this door's one host, in its one session (one frozen context for all its calls)."""
        assert self.session_id is not None, "a host server serving stdio has its session fixed"
        context = self._stdio_context
        if context is None:
            context = CallContext(
                session_id=self.session_id, profile=self.profile, principal=self.principal, local_session=True
            )
            self._stdio_context = context
        return context

    def http_session(self, session_id: str) -> Connection | None:
        """The initialized handshake-era streamable-HTTP connection with this `Mcp-Session-Id`."""
        return self._http_sessions.get(session_id)

    def sole_handshake_connection(self) -> Connection | None:
        """The handshake-era host connection once it is initialized, when this door serves exactly one (stdio)."""
        if len(self._handshake_sessions) != 1:
            return None
        ((_, connection),) = self._handshake_sessions.values()
        return connection

    def _inline_approval(
        self, ctx: ServerRequestContext[Any], context: CallContext
    ) -> Literal["back_channel", "in_result"] | None:
        """How to ask the host's user inline, if this session's profile wants it and may have it."""
        profiles = self.gateway.config.policy.profiles
        profile = profiles.get(context.profile) if context.profile else None
        if profile is None or not profile.inline_approval or context.principal is not None:
            return None
        if not inline.supports_elicitation(ctx):
            return None
        return "in_result" if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else "back_channel"

    async def _initialized(self, ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        """Remember handshake-era sessions so catalog changes reach them, and forget them when they close."""
        connection = connection_of(ctx)
        key = id(connection)
        self._handshake_sessions[key] = (ctx.session, connection)
        connection.exit_stack.callback(self._handshake_sessions.pop, key, None)
        if connection.session_id:
            self._http_sessions[connection.session_id] = connection
            connection.exit_stack.callback(self._http_sessions.pop, connection.session_id, None)

    async def notify_listings_changed(self, kinds: frozenset[ListingKind]) -> None:
        """Tell every host which listings changed: on the subscription bus and on each handshake-era connection."""
        for kind in sorted(kinds):
            await self._bus.publish(_LIST_CHANGED[kind])
        for session, _ in list(self._handshake_sessions.values()):
            try:
                if "tools" in kinds:
                    await session.send_tool_list_changed()
                if "resources" in kinds:
                    await session.send_resource_list_changed()
                if "prompts" in kinds:
                    await session.send_prompt_list_changed()
            except Exception:  # one broken host connection must not stop the others from hearing
                logger.exception("could not notify a host of the catalog change")


def _session_id(ctx: ServerRequestContext[Any], principal: str | None) -> tuple[str, bool]:
    """The host session that limits count against, and whether only this process serves it.

    A transport session id when there is one (streamable HTTP, 2025-era: the session lives in this process);
    otherwise one minted per connection (stdio, SSE). A 2026-07-28 request has no session at all, so it is
    attributed to the caller's identity: its principal and client name (conservative: one agent, one budget),
    which other instances sharing the ledger count against too.
    """
    connection = connection_of(ctx)
    if connection.session_id:
        return connection.session_id, True
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        params = connection.client_params
        return caller_session_id(principal, params.client_info.name if params is not None else None), False
    session_id = connection.state.get(_SESSION_KEY)
    if session_id is None:
        session_id = connection.state[_SESSION_KEY] = secrets.token_hex(8)
    return str(session_id), True
