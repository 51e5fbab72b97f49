"""`/approver/mcp`: an MCP endpoint for approvers who decide from their own MCP host.

Six tools: `list_pending` (each call with the scopes it may be approved with), `show_invocation`, `approve` (scoped
"once", "session", "hour" or "always", a standing grant narrowed by an optional condition), `deny` (with a reason),
`list_grants` and `revoke_grant`. Only owner and admin tokens reach it: anonymous callers get 401 and agent tokens
403 before any MCP message is read, so an agent can never approve anything here, not even by connecting. Every
decision goes through bastion.pipeline.authority, which refuses an approver's own call as everywhere.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from bastion import __version__
from bastion.errors import BastionError, Forbidden, InvalidArguments, Unauthenticated
from bastion.models import SCOPES, Principal, utcnow
from bastion.pipeline.authority import decide, visible_invocation
from bastion.pipeline.documents import (
    approvals_json,
    decided_json,
    grant_json,
    invocation_detail_json,
    pending_invocations,
)
from bastion.pipeline.gateway import Gateway
from bastion.server.auth import principal_of
from bastion.server.errors import http_response, tool_result
from bastion.terms import DEFAULT_LIMIT

logger = logging.getLogger(__name__)

APPROVER_PATH: Final = "/approver/mcp"

_ID: Final = {"type": "string", "description": "An invocation id, or a unique prefix of one (6+ characters)."}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str], read_only: bool) -> types.Tool:
    return types.Tool(
        name=name,
        description=description,
        input_schema={"type": "object", "properties": properties, "required": required, "additionalProperties": False},
        annotations=types.ToolAnnotations(read_only_hint=read_only, destructive_hint=False),
    )


TOOLS: Final = [
    _tool(
        "list_pending",
        "The calls waiting for an approver, newest first, with redacted args, drift and the preview of what each "
        "would do (a file's diff, the request it sends, a composite's steps, a plugin's dry run).",
        {},
        [],
        True,
    ),
    _tool(
        "show_invocation", "One invocation with its event timeline.", {"invocation_id": _ID}, ["invocation_id"], True
    ),
    _tool(
        "approve",
        'Approve a pending call: it runs at once. A scope beyond "once" (one of the call\'s `scopes` in '
        'list_pending) also lets later calls of the same action through: "session" in that host session, "hour" by '
        'the same caller for an hour, "always" by anyone (until it expires, is revoked, or the tool drifts). `when` '
        "narrows that to later calls whose arguments meet a CEL condition, e.g. "
        "normpath(args.path).startsWith('/srv/public/').",
        {
            "invocation_id": _ID,
            "note": {"type": "string"},
            "scope": {"type": "string", "enum": list(SCOPES), "default": "once"},
            "when": {"type": "string", "description": "A CEL condition on later calls' arguments (args)."},
        },
        ["invocation_id"],
        False,
    ),
    _tool(
        "deny",
        "Deny a pending call; the agent is told the reason.",
        {"invocation_id": _ID, "reason": {"type": "string"}},
        ["invocation_id"],
        False,
    ),
    _tool("list_grants", 'The standing grants (approvals beyond "once"), newest first.', {}, [], True),
    _tool(
        "revoke_grant",
        "Revoke a standing grant: the next call it covered waits for an approver again.",
        {"grant_id": {"type": "string", "description": "A grant's id, as list_grants gives it."}},
        ["grant_id"],
        False,
    ),
]


class ApproverEndpoint:
    """The ASGI app at `/approver/mcp`: approvers only, then the MCP server of its tools."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.server: Server[Any] = Server(
            "bastion-approver",
            version=__version__,
            title="Bastion approvals",
            instructions="Decide the tool calls Bastion holds for an approver.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.manager = StreamableHTTPSessionManager(app=self.server, json_response=False, stateless=True)
        self._app = StreamableHTTPASGIApp(self.manager)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = principal_of(scope)
        if principal is None:
            refusal: BastionError = Unauthenticated(
                "the approver endpoint needs an owner or admin bearer token; create one with "
                "`bastion tokens create NAME --role admin`"
            )
            await http_response(refusal, headers={"WWW-Authenticate": 'Bearer realm="bastion"'})(scope, receive, send)
            return
        if not principal.may_decide:
            refusal = Forbidden(f"{principal.name} has the {principal.role} role; only owner and admin tokens decide")
            await http_response(refusal)(scope, receive, send)
            return
        await self._app(scope, receive, send)

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            principal = self._principal(ctx)
            answer = await self._answer(principal, params.name, params.arguments or {})
        except BastionError as exc:
            return types.CallToolResult.model_validate(tool_result(exc, version=ctx.protocol_version), by_name=False)
        except Exception:  # the MCP boundary translator: a bug still answers with an error result
            logger.exception("approver tool %s failed unexpectedly", params.name)
            return types.CallToolResult(
                content=[types.TextContent(type="text", text="internal error; see the server log")], is_error=True
            )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(answer, indent=2))], structured_content=answer
        )

    def _principal(self, ctx: ServerRequestContext[Any]) -> Principal:
        request = ctx.request
        principal = principal_of(request.scope) if isinstance(request, Request) else None
        if principal is None or not principal.may_decide:  # the endpoint refused them already
            raise Forbidden("only owner and admin tokens decide")
        return principal

    async def _answer(self, principal: Principal, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        ledger = self.gateway.ledger
        grants = self.gateway.grants
        now = utcnow()
        if name == "list_pending":
            pending = await pending_invocations(ledger.invocations, now, limit=DEFAULT_LIMIT)
            return {"approvals": await approvals_json(ledger.invocations, pending, now, grants)}
        if name == "list_grants":
            return {"grants": [grant_json(grant, now) for grant in await grants.store.grants(standing_at=now)]}
        if name == "revoke_grant":
            grant_id = _text(arguments, "grant_id", required=True) or ""
            return grant_json(await grants.store.revoke(grant_id, by=principal.name, now=now), now)
        invocation_id = _text(arguments, "invocation_id", required=True) or ""
        if name == "show_invocation":
            invocation = await visible_invocation(ledger, principal, invocation_id)
            return invocation_detail_json(invocation, await ledger.invocations.events(invocation.id), grants)
        if name == "approve":
            decided = await decide(
                ledger,
                invocation_id,
                approve=True,
                principal=principal,
                note=_text(arguments, "note"),
                now=now,
                scope=_text(arguments, "scope") or "once",
                rule=_text(arguments, "when"),
                grants=grants,
            )
            return await decided_json(ledger.invocations, decided)
        if name == "deny":
            decided = await decide(
                ledger, invocation_id, approve=False, principal=principal, note=_text(arguments, "reason"), now=now
            )
            return await decided_json(ledger.invocations, decided)
        raise InvalidArguments(f"no tool {name!r} here; the tools are {', '.join(t.name for t in TOOLS)}")


def _text(arguments: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = arguments.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArguments(f"{name} must be a non-empty string")
    return value
