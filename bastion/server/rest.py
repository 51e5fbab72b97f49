"""How a route of the approver REST API is declared, served and documented: one `Operation` per route, from which
`bastion.server.api` builds both its Starlette routes and its OpenAPI document, so the document describes exactly
what is served."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, Field, ValidationError
from pydantic.json_schema import JsonSchemaMode, models_json_schema
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bastion import __version__
from bastion.errors import BastionError, InvalidArguments, Unauthenticated
from bastion.models import Principal
from bastion.pipeline.authority import SourceOf
from bastion.pipeline.grants import Grants
from bastion.pipeline.seams import Ledger
from bastion.server.auth import API_PREFIX, principal_of
from bastion.server.errors import error_body, http_response
from bastion.terms import MIN_ID_PREFIX

logger = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    """What was refused, why, and which invocation it concerns (when one does)."""

    error_class: str = Field(alias="class", description="The stable error class, e.g. `policy_denied` or `not_found`.")
    message: str
    invocation_id: str | None


class ErrorBody(BaseModel):
    """The body of every refusal."""

    error: ErrorDetail


@dataclass(frozen=True)
class Query:
    """One query parameter: its JSON schema, and how its text becomes a value (ValueError when it cannot)."""

    name: str
    description: str
    schema: dict[str, Any]
    parse: Callable[[str], Any]
    default: Any = None


@dataclass(frozen=True)
class Call:
    """What a handler gets: the authenticated principal, the ledger, the running sources and the validated
    request."""

    principal: Principal
    ledger: Ledger
    grants: Grants
    source_of: SourceOf
    path: dict[str, str]
    query: dict[str, Any]
    body: BaseModel | None


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Operation:
    """One route of the API, as served and as documented."""

    method: Literal["GET", "POST"]
    path: str
    name: str
    summary: str
    handler: Handler
    response: type[BaseModel] | None
    """The model of the 200 body (None: any JSON object)."""
    refusals: tuple[int, ...] = ()
    """The statuses this route may answer besides 200, 401, 422 and 500."""
    query: tuple[Query, ...] = ()
    body: type[BaseModel] | None = None
    body_required: bool = False
    description: str = ""

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"{(\w+)}", self.path)


# -- serving ------------------------------------------------------------------------------------------


def endpoint(
    op: Operation, ledger: Ledger, grants: Grants, source_of: SourceOf
) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint of `op`: authenticated principal, parsed path, query and body, the handler's JSON, and
    every refusal as the error body."""

    async def endpoint(request: Request) -> Response:
        try:
            principal = principal_of(request.scope)
            if principal is None:  # BearerAuth lets no anonymous request through to /api
                raise Unauthenticated("the approver API needs a bearer token")
            call = Call(
                principal=principal,
                ledger=ledger,
                grants=grants,
                source_of=source_of,
                path={name: str(request.path_params[name]) for name in op.path_params},
                query=_parse_query(op.query, request.query_params.multi_items()),
                body=await _parse_body(op, await request.body()),
            )
            return JSONResponse(await op.handler(call))
        except BastionError as exc:
            return http_response(exc)
        except Exception:  # the HTTP boundary translator: a bug still answers with the error body
            logger.exception("%s %s failed unexpectedly", op.method, request.url.path)
            return JSONResponse(error_body("internal", "internal error; see the server log"), status_code=500)

    return endpoint


def _parse_query(params: Sequence[Query], items: list[tuple[str, str]]) -> dict[str, Any]:
    known = {p.name: p for p in params}
    values = {p.name: p.default for p in params}
    seen: set[str] = set()
    for name, text in items:
        if name not in known:
            allowed = ", ".join(known) or "none"
            raise InvalidArguments(f"unknown query parameter {name!r} (this route takes: {allowed})")
        if name in seen:
            raise InvalidArguments(f"query parameter {name!r} given more than once")
        seen.add(name)
        try:
            values[name] = known[name].parse(text)
        except ValueError as exc:
            raise InvalidArguments(f"query parameter {name!r} {exc}") from exc
    return values


async def _parse_body(op: Operation, raw: bytes) -> BaseModel | None:
    if op.body is None:
        if raw.strip():
            raise InvalidArguments(f"{op.method} {API_PREFIX}{op.path} takes no request body")
        return None
    if not raw.strip():
        if op.body_required:
            raise InvalidArguments("a JSON request body is required")
        return op.body()
    try:
        return op.body.model_validate_json(raw)
    except ValidationError as exc:
        raise InvalidArguments(f"invalid request body: {_describe(exc)}") from exc


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False)[:3]:
        where = ".".join(str(part) for part in error["loc"])
        problems.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(problems)


async def routing_error(request: Request, exc: Exception) -> Response:
    """Routing refusals (no such route, wrong method) with the same error body as every other refusal.

    The outer application uses it too: a path under `/api` that its mount cannot match (one with a
    newline, say) is refused there."""
    assert isinstance(exc, HTTPException)
    error_class = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
    return JSONResponse(error_body(error_class, exc.detail), status_code=exc.status_code, headers=exc.headers)


# -- the OpenAPI document -----------------------------------------------------------------------------

_REFUSALS: Final = {
    401: "No valid bearer token: missing, malformed, unknown or revoked.",
    403: "The token's role may not do this (only owner and admin decide or re-pin), or it is its own call.",
    404: "No such invocation (or one this token may not see), or no such pin.",
    409: "Already decided, or nothing to accept: the message names the current state.",
    410: "The invocation expired before a decision; it is now marked expired.",
    422: "Invalid request: bad JSON, wrong types, unknown fields or query parameters, bad query values; or an id "
    "prefix that starts more than one invocation id (`ambiguous_id`).",
    429: "The source's API limits its rate (`rate_limited`, with `retry_after`); nothing was recorded.",
    500: "A bug in Bastion; the server log has the details.",
    502: "The source could not be asked (`connector_unavailable`, `binding_required`, `upstream_error`); nothing "
    "was recorded: retry, or settle the call by hand.",
}


_PATH_PARAMS: Final = {
    "invocation_id": f"An invocation id, or the first {MIN_ID_PREFIX} or more characters of one (when they start no "
    "other id: else 422 `ambiguous_id`, naming them).",
    "grant_id": "A grant's id, as `GET /api/grants` lists it (`always_...`, `hour_...`, `session_...`).",
}


def describe(operations: Sequence[Operation], *, title: str, description: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `operations`, with the schemas of their pydantic models."""
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [(ErrorBody, "serialization")]
    for op in operations:
        if op.response is not None:
            models.append((op.response, "serialization"))
        if op.body is not None:
            models.append((op.body, "validation"))
    refs, top = models_json_schema(models, ref_template="#/components/schemas/{model}")
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(API_PREFIX + op.path, {})[op.method.lower()] = _operation_object(op, refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": __version__,
            "description": description,
        },
        "paths": paths,
        "components": {
            "schemas": top.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _operation_object(op: Operation, refs: Mapping[tuple[Any, JsonSchemaMode], dict[str, Any]]) -> dict[str, Any]:
    ok_schema = {"type": "object"} if op.response is None else refs[(op.response, "serialization")]
    responses: dict[str, Any] = {
        "200": {"description": op.summary, "content": {"application/json": {"schema": ok_schema}}}
    }
    error_ref = refs[(ErrorBody, "serialization")]
    for status in sorted({401, 422, 500, *op.refusals}):
        response: dict[str, Any] = {
            "description": _REFUSALS[status],
            "content": {"application/json": {"schema": error_ref}},
        }
        if status == 401:
            response["headers"] = {
                "WWW-Authenticate": {"required": True, "schema": {"type": "string"}, "description": "Bearer"}
            }
        responses[str(status)] = response
    parameters = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "description": _PATH_PARAMS[name],
            "schema": {"type": "string", "minLength": 1},
        }
        for name in op.path_params
    ]
    parameters += [
        {"name": q.name, "in": "query", "required": False, "description": q.description, "schema": q.schema}
        for q in op.query
    ]
    document: dict[str, Any] = {
        "operationId": op.name,
        "summary": op.summary,
        "parameters": parameters,
        "responses": responses,
    }
    if op.description:
        document["description"] = op.description
    if op.body is not None:
        document["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": refs[(op.body, "validation")]}},
        }
    return document
