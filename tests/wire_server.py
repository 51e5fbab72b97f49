"""A stdio downstream for the express lane's tests (`python -m tests.wire_server`): the content fixture's tools
(tests/downstream.py: echo, progress, fail, shapes, chatty, sample, ask, sleep) and a few whose answers are hard to
forward: a result nested deeply, one off its own output schema, one with an integer beyond 64 bits, one whose
structured content is an array. Run by Bastion as a real child process, so its calls go over the wire path
(bastion.sources.mcp.wire)."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server import ServerRequestContext

from tests.downstream import ContentFixture, serve_stdio

DEPTH = 100
"""Deep, yet within what the SDK's client parses (pydantic's JSON parser stops near 128 levels)."""

HUGE = 2**70 + 1
"""Beyond 64 bits, and no float is equal to it."""


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


class WireFixture(ContentFixture):
    def __init__(self) -> None:
        super().__init__(name="wire-fixture")
        no_arguments = {"type": "object", "properties": {}}
        self.tools = [
            *self.tools,
            types.Tool(name="deep", description="A result nested very deeply.", input_schema=no_arguments),
            types.Tool(
                name="off_schema",
                description="Structured content that breaks its own output schema.",
                input_schema=no_arguments,
                output_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            ),
            types.Tool(
                name="routed",
                description="An argument a host also sends as an HTTP header (`x-mcp-header`).",
                input_schema={"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}},
            ),
            types.Tool(
                name="trace",
                description="The W3C trace context the request carried in its _meta.",
                input_schema=no_arguments,
            ),
            types.Tool(
                name="listed",
                description="Structured content that is an array (2026-07-28 allows it; 2025-era hosts take objects).",
                input_schema=no_arguments,
            ),
            types.Tool(
                name="huge",
                description="An integer beyond 64 bits, and the arguments.",
                input_schema={"type": "object"},
            ),
        ]

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        text = types.TextContent(type="text", text=params.name)
        match params.name:
            case "deep":
                return types.CallToolResult(content=[text], structured_content={"deep": _nested(DEPTH)})
            case "off_schema":
                return types.CallToolResult(content=[text], structured_content={"n": "not a number"})
            case "trace":
                meta: dict[str, Any] = dict(params.meta or {})
                context = {key: meta[key] for key in ("traceparent", "tracestate") if key in meta}
                return types.CallToolResult(content=[text], structured_content=context)
            case "listed":
                return types.CallToolResult(content=[text], structured_content=[1, 2, 3])
            case "huge":
                return types.CallToolResult(
                    content=[text], structured_content={"huge": HUGE, "arguments": params.arguments or {}}
                )
        return await super()._call_tool(ctx, params)


if __name__ == "__main__":
    anyio.run(serve_stdio, WireFixture())
