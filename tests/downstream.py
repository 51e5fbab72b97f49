"""Reusable in-process downstream MCP servers for tests.

`FixtureServer` is a low-level `mcp.server.Server` whose tool list can change at runtime (it then
announces `tools/list_changed` in both protocol eras), which records every call with its request
`_meta`, and whose tools exercise timeouts (`sleep` waits for an event), progress, error responses,
`_meta` stripping and output-schema checks (`shapes` answers what the test sets). `ContentFixture`
adds resources (one text, one blob), a resource template, subscriptions, a prompt with arguments,
completion, logging, and tools that log, sample and elicit, each in the way of the protocol era the
client speaks. `StreamTarget` connects clients to it over
memory streams, one server run per connection, can play a handshake-era-only server, and can kill
the current connection and refuse new ones, to simulate a dying downstream.
`python -m tests.downstream` serves a `ContentFixture` over stdio, as a real subprocess.
"""

from __future__ import annotations

import json
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
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp_types import LOG_LEVEL_META_KEY, METHOD_NOT_FOUND, ErrorData, JSONRPCError, JSONRPCRequest
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

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
    """Advertises `listChanged` to handshake-era clients too: the SDK's streamable-HTTP session manager asks for the
    initialization options without `NotificationOptions`, which would tell them `tools.listChanged = false`."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options
            or NotificationOptions(tools_changed=True, resources_changed=True, prompts_changed=True),
            experimental_capabilities,
            extensions,
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
        self.shapes_output: dict[str, Any] | None = {"area": 2.0}
        """What `shapes` answers as structured content (its output schema wants a non-negative `area`)."""
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
    ) -> types.CallToolResult | types.InputRequiredResult:
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
            case "shapes":
                text = json.dumps(self.shapes_output)
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=text)], structured_content=self.shapes_output
                )
            case _:
                raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")


PROTOCOL_META = {"io.modelcontextprotocol/related-task": "t-1", "example.com/kept": 1}
"""A result `_meta` with one protocol-internal key (Bastion strips it) and one of the server's own."""

LOG_LEVELS: tuple[types.LoggingLevel, ...] = ("debug", "info", "notice", "warning", "error")
NAMES = ["alice", "albert", "bob"]


def content_tools() -> list[types.Tool]:
    """The tools `ContentFixture` adds: they log, sample and elicit."""
    return [
        types.Tool(
            name="chatty",
            description="Log one message at debug, info and warning, then finish.",
            input_schema=_object_schema({}),
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(
            name="sample",
            description="Ask the client's model to complete a prompt.",
            input_schema=_object_schema({"prompt": {"type": "string"}}, ["prompt"]),
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(
            name="ask",
            description="Ask the client's user for a name.",
            input_schema=_object_schema({}),
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
    ]


def content_resources() -> list[types.Resource]:
    return [
        types.Resource(uri="fixture://notes/readme", name="readme", title="Read me", mime_type="text/plain"),
        types.Resource(uri="fixture://blob", name="blob", mime_type="application/octet-stream"),
    ]


def content_templates() -> list[types.ResourceTemplate]:
    return [types.ResourceTemplate(uri_template="fixture://items/{id}", name="item", mime_type="text/plain")]


def content_prompts() -> list[types.Prompt]:
    return [
        types.Prompt(
            name="greet",
            description="Greet someone.",
            arguments=[
                types.PromptArgument(name="who", description="Whom to greet", required=True),
                types.PromptArgument(name="tone", description="How"),
            ],
        )
    ]


class ContentFixture(FixtureServer):
    """A `FixtureServer` that also offers resources, a template, subscriptions, prompts, completion and
    logging, and tools that log, sample and elicit. Everything it was asked is recorded."""

    def __init__(self, *, name: str = "fixture") -> None:
        super().__init__(name=name)
        self.tools = [*self.tools, *content_tools()]
        self.resources = content_resources()
        self.templates = content_templates()
        self.prompts = content_prompts()
        self.subscribed: set[str] = set()
        """URIs a 2025-era client subscribed to (2026-07-28 subscriptions live in listen streams)."""
        self.subscriptions_changed = anyio.Event()
        """Set (and replaced) whenever `subscribed` changes."""
        self.log_level: types.LoggingLevel | None = None
        """What `logging/setLevel` asked for (2025-era)."""
        self.log_opt_ins: list[str | None] = []
        """The `_meta` log level of each `chatty` call (2026-07-28)."""
        self.completions: list[types.CompleteRequestParams] = []
        self.prompt_requests: list[types.GetPromptRequestParams] = []
        self._subscribers: dict[int, ServerSession] = {}
        """One session per 2025-era connection that subscribed (keyed by the connection)."""
        add = self.server.add_request_handler
        add("resources/list", types.PaginatedRequestParams, self._list_resources)
        add("resources/templates/list", types.PaginatedRequestParams, self._list_templates)
        add("resources/read", types.ReadResourceRequestParams, self._read_resource)
        add("resources/subscribe", types.SubscribeRequestParams, self._subscribe)
        add("resources/unsubscribe", types.UnsubscribeRequestParams, self._unsubscribe)
        add("prompts/list", types.PaginatedRequestParams, self._list_prompts)
        add("prompts/get", types.GetPromptRequestParams, self._get_prompt)
        add("completion/complete", types.CompleteRequestParams, self._complete)
        add("logging/setLevel", types.SetLevelRequestParams, self._set_level)

    async def touch(self, uri: str) -> None:
        """Announce that `uri` changed to its subscribers, in both eras."""
        await self._bus.publish(ResourceUpdated(uri))
        if uri in self.subscribed:
            for session in self._subscribers.values():
                await session.send_resource_updated(uri)

    async def set_resources(self, resources: list[types.Resource]) -> None:
        self.resources = resources
        await self._bus.publish(ResourcesListChanged())
        for session in self._legacy_sessions:
            await session.send_resource_list_changed()

    async def set_prompts(self, prompts: list[types.Prompt]) -> None:
        self.prompts = prompts
        await self._bus.publish(PromptsListChanged())
        for session in self._legacy_sessions:
            await session.send_prompt_list_changed()

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=self.resources)

    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=self.templates)

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = params.uri
        contents: types.TextResourceContents | types.BlobResourceContents
        if uri == "fixture://notes/readme":
            contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text="read me")
        elif uri == "fixture://blob":
            contents = types.BlobResourceContents(uri=uri, mime_type="application/octet-stream", blob="AAEC")
        elif uri.startswith("fixture://items/"):
            contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text=f"item {uri.rsplit('/', 1)[1]}")
        else:
            raise MCPError(types.INVALID_PARAMS, "Resource not found", {"uri": uri})
        return types.ReadResourceResult(contents=[contents], _meta=PROTOCOL_META)

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        self.subscribed.add(params.uri)
        self._subscribers.setdefault(id(ctx.session._connection), ctx.session)
        self._subscriptions_changed()
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        self.subscribed.discard(params.uri)
        self._subscriptions_changed()
        return types.EmptyResult()

    def _subscriptions_changed(self) -> None:
        self.subscriptions_changed.set()
        self.subscriptions_changed = anyio.Event()

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=self.prompts)

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        self.prompt_requests.append(params)
        if params.name not in {p.name for p in self.prompts}:
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt {params.name}")
        arguments = params.arguments or {}
        text = f"Say hello to {arguments.get('who', 'nobody')}, {arguments.get('tone', 'warmly')}."
        message = types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))
        return types.GetPromptResult(description="A greeting", messages=[message], _meta=PROTOCOL_META)

    async def _complete(
        self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        self.completions.append(params)
        prefix = params.argument.value
        if isinstance(params.ref, types.PromptReference) and params.argument.name == "who":
            values = [n for n in NAMES if n.startswith(prefix)]
        elif isinstance(params.ref, types.ResourceTemplateReference):
            values = [i for i in ("1", "2", "3") if i.startswith(prefix)]
        else:
            values = []
        return types.CompleteResult(completion=types.Completion(values=values, total=len(values)), _meta=PROTOCOL_META)

    async def _set_level(
        self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        self.log_level = params.level
        return types.EmptyResult()

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        match params.name:
            case "chatty":
                self.calls.append(RecordedCall(params.name, params.arguments or {}, dict(params.meta or {})))
                await self._chatty(ctx, modern)
                return types.CallToolResult(content=[types.TextContent(type="text", text="chatted")])
            case "sample":
                return await self._sample(ctx, params, modern)
            case "ask":
                return await self._ask(ctx, params, modern)
        return await super()._call_tool(ctx, params)

    async def _chatty(self, ctx: ServerRequestContext[Any], modern: bool) -> None:
        """Log at debug, info and warning: on 2026-07-28 only at or above the request's opt-in level."""
        if modern:
            requested = (ctx.meta or {}).get(LOG_LEVEL_META_KEY)
            self.log_opt_ins.append(str(requested) if requested is not None else None)
            threshold = LOG_LEVELS.index(requested) if requested in LOG_LEVELS else len(LOG_LEVELS)
        else:
            threshold = LOG_LEVELS.index(self.log_level) if self.log_level in LOG_LEVELS else 0
        for level in ("debug", "info", "warning"):
            if LOG_LEVELS.index(level) < threshold:
                continue
            message = types.LoggingMessageNotification(
                params=types.LoggingMessageNotificationParams(level=level, logger="fixture", data=f"{level} line")
            )
            await ctx.session.send_notification(message, related_request_id=ctx.request_id)

    async def _sample(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams, modern: bool
    ) -> types.CallToolResult | types.InputRequiredResult:
        prompt = str((params.arguments or {}).get("prompt", ""))
        request = types.CreateMessageRequest(
            params=types.CreateMessageRequestParams(
                messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
                max_tokens=50,
            )
        )
        if modern:
            answer = (params.input_responses or {}).get("sample")
            if answer is None:
                return types.InputRequiredResult(input_requests={"sample": request}, request_state="sampling")
        else:
            answer = await ctx.session.send_request(
                request, types.CreateMessageResult, metadata=ServerMessageMetadata(related_request_id=ctx.request_id)
            )
        assert isinstance(answer, types.CreateMessageResult)
        assert isinstance(answer.content, types.TextContent)
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"sampled: {answer.content.text}")])

    async def _ask(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams, modern: bool
    ) -> types.CallToolResult | types.InputRequiredResult:
        schema: types.ElicitRequestedSchema = {
            "type": "object",
            "properties": {"name": {"type": "string", "title": "Name"}},
            "required": ["name"],
        }
        if modern:
            answer = (params.input_responses or {}).get("name")
            if answer is None:
                form = types.ElicitRequestFormParams(message="What is your name?", requested_schema=schema)
                return types.InputRequiredResult(
                    input_requests={"name": types.ElicitRequest(params=form)}, request_state="eliciting"
                )
        else:
            answer = await ctx.session.elicit_form("What is your name?", schema, related_request_id=ctx.request_id)
        assert isinstance(answer, types.ElicitResult)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"elicited: {answer.action} {answer.content}")]
        )


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


async def serve_stdio(fixture: FixtureServer) -> None:
    """Serve `fixture` over this process's stdin and stdout (a fixture run as a connector's real child process)."""
    async with stdio_server() as (read_stream, write_stream):
        await fixture.server.run(read_stream, write_stream, fixture.server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve_stdio, ContentFixture())
