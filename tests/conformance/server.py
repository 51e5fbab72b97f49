"""A conformance fixture MCP server: everything the official suite's server scenarios call.

`python -m tests.conformance.server` serves it over stdio (how Bastion mounts it, unprefixed);
`--transport http --port N` serves streamable HTTP on 127.0.0.1 at `/mcp`, with DNS-rebinding
protection, and prints `listening on http://127.0.0.1:PORT` on stderr once it accepts connections
(`--port 0` picks a free port).

Names and shapes follow the scenario sources of `@modelcontextprotocol/conformance` (the version
`tests/conformance/run.py` pins), which check exact tool, resource and prompt names. The server speaks
both protocol eras. The suite's client speaks 2025-11-25, where sampling and elicitation are
server-to-client requests sent inside the originating call. A 2026-07-28 connection (Bastion's
connector negotiates it) has no server-to-client requests, so there the same tools ask with an
`InputRequiredResult` and read the answer from the client's retry.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import socket
import struct
import sys
import warnings
import wave
import zlib
from typing import Any, Final, TypeVar

import anyio
import mcp_types as types
import uvicorn
from mcp import MCPError
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

Context = ServerRequestContext[Any]
AnswerT = TypeVar("AnswerT", types.CreateMessageResult, types.ElicitResult)

NAME: Final = "bastion-conformance-fixture"
INPUT_KEY: Final = "conformance"
"""The key of the one input request a 2026-07-28 tool call asks for."""
LOG_LEVELS: Final = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def _red_pixel_png() -> str:
    """A 1x1 red PNG, base64: the "minimal test image" the scenarios ask for."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte, then one red pixel
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def _silent_wav() -> str:
    """10 ms of 8 kHz mono silence as a WAV file, base64: the "minimal test audio file"."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(1)
        audio.setframerate(8000)
        audio.writeframes(b"\x80" * 80)
    return base64.b64encode(buffer.getvalue()).decode()


PNG: Final = _red_pixel_png()
WAV: Final = _silent_wav()


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _image() -> types.ImageContent:
    return types.ImageContent(type="image", data=PNG, mime_type="image/png")


def _object(properties: dict[str, Any] | None = None, required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties or {}}
    if required:
        schema["required"] = required
    return schema


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


JSON_SCHEMA_2020_12: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}
"""The json-schema-2020-12 scenario checks that `$schema`, `$defs` and `additionalProperties` survive."""

TOOLS: Final = [
    types.Tool(name="test_simple_text", description="Return one text item.", input_schema=_object()),
    types.Tool(name="test_image_content", description="Return one PNG image item.", input_schema=_object()),
    types.Tool(name="test_audio_content", description="Return one WAV audio item.", input_schema=_object()),
    types.Tool(name="test_embedded_resource", description="Return one embedded text resource.", input_schema=_object()),
    types.Tool(
        name="test_multiple_content_types",
        description="Return a text, an image and an embedded resource item.",
        input_schema=_object(),
    ),
    types.Tool(
        name="test_tool_with_logging",
        description="Send three info log messages about 50 ms apart, then return.",
        input_schema=_object(),
    ),
    types.Tool(name="test_error_handling", description="Always fail with an isError result.", input_schema=_object()),
    types.Tool(
        name="test_tool_with_progress",
        description="Report progress 0, 50 and 100 of 100 about 50 ms apart, then return.",
        input_schema=_object(),
    ),
    types.Tool(
        name="test_sampling",
        description="Ask the client's LLM to answer a prompt (sampling) and return its answer.",
        input_schema=_object({"prompt": _string("The prompt to send to the LLM")}, ["prompt"]),
    ),
    types.Tool(
        name="test_elicitation",
        description="Ask the user for a username and an email (elicitation) and return the answer.",
        input_schema=_object({"message": _string("The message to show the user")}, ["message"]),
    ),
    types.Tool(
        name="test_elicitation_sep1034_defaults",
        description="Elicit a form whose fields of every primitive type carry defaults (SEP-1034).",
        input_schema=_object(),
    ),
    types.Tool(
        name="test_elicitation_sep1330_enums",
        description="Elicit a form with the five enum field variants of SEP-1330.",
        input_schema=_object(),
    ),
    types.Tool(
        name="json_schema_2020_12_tool",
        description="Tool with JSON Schema 2020-12 features",
        input_schema=JSON_SCHEMA_2020_12,
    ),
]

USER_SCHEMA: Final[dict[str, Any]] = _object(
    {"username": _string("User's response"), "email": _string("User's email address")}, ["username", "email"]
)
DEFAULTS_SCHEMA: Final[dict[str, Any]] = _object(
    {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    }
)
ENUMS_SCHEMA: Final[dict[str, Any]] = _object(
    {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    }
)

STATIC_TEXT: Final = "This is the content of the static text resource."
WATCHED = "test://watched-resource"
RESOURCES: Final = [
    types.Resource(
        uri="test://static-text",
        name="static-text",
        description="A static text resource.",
        mime_type="text/plain",
    ),
    types.Resource(
        uri="test://static-binary",
        name="static-binary",
        description="A static binary resource (a 1x1 PNG).",
        mime_type="image/png",
    ),
    types.Resource(
        uri=WATCHED,
        name="watched-resource",
        description="A resource clients may subscribe to.",
        mime_type="text/plain",
    ),
    types.Resource(
        uri="test://example-resource",
        name="example-resource",
        description="The resource the embedded-resource prompt embeds.",
        mime_type="text/plain",
    ),
]
TEMPLATE: Final = types.ResourceTemplate(
    uri_template="test://template/{id}/data",
    name="template-data",
    description="JSON data for any id.",
    mime_type="application/json",
)
TEMPLATE_URI: Final = re.compile(r"^test://template/(?P<id>[^/]+)/data$")

PROMPTS: Final = [
    types.Prompt(name="test_simple_prompt", description="A prompt without arguments."),
    types.Prompt(
        name="test_prompt_with_arguments",
        description="A prompt that repeats its two arguments.",
        arguments=[
            types.PromptArgument(name="arg1", description="First test argument", required=True),
            types.PromptArgument(name="arg2", description="Second test argument", required=True),
        ],
    ),
    types.Prompt(
        name="test_prompt_with_embedded_resource",
        description="A prompt that embeds a resource.",
        arguments=[types.PromptArgument(name="resourceUri", description="URI of the resource to embed", required=True)],
    ),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image."),
]
ARG1_COMPLETIONS: Final = ("paris", "park", "party", "test", "testValue1")


class ConformanceFixture:
    """The fixture's state (log level, resource subscriptions) and the low-level server over it.

    The low-level `Server` rather than `MCPServer`: the scenarios check exact wire shapes, such as a
    tool input schema kept verbatim and elicitation schemas with `oneOf` and `enumNames`.
    """

    def __init__(self) -> None:
        self.log_level: types.LoggingLevel = "debug"
        """Set by `logging/setLevel`; one level for every session (the suite runs one scenario at a time)."""
        self.subscriptions: set[str] = set()
        self.server: Server[Any] = Server(
            NAME,
            version="1.0.0",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_resource_templates,
            on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            on_subscriptions_listen=ListenHandler(InMemorySubscriptionBus()),
            on_list_prompts=self._list_prompts,
            on_get_prompt=self._get_prompt,
            on_completion=self._complete,
            get_tool_input_schema=lambda name: next((t.input_schema for t in TOOLS if t.name == name), None),
        )
        # Registered directly: the constructor keyword warns that logging is deprecated as of 2026-07-28,
        # but the handshake-era scenarios test it.
        self.server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self._set_level)

    # -- tools

    async def _list_tools(self, ctx: Context, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def _call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        arguments = params.arguments or {}
        match params.name:
            case "test_simple_text":
                return _result(_text("This is a simple text response for testing."))
            case "test_image_content":
                return _result(_image())
            case "test_audio_content":
                return _result(types.AudioContent(type="audio", data=WAV, mime_type="audio/wav"))
            case "test_embedded_resource":
                return _result(
                    _embedded("test://embedded-resource", "text/plain", "This is an embedded resource content.")
                )
            case "test_multiple_content_types":
                data = json.dumps({"test": "data", "value": 123})
                return _result(
                    _text("Multiple content types test:"),
                    _image(),
                    _embedded("test://mixed-content-resource", "application/json", data),
                )
            case "test_tool_with_logging":
                return await self._log_three_steps(ctx)
            case "test_error_handling":
                return types.CallToolResult(
                    content=[_text("This tool intentionally returns an error for testing")], is_error=True
                )
            case "test_tool_with_progress":
                for progress in (0.0, 50.0, 100.0):
                    await ctx.session.report_progress(progress, 100.0)
                return _result(_text("Progress reporting completed"))
            case "test_sampling":
                return await _sample(ctx, params, str(arguments.get("prompt", "")))
            case "test_elicitation":
                return await _elicit(ctx, params, str(arguments.get("message", "")), USER_SCHEMA)
            case "test_elicitation_sep1034_defaults":
                return await _elicit(ctx, params, "Please review and update the form fields", DEFAULTS_SCHEMA)
            case "test_elicitation_sep1330_enums":
                return await _elicit(ctx, params, "Please pick from each kind of choice", ENUMS_SCHEMA)
            case "json_schema_2020_12_tool":
                return _result(_text(f"Received: {json.dumps(arguments, sort_keys=True)}"))
            case _:
                raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")

    async def _log_three_steps(self, ctx: Context) -> types.CallToolResult:
        for message in ("Tool execution started", "Tool processing data", "Tool execution completed"):
            await self._log(ctx, "info", message)
        return _result(_text("Tool with logging executed successfully"))

    async def _log(self, ctx: Context, level: types.LoggingLevel, message: str) -> None:
        """Send a log message on this call's stream, if `logging/setLevel` lets this level through.

        On 2026-07-28 the SDK delivers it only when the request's `_meta` opted in to the level.
        """
        if LOG_LEVELS.index(level) < LOG_LEVELS.index(self.log_level):
            return
        with warnings.catch_warnings():
            # Deprecated as of 2026-07-28 (SEP-2577), still part of the suite. The warning fires when the
            # coroutine is created, so this block covers it without spanning an await.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            sending = ctx.session.send_log_message(level, message, logger=NAME, related_request_id=ctx.request_id)
        await sending

    async def _set_level(self, ctx: Context, params: types.SetLevelRequestParams) -> types.EmptyResult:
        self.log_level = params.level
        return types.EmptyResult()

    # -- resources

    async def _list_resources(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=RESOURCES)

    async def _list_resource_templates(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[TEMPLATE])

    async def _read_resource(self, ctx: Context, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = params.uri
        contents: types.TextResourceContents | types.BlobResourceContents
        if uri == "test://static-text":
            contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text=STATIC_TEXT)
        elif uri == "test://static-binary":
            contents = types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG)
        elif uri == WATCHED:
            contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text="Watched resource content.")
        elif uri == "test://example-resource":
            contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text="Example resource content.")
        elif match := TEMPLATE_URI.match(uri):
            item = match["id"]
            data = json.dumps({"id": item, "templateTest": True, "data": f"Data for ID: {item}"})
            contents = types.TextResourceContents(uri=uri, mime_type="application/json", text=data)
        else:
            raise MCPError(types.INVALID_PARAMS, f"Resource not found: {uri}")
        return types.ReadResourceResult(contents=[contents])

    async def _subscribe(self, ctx: Context, params: types.SubscribeRequestParams) -> types.EmptyResult:
        if params.uri != WATCHED:
            raise MCPError(types.INVALID_PARAMS, f"Resource cannot be subscribed to: {params.uri}")
        self.subscriptions.add(params.uri)
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: Context, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        self.subscriptions.discard(params.uri)
        return types.EmptyResult()

    # -- prompts and completion

    async def _list_prompts(self, ctx: Context, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=PROMPTS)

    async def _get_prompt(self, ctx: Context, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        arguments = params.arguments or {}
        match params.name:
            case "test_simple_prompt":
                messages = [_user(_text("This is a simple prompt for testing."))]
            case "test_prompt_with_arguments":
                arg1, arg2 = _required(arguments, "arg1"), _required(arguments, "arg2")
                messages = [_user(_text(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"))]
            case "test_prompt_with_embedded_resource":
                uri = _required(arguments, "resourceUri")
                messages = [
                    _user(_embedded(uri, "text/plain", "Embedded resource content for testing.")),
                    _user(_text("Please process the embedded resource above.")),
                ]
            case "test_prompt_with_image":
                messages = [_user(_image()), _user(_text("Please analyze the image above."))]
            case _:
                raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name}")
        return types.GetPromptResult(messages=messages)

    async def _complete(self, ctx: Context, params: types.CompleteRequestParams) -> types.CompleteResult:
        values: list[str] = []
        ref, argument = params.ref, params.argument
        if (
            isinstance(ref, types.PromptReference)
            and ref.name == "test_prompt_with_arguments"
            and argument.name == "arg1"
        ):
            values = [value for value in ARG1_COMPLETIONS if value.startswith(argument.value)]
        elif isinstance(ref, types.ResourceTemplateReference) and ref.uri == TEMPLATE.uri_template:
            values = [value for value in ("1", "123", "42") if value.startswith(argument.value)]
        return types.CompleteResult(completion=types.Completion(values=values, total=len(values), has_more=False))


def _result(*content: types.ContentBlock) -> types.CallToolResult:
    return types.CallToolResult(content=list(content))


def _embedded(uri: str, mime_type: str, text: str) -> types.EmbeddedResource:
    return types.EmbeddedResource(
        type="resource", resource=types.TextResourceContents(uri=uri, mime_type=mime_type, text=text)
    )


def _user(content: types.TextContent | types.ImageContent | types.EmbeddedResource) -> types.PromptMessage:
    return types.PromptMessage(role="user", content=content)


def _required(arguments: dict[str, str], name: str) -> str:
    if name not in arguments:
        raise MCPError(types.INVALID_PARAMS, f"Missing required argument: {name}")
    return arguments[name]


async def _sample(
    ctx: Context, params: types.CallToolRequestParams, prompt: str
) -> types.CallToolResult | types.InputRequiredResult:
    request = types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=_text(prompt))], max_tokens=100
        )
    )
    answer = await _ask_client(ctx, params, request, types.CreateMessageResult)
    if isinstance(answer, types.InputRequiredResult | types.CallToolResult):
        return answer
    said = answer.content.text if isinstance(answer.content, types.TextContent) else f"[{answer.content.type}]"
    return _result(_text(f"LLM response: {said}"))


async def _elicit(
    ctx: Context, params: types.CallToolRequestParams, message: str, schema: dict[str, Any]
) -> types.CallToolResult | types.InputRequiredResult:
    request = types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))
    answer = await _ask_client(ctx, params, request, types.ElicitResult)
    if isinstance(answer, types.InputRequiredResult | types.CallToolResult):
        return answer
    content = json.dumps(answer.content, sort_keys=True)
    return _result(_text(f"User response: action={answer.action}, content={content}"))


async def _ask_client(
    ctx: Context,
    params: types.CallToolRequestParams,
    request: types.CreateMessageRequest | types.ElicitRequest,
    answer_type: type[AnswerT],
) -> AnswerT | types.InputRequiredResult | types.CallToolResult:
    """Ask the calling client for input within this call, in the connection's era.

    Handshake era: a server-to-client request related to this call, so it rides this call's stream.
    2026-07-28: an `InputRequiredResult` the first time, the client's answer on its retry. A client
    that refuses (no capability, an error) yields an `isError` result.
    """
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        answer = (params.input_responses or {}).get(INPUT_KEY)
        if answer is None:
            return types.InputRequiredResult(input_requests={INPUT_KEY: request})
        # The responses map is a union; revalidate to the type this request expects.
        return answer_type.model_validate(answer.model_dump(by_alias=True, exclude_none=True))
    try:
        return await ctx.session.send_request(
            request, answer_type, metadata=ServerMessageMetadata(related_request_id=ctx.request_id)
        )
    except MCPError as exc:
        return types.CallToolResult(
            content=[_text(f"The client did not answer {request.method}: {exc}")], is_error=True
        )


async def serve_stdio(fixture: ConformanceFixture) -> None:
    async with stdio_server() as (read, write):
        await fixture.server.run(read, write, fixture.server.create_initialization_options())


async def serve_http(fixture: ConformanceFixture, port: int) -> None:
    """Streamable HTTP on 127.0.0.1 (`/mcp`); the SDK turns DNS-rebinding protection on for loopback."""
    app = fixture.server.streamable_http_app(host="127.0.0.1")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # so asyncio sets NODELAY
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)  # bound and listening before the line is printed: early connections queue
    print(f"listening on http://127.0.0.1:{listener.getsockname()[1]}", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[listener])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance.server", description="The MCP conformance fixture server."
    )
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--port", type=int, default=0, help="HTTP port on 127.0.0.1 (0 picks a free one)")
    options = parser.parse_args(argv)
    fixture = ConformanceFixture()
    if options.transport == "stdio":
        anyio.run(serve_stdio, fixture)
    else:
        anyio.run(serve_http, fixture, options.port)


if __name__ == "__main__":
    main()
