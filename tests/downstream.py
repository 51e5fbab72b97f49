"""Reusable in-process downstream MCP servers for tests.

`FixtureServer` is a low-level `mcp.server.Server` whose tool list can change at runtime (it then
announces `tools/list_changed` in both protocol eras), which records every call with its request
`_meta`, and whose tools exercise timeouts (`sleep` waits for an event), progress, error responses
and `_meta` stripping. `StreamTarget` connects clients to it over memory streams, one server run per
connection, can play a handshake-era-only server, and can kill the current connection and refuse new
ones, to simulate a dying downstream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import MCPError
from mcp.client import Transport
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.message import SessionMessage
from mcp_types import METHOD_NOT_FOUND, ErrorData, JSONRPCError, JSONRPCRequest

FAILURE_CODE = -32050
"""The JSON-RPC error code the `fail` tool answers with."""


def _object_schema(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def default_tools() -> list[types.Tool]:
    """The fixture's starting tool list."""
    return [
        types.Tool(
            name="echo",
            title="Echo",
            description="Return the arguments it was given.",
            input_schema=_object_schema({"text": {"type": "string"}}, ["text"]),
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(
            name="sleep",
            description="Wait until the test releases it.",
            input_schema=_object_schema({}),
        ),
        types.Tool(
            name="progress",
            description="Report three progress steps, then finish.",
            input_schema=_object_schema({}),
        ),
        types.Tool(
            name="fail",
            description="Answer with a JSON-RPC error.",
            input_schema=_object_schema({}),
            annotations=types.ToolAnnotations(destructive_hint=True),
        ),
        types.Tool(
            name="shapes",
            title="Schema features",
            description="A tool whose schemas use JSON Schema 2020-12 features.",
            input_schema={
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {"point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}]}},
                "properties": {
                    "at": {"$ref": "#/$defs/point"},
                    "kind": {"enum": ["circle", "square"], "default": "circle"},
                    "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                },
                "required": ["at"],
                "unevaluatedProperties": False,
            },
            output_schema=_object_schema({"area": {"type": "number", "minimum": 0}}, ["area"]),
            annotations=types.ToolAnnotations(
                title="Shapes",
                read_only_hint=False,
                destructive_hint=False,
                idempotent_hint=True,
                open_world_hint=False,
            ),
            _meta={"example.com/owner": "tests"},
        ),
    ]


@dataclass(frozen=True)
class RecordedCall:
    """One `tools/call` the fixture received."""

    name: str
    arguments: dict[str, Any]
    meta: dict[str, Any]


class _ListChangedServer(Server[Any]):
    """Advertises `tools.listChanged` to handshake-era clients too (gotcha G1)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, extensions
        )


class FixtureServer:
    """An in-process downstream with a mutable tool list; see the module docstring."""

    def __init__(self, *, name: str = "fixture", page_size: int | None = None) -> None:
        """`page_size` splits `tools/list` into pages of that many tools."""
        self.tools = default_tools()
        self.listing_error: MCPError | None = None
        """When set, `tools/list` answers with this error."""
        self.listing_gate: anyio.Event | None = None
        """When set, `tools/list` waits for this event before answering."""
        self.calls: list[RecordedCall] = []
        self.list_requests = 0
        self.page_size = page_size
        self.sleep_started = anyio.Event()
        self.release = anyio.Event()
        self._bus = InMemorySubscriptionBus()
        self._legacy_sessions: list[ServerSession] = []
        self.server = _ListChangedServer(
            name,
            version="1.0.0",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self._bus),
            get_tool_input_schema=self._input_schema,
        )
        self.server.add_notification_handler("notifications/initialized", types.NotificationParams, self._initialized)

    async def set_tools(self, tools: list[types.Tool]) -> None:
        """Replace the tool list and announce the change to every connected client, in both eras."""
        self.tools = tools
        await self._bus.publish(ToolsListChanged())
        for session in self._legacy_sessions:
            await session.send_tool_list_changed()

    async def _initialized(self, ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        self._legacy_sessions.append(ctx.session)

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        return next((tool.input_schema for tool in self.tools if tool.name == name), None)

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self.list_requests += 1
        if self.listing_gate is not None:
            await self.listing_gate.wait()
        if self.listing_error is not None:
            raise self.listing_error
        if self.page_size is None:
            return types.ListToolsResult(tools=self.tools)
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + self.page_size
        next_cursor = str(end) if end < len(self.tools) else None
        return types.ListToolsResult(tools=self.tools[start:end], next_cursor=next_cursor)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        meta = dict(params.meta or {})
        arguments = params.arguments or {}
        self.calls.append(RecordedCall(params.name, arguments, meta))
        match params.name:
            case "echo":
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=str(arguments.get("text", "")))],
                    structured_content={"echo": arguments},
                    _meta={"io.modelcontextprotocol/related-task": "t-1", "example.com/kept": 1},
                )
            case "sleep":
                self.sleep_started.set()
                await self.release.wait()
                return types.CallToolResult(content=[types.TextContent(type="text", text="released")])
            case "progress":
                for step in (1.0, 2.0, 3.0):
                    await ctx.session.report_progress(step, 3.0, f"step {step:g}")
                return types.CallToolResult(content=[types.TextContent(type="text", text="done")])
            case "fail":
                raise MCPError(FAILURE_CODE, "deliberate failure")
            case _:
                raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")


class StreamTarget:
    """A connector `target` factory serving a `Server` over memory streams, with a kill switch.

    Each call returns a fresh `Transport`; each connection runs the server on its own streams.
    `legacy_only` answers `server/discover` with Method not found before the server sees it, as a
    handshake-era server does, so `mode="auto"` clients fall back to `initialize`.
    `kill()` ends the live connection as a crashed process would (the client reads EOF);
    while `refusing` is set, new connections fail with `ConnectionRefusedError`.
    """

    def __init__(self, server: Server[Any], *, legacy_only: bool = False) -> None:
        self.server = server
        self.legacy_only = legacy_only
        self.refusing = False
        self.connections = 0
        self._live: anyio.CancelScope | None = None

    def __call__(self) -> Transport:
        return self._connect()

    def kill(self, *, refuse: bool = True) -> None:
        """End the live connection (if any) and, by default, refuse new ones until `revive()`."""
        self.refusing = refuse
        if self._live is not None:
            self._live.cancel()

    def revive(self) -> None:
        self.refusing = False

    def _connect(self) -> AbstractAsyncContextManager[Any]:
        @asynccontextmanager
        async def connect() -> AsyncIterator[Any]:
            if self.refusing:
                raise ConnectionRefusedError("the fixture downstream is down")
            self.connections += 1
            to_server, from_client = anyio.create_memory_object_stream[SessionMessage | Exception](1)
            to_client, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](1)
            async with to_server, from_server, anyio.create_task_group() as tg:
                await tg.start(self._serve, from_client, to_client)
                try:
                    yield from_server, to_server
                finally:
                    if self._live is not None:
                        self._live.cancel()

        return connect()

    async def _serve(
        self,
        from_client: MemoryObjectReceiveStream[SessionMessage | Exception],
        to_client: MemoryObjectSendStream[SessionMessage | Exception],
        *,
        task_status: TaskStatus[None],
    ) -> None:
        to_server, server_reads = anyio.create_memory_object_stream[SessionMessage | Exception](1)
        with anyio.CancelScope() as scope, from_client, to_client:
            self._live = scope
            task_status.started()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._relay, from_client, to_server, to_client.clone())
                    await self.server.run(server_reads, to_client, self.server.create_initialization_options())
            finally:
                if self._live is scope:
                    self._live = None
        # Leaving the block closed every stream towards the client: it reads EOF, as when a child dies.

    async def _relay(
        self,
        from_client: MemoryObjectReceiveStream[SessionMessage | Exception],
        to_server: MemoryObjectSendStream[SessionMessage | Exception],
        to_client: MemoryObjectSendStream[SessionMessage | Exception],
    ) -> None:
        async with to_server, to_client:
            async for item in from_client:
                message = item.message if isinstance(item, SessionMessage) else None
                if self.legacy_only and isinstance(message, JSONRPCRequest) and message.method == "server/discover":
                    error = ErrorData(code=METHOD_NOT_FOUND, message="Method not found")
                    await to_client.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=message.id, error=error)))
                else:
                    await to_server.send(item)
