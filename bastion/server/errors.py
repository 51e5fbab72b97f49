"""Every translation of a Bastion error at a boundary, side by side (the classes are in `bastion.errors`).

- to an MCP tool result, for the host that made the call (`tool_result`);
- to an HTTP answer, for the REST API and the HTTP middleware (`http_response`);
- back from an HTTP answer, for the remote CLI (`from_http`).

The error classes, their retriability and their HTTP statuses are defined once, in `bastion.errors`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from starlette.responses import JSONResponse

from bastion.actions import shaped_result
from bastion.errors import ERROR_CLASSES, BastionError, RateLimited

ERROR_META_KEY: Final = "io.bastion/error"
"""The `_meta` key of an error result that carries the error's class, message, invocation and retriability."""


def error_detail(exc: BastionError) -> dict[str, Any]:
    """The error as a host sees it: class, message, invocation id and whether a retry may succeed; for a rate
    limit whose wait is known, `retry_after` (whole seconds) too."""
    detail: dict[str, Any] = {
        "class": exc.error_class,
        "message": exc.message,
        "invocation_id": exc.invocation_id,
        "retriable": exc.retriable,
    }
    if isinstance(exc, RateLimited) and exc.retry_after is not None:
        detail["retry_after"] = math.ceil(exc.retry_after)
    return detail


def tool_result(exc: BastionError, *, version: str, output_schema: bool = False) -> dict[str, Any]:
    """A refusal as a host speaking MCP `version` receives it (`shaped_result`): `isError`, a one-line text naming
    the class, and the error's details.

    The details go in `structuredContent` (`{"error": {...}}`) and in `_meta["io.bastion/error"]`. For a tool
    that declares an `outputSchema` they go in `_meta` only: hosts check `structuredContent` against that
    schema, error results included (the TypeScript SDK does), and would show a schema error instead of why.
    """
    detail = error_detail(exc)
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": f"{exc.error_class}: {exc.message}"}],
        "isError": True,
        "_meta": {ERROR_META_KEY: detail},
    }
    if not output_schema:
        result["structuredContent"] = {"error": detail}
    return shaped_result(result, version)


def error_body(error_class: str, message: str, invocation_id: str | None = None) -> dict[str, Any]:
    """The body of every refusal of the HTTP surface."""
    return {"error": {"class": error_class, "message": message, "invocation_id": invocation_id}}


def http_response(exc: BastionError, *, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """A Bastion error as an HTTP status (its class's, in `bastion.errors`) and the error body."""
    return JSONResponse(
        error_body(exc.error_class, exc.message, exc.invocation_id), status_code=exc.http_status, headers=headers
    )


def from_http(status: int, body: Any) -> BastionError | None:
    """The Bastion error an HTTP answer carries (the remote CLI raises it); None when the body is not one."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    cls = ERROR_CLASSES.get(str(error.get("class")), BastionError)
    invocation_id = error.get("invocation_id")
    return cls(str(error.get("message")), invocation_id=invocation_id if isinstance(invocation_id, str) else None)
