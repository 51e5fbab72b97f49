"""The MCP front door: one low-level `Server` over the Gateway, for both protocol eras.

Handshake-era hosts (2025-11-25 and before) learn of catalog changes through
`notifications/tools/list_changed` on their connection; 2026-07-28 hosts through
`subscriptions/listen`. Both are served here.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import mcp_types as types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.connection import Connection
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from bastion import __version__
from bastion.errors import BastionError
from bastion.gateway import Gateway
from bastion.models import CallContext

logger = logging.getLogger(__name__)

_SESSION_KEY = "bastion.session_id"


class GatewayServer(Server[Any]):
    """A low-level Server that always advertises `tools.listChanged` (the SDK's HTTP manager passes no options)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, extensions
        )


class FrontDoor:
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
        self._bus = InMemorySubscriptionBus()
        self._handshake_sessions: dict[int, ServerSession] = {}
        self.server = GatewayServer(
            "bastion",
            version=__version__,
            title="Bastion",
            instructions=(
                "Bastion gates every tool call by policy and records it in a ledger. "
                "A refused call returns isError with structuredContent.error.class naming why."
            ),
            get_tool_input_schema=self._input_schema,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self._bus),
        )
        self.server.add_notification_handler("notifications/initialized", types.NotificationParams, self._initialized)
        gateway.on_catalog_changed(self.notify_tools_changed)

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        entry = self.gateway.catalog.get(name)
        return entry.tool.input_schema if entry else None

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.gateway.tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        context = CallContext(
            session_id=self.session_id or _session_id(ctx, self.principal),
            profile=self.profile,
            principal=self.principal,
        )
        progress_token = ctx.meta.get("progress_token") if ctx.meta else None

        async def relay_progress(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

        try:
            return await self.gateway.call(
                params.name,
                params.arguments,
                context,
                on_progress=relay_progress if progress_token is not None else None,
            )
        except BastionError as exc:
            return error_result(exc)
        except Exception as exc:  # the MCP boundary translator: a bug must still answer the host
            logger.exception("tools/call %s failed unexpectedly", params.name)
            return error_result(BastionError(f"internal error: {exc}"))

    async def _initialized(self, ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        """Remember handshake-era sessions so catalog changes reach them, and forget them when they close."""
        connection = _connection(ctx)
        key = id(connection)
        self._handshake_sessions[key] = ctx.session
        connection.exit_stack.callback(self._handshake_sessions.pop, key, None)

    async def notify_tools_changed(self) -> None:
        await self._bus.publish(ToolsListChanged())
        for session in list(self._handshake_sessions.values()):
            try:
                await session.send_tool_list_changed()
            except Exception:  # one broken host connection must not stop the others from hearing
                logger.exception("could not notify a host of the catalog change")


def error_result(exc: BastionError) -> types.CallToolResult:
    """The one translation of a refusal into what the host sees (DESIGN.md §7)."""
    error: dict[str, Any] = {
        "class": exc.error_class,
        "message": exc.message,
        "invocation_id": exc.invocation_id,
        "retriable": exc.retriable,
    }
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{exc.error_class}: {exc.message}")],
        structured_content={"error": error},
        is_error=True,
    )


def _connection(ctx: ServerRequestContext[Any]) -> Connection:
    # The SDK offers no public path from a low-level handler to its Connection (notes G8); this is
    # the one place that reaches for it.
    connection: Connection = ctx.session._connection
    return connection


def _session_id(ctx: ServerRequestContext[Any], principal: str | None) -> str:
    """The host session that limits count against.

    A transport session id when there is one (streamable HTTP, 2025-era); otherwise one minted per
    connection (stdio, SSE). A 2026-07-28 request has no session at all, so it is attributed to the
    caller's identity: its principal and client name (conservative: one agent, one budget).
    """
    connection = _connection(ctx)
    if connection.session_id:
        return connection.session_id
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        params = connection.client_params
        client = params.client_info.name if params is not None else "unknown-client"
        return f"{principal or 'anonymous'}/{client}"
    session_id = connection.state.get(_SESSION_KEY)
    if session_id is None:
        session_id = connection.state[_SESSION_KEY] = secrets.token_hex(8)
    return str(session_id)


async def serve_stdio(front: FrontDoor) -> None:
    """Serve one host over this process's stdin/stdout until it closes them."""
    async with stdio_server() as (read_stream, write_stream):
        await front.server.run(read_stream, write_stream, front.server.create_initialization_options())
