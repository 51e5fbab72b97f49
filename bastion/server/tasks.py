"""MCP tasks (SEP-2663, `io.modelcontextprotocol/tasks`, 2026-07-28) for calls that wait for approval.

A 2026-07-28 request that declares the extension in its capabilities and whose call the pipeline holds for an
approver is answered at once with a task handle (`resultType: "task"`) instead of blocking. The task is the
invocation: its id is the invocation id and its state is read from the ledger, so `tasks/get` answers from any
Bastion process sharing the ledger and after a restart. Every other call keeps its plain result (Bastion directs
task creation: a call that runs at once needs none), and requests without the extension keep blocking or getting
`approval_pending`.

- `tasks/get`: `working` while the call is pending, approved or running; `completed` once it ends, with the
  `CallToolResult` the blocking call would have returned. A refusal (denied, expired, an upstream error, an
  unknown outcome) is a tool result with `isError`, so its task is `completed` too: SEP-2663 keeps `failed` for
  JSON-RPC errors, which Bastion's `tools/call` never answers with. A completed call's result is the ledger's
  copy, redacted as the ledger keeps it.
- `tasks/cancel`: withdraws a pending call (recorded denied, marked withdrawn; the task is then `cancelled`). A call
  already approved, running or done cannot be taken back: the cancel is acknowledged and the task ends as it ends,
  which the SEP allows (cancellation is cooperative).
- `tasks/update`: Bastion's tasks never ask the host for input, so there is nothing to update; acknowledged.

A task is visible only to the principal that made the call (an agent token sees its own); any other gets
"task not found" (`-32602`), as for an id that never existed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, cast

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.context import HandlerResult
from mcp.server.extension import Extension, MethodBinding, RequestHandler
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from bastion.actions import Unshapeable, shaped_result
from bastion.errors import BastionError
from bastion.models import CallContext, Invocation, Status
from bastion.pipeline.authority import was_withdrawn, withdraw
from bastion.pipeline.recorded import refusal_of, unpassable
from bastion.pipeline.seams import Ledger
from bastion.server.errors import tool_result

EXTENSION_ID: Final = "io.modelcontextprotocol/tasks"

POLL_INTERVAL_MS: Final = 2000
"""The polling interval suggested to hosts: a human decides these calls, so seconds matter little."""

TaskStatus = Literal["working", "completed", "cancelled"]
"""The task statuses Bastion reports (never `input_required`: it asks hosts nothing; never `failed`: see above)."""

WORKING: Final[dict[Status, str]] = {
    "pending": "waiting for a human approver",
    "approved": "approved; about to run",
    "executing": "running",
}

ContextFn = Callable[[ServerRequestContext[Any]], CallContext]
"""Who makes a request (the host server's reading of its token)."""

OutputSchemaFn = Callable[[str], bool]
"""Whether a tool declares an outputSchema (its error results then carry no structuredContent)."""


class UpdateTaskParams(types.RequestParams):
    """`tasks/update` params: the task and the host's answers to its input requests."""

    task_id: str
    input_responses: dict[str, Any] | None = None


def declared(ctx: ServerRequestContext[Any]) -> bool:
    """Whether this request is 2026-07-28 and declares the tasks extension in its own `_meta` (capabilities are
    per request there: never inferred from an earlier one)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = (ctx.meta or {}).get(CLIENT_CAPABILITIES_META_KEY)
    extensions = cast(Mapping[str, Any], capabilities).get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(extensions, Mapping) and EXTENSION_ID in extensions


def created(invocation: Invocation) -> dict[str, Any]:
    """The task handle (`CreateTaskResult`) for a call now pending in the ledger."""
    return {**_task(invocation, "working", WORKING["pending"]), "resultType": "task"}


class TasksExtension(Extension):
    """The methods of the tasks extension, over the ledger's invocations (see the module docstring)."""

    identifier = EXTENSION_ID

    def __init__(self, ledger: Ledger, *, context_of: ContextFn, declares_output: OutputSchemaFn) -> None:
        self._ledger = ledger
        self._context_of = context_of
        self._declares_output = declares_output

    def methods(self) -> Sequence[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return (
            MethodBinding("tasks/get", types.GetTaskRequestParams, self._get, protocol_versions=modern),
            MethodBinding("tasks/cancel", types.CancelTaskRequestParams, self._cancel, protocol_versions=modern),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, protocol_versions=modern),
        )

    async def _get(self, ctx: ServerRequestContext[Any], params: types.GetTaskRequestParams) -> dict[str, Any]:
        invocation = await self._own(ctx, params.task_id)
        if invocation.status in WORKING:
            return _task(invocation, "working", WORKING[invocation.status])
        if invocation.status == "denied" and was_withdrawn(await self._ledger.invocations.events(invocation.id)):
            return _task(invocation, "cancelled", invocation.error_message)
        result = self._result(invocation, ctx.protocol_version)
        done = _task(invocation, "completed", invocation.error_message or f"the call {invocation.status}")
        return {**done, "result": result}

    async def _cancel(self, ctx: ServerRequestContext[Any], params: types.CancelTaskRequestParams) -> dict[str, Any]:
        invocation = await self._own(ctx, params.task_id)
        if invocation.status == "pending":
            await withdraw(self._ledger, invocation, principal=invocation.principal, how="tasks/cancel")
        return {}

    async def _update(self, ctx: ServerRequestContext[Any], params: UpdateTaskParams) -> dict[str, Any]:
        await self._own(ctx, params.task_id)
        return {}

    async def _own(self, ctx: ServerRequestContext[Any], task_id: str) -> Invocation:
        """The invocation of this task, if the requester made the call; "task not found" otherwise (never saying
        which)."""
        invocation = await self._ledger.invocations.get(task_id)
        if invocation is None or invocation.principal != self._context_of(ctx).principal:
            raise MCPError(code=types.INVALID_PARAMS, message=f"task {task_id!r} not found")
        return invocation

    def _result(self, invocation: Invocation, version: str) -> dict[str, Any]:
        """What the blocking call would have returned, from the ledger and shaped for the host's `version`: the
        tool's result, or the refusal (also when the ledger's copy, cut to the ledger's size limit, is no longer a
        tool result the host can receive)."""
        error: BastionError = refusal_of(invocation)
        if isinstance(invocation.result, dict) and invocation.status in ("completed", "failed"):
            try:
                return shaped_result(cast(dict[str, Any], invocation.result), version)
            except Unshapeable as exc:
                error = unpassable(invocation, str(exc))
        return tool_result(error, version=version, output_schema=self._declares_output(invocation.tool))


def install(server: Server[Any], extension: Extension) -> None:
    """Serve an extension's methods on a low-level Server and advertise it in the server's capabilities, as
    `MCPServer(extensions=[...])` does for its own (Bastion's host server is a low-level Server)."""
    for method in extension.methods():
        server.add_request_handler(method.method, method.params_type, _gated(method))
    server.extensions[extension.identifier] = extension.settings()


def _gated(method: MethodBinding) -> RequestHandler:
    """The method's handler, answering "method not found" at the protocol versions it is not served at."""
    versions = method.protocol_versions

    async def handle(ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        if versions is not None and ctx.protocol_version not in versions:
            raise MCPError(code=types.METHOD_NOT_FOUND, message=f"{method.method} is not served at this version")
        return await method.handler(ctx, params)

    return handle


def _task(invocation: Invocation, status: TaskStatus, message: str | None) -> dict[str, Any]:
    """The task's common fields (SEP-2663 `Task`). The ledger keeps invocations until an operator prunes them, so
    Bastion promises no TTL (`null`)."""
    task: dict[str, Any] = {
        "taskId": invocation.id,
        "status": status,
        "createdAt": invocation.created_at.isoformat(),
        "lastUpdatedAt": invocation.updated_at.isoformat(),
        "ttlMs": None,
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    if message:
        task["statusMessage"] = message
    return task
