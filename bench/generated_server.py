"""A generated downstream MCP server for bench/scale.py: 50 tools with realistic schemas, over stdio.

Run as `python bench/generated_server.py INDEX`. The tools are CRUD-style operations (list, get,
create, update, delete) on ten kinds of record, described and shaped like a real service's API:
typed properties with descriptions, enums, formats, bounds and required fields, annotations by
verb. INDEX names the service, so 100 such servers give 100 distinct catalogs of 50 tools.
A call answers with a small JSON text; nothing is stored.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

RECORDS = {
    "issue": ("an issue in the tracker", {"title": "string", "body": "string", "labels": "tags", "priority": "level"}),
    "comment": ("a comment on an issue", {"issue_id": "id", "body": "string", "visibility": "visibility"}),
    "user": ("a user account", {"email": "email", "display_name": "string", "role": "role"}),
    "project": ("a project", {"name": "string", "description": "string", "visibility": "visibility"}),
    "file": ("a stored file", {"path": "string", "content_type": "string", "size_bytes": "count"}),
    "invoice": ("a customer invoice", {"customer_id": "id", "amount_cents": "count", "due_date": "date"}),
    "order": ("a sales order", {"customer_id": "id", "items": "tags", "status": "status"}),
    "ticket": ("a support ticket", {"subject": "string", "requester_email": "email", "priority": "level"}),
    "event": ("a calendar event", {"title": "string", "starts_at": "datetime", "ends_at": "datetime"}),
    "report": ("a saved analytics report", {"name": "string", "query": "string", "schedule": "schedule"}),
}
VERBS = ("list", "get", "create", "update", "delete")

FIELD_SCHEMAS: dict[str, dict[str, Any]] = {
    "string": {"type": "string", "minLength": 1, "maxLength": 4000},
    "id": {"type": "string", "pattern": "^[a-z0-9]{8,32}$"},
    "email": {"type": "string", "format": "email"},
    "date": {"type": "string", "format": "date"},
    "datetime": {"type": "string", "format": "date-time"},
    "count": {"type": "integer", "minimum": 0},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 64}, "maxItems": 50, "uniqueItems": True},
    "level": {"type": "string", "enum": ["low", "normal", "high", "urgent"], "default": "normal"},
    "visibility": {"type": "string", "enum": ["private", "internal", "public"], "default": "private"},
    "role": {"type": "string", "enum": ["viewer", "member", "admin"], "default": "member"},
    "status": {"type": "string", "enum": ["draft", "confirmed", "shipped", "cancelled"]},
    "schedule": {"type": "string", "enum": ["never", "daily", "weekly", "monthly"], "default": "never"},
}


def tools(index: int) -> list[types.Tool]:
    """The 50 tools of service number `index`."""
    service = f"service {index:03d}"
    found = []
    for record, (what, fields) in RECORDS.items():
        properties = {
            name: FIELD_SCHEMAS[kind] | {"description": f"The {name.replace('_', ' ')} of {what}."}
            for name, kind in fields.items()
        }
        record_id = {"type": "string", "pattern": "^[a-z0-9]{8,32}$", "description": f"The id of {what}."}
        for verb in VERBS:
            schema: dict[str, Any]
            if verb == "list":
                schema = {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "Full-text filter; empty matches everything."},
                        "page_size": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
                        "cursor": {"type": "string", "description": "The next_cursor of the previous page."},
                        "sort": {"type": "string", "enum": ["created", "updated", "name"], "default": "updated"},
                    },
                }
            elif verb in ("get", "delete"):
                schema = {"type": "object", "properties": {"id": record_id}, "required": ["id"]}
            elif verb == "create":
                schema = {"type": "object", "properties": properties, "required": list(fields)[:2]}
            else:
                schema = {"type": "object", "properties": {"id": record_id, **properties}, "required": ["id"]}
            schema["additionalProperties"] = False
            found.append(
                types.Tool(
                    name=f"{verb}_{record}s" if verb == "list" else f"{verb}_{record}",
                    title=f"{verb.capitalize()} {record}{'s' if verb == 'list' else ''} ({service})",
                    description=f"{verb.capitalize()} {what} in {service}. "
                    + {
                        "list": "Results are paginated and sorted; pass next_cursor back to continue.",
                        "get": "Returns every field of the record, or an error naming the missing id.",
                        "create": "Returns the new record with its generated id.",
                        "update": "Only the fields given change; returns the updated record.",
                        "delete": "This cannot be undone.",
                    }[verb],
                    input_schema=schema,
                    annotations=types.ToolAnnotations(
                        read_only_hint=verb in ("list", "get"),
                        destructive_hint=verb == "delete",
                        idempotent_hint=verb != "create",
                        open_world_hint=False,
                    ),
                )
            )
    return found


def create_server(index: int) -> Server[Any]:
    catalog = tools(index)

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=catalog)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        text = json.dumps({"service": index, "tool": params.name, "arguments": params.arguments or {}})
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    return Server(f"generated-{index:03d}", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve(index: int) -> None:
    server = create_server(index)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve, int(sys.argv[1]))
