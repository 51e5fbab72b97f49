"""The approver REST API under `/api` (DESIGN.md §10): invocations, pending approvals, decisions, pins.

JSON in and out. Every route is declared once, in `OPERATIONS`; the Starlette routes and the OpenAPI
document (`GET /api/openapi.json`) are both built from that table, and the response schemas from the
pydantic models of bastion.pipeline.views, so the document describes exactly what is served. Who may do what is
decided by bastion.pipeline.authority; `BearerAuth` has authenticated the caller before any of this runs.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError
from pydantic.json_schema import JsonSchemaMode, models_json_schema
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion import __version__
from bastion.errors import BastionError, Conflict, Forbidden, InvalidArguments, NotFound, Unauthenticated
from bastion.models import STATUSES, Invocation, Principal, utcnow
from bastion.pipeline.authority import (
    MIN_ID_PREFIX,
    STALE_AFTER,
    Outcome,
    SourceOf,
    accept_pins,
    decide,
    reconcile,
    reconcile_by_check,
    visible_invocation,
)
from bastion.pipeline.seams import ActionSource, Ledger
from bastion.pipeline.views import (
    DEFAULT_LIMIT,
    CheckReport,
    InvocationDetail,
    PendingInvocation,
    PinView,
    audit_record_json,
    check_json,
    invocation_detail_json,
    invocation_json,
    pending_invocations,
    pending_json,
    pin_json,
)
from bastion.server.auth import API_PREFIX, principal_of
from bastion.server.errors import error_body, http_response

logger = logging.getLogger(__name__)

MAX_LIMIT: Final = 1000


# -- request and error bodies -----------------------------------------------------------------------


class ApproveRequest(BaseModel):
    """Approve a pending invocation; the note is kept in the ledger with the decision."""

    model_config = ConfigDict(extra="forbid")

    note: str | None = None


class DenyRequest(BaseModel):
    """Deny a pending invocation; the agent is told the reason."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = None


class AcceptKey(BaseModel):
    """Accept the drifted definition of one action."""

    model_config = ConfigDict(extra="forbid")

    key: Annotated[str, Field(pattern=r"^[a-z0-9_-]+:.", description="The action's policy key, source:action.")]


class AcceptSource(BaseModel):
    """Accept every drifted definition of one source."""

    model_config = ConfigDict(extra="forbid")

    source_id: Annotated[str, Field(min_length=1)]


class AcceptPinsRequest(RootModel[AcceptKey | AcceptSource]):
    """Exactly one of `key` or `source_id`."""


class ReconcileRequest(BaseModel):
    """Record what came of a call whose outcome is unknown, after checking the downstream."""

    model_config = ConfigDict(extra="forbid")

    outcome: Outcome
    note: str | None = None


class ReconcileCheckRequest(BaseModel):
    """Ask the call's source what came of it; the note is kept in the `reconciled` event."""

    model_config = ConfigDict(extra="forbid")

    note: str | None = None


class AuditPage(BaseModel):
    """Audit events after the cursor, oldest first, each with its chain hashes and its invocation as stored."""

    events: list[dict[str, Any]]
    next: int = Field(description="The cursor to ask for the next page with (`since`); the same when none is left.")


class InvocationList(BaseModel):
    """Invocations, newest first."""

    invocations: list[Invocation]


class ApprovalList(BaseModel):
    """Pending invocations, newest first."""

    approvals: list[PendingInvocation]


class PinList(BaseModel):
    """Pins, by source and action."""

    pins: list[PinView]


class ErrorDetail(BaseModel):
    """What was refused, why, and which invocation it concerns (when one does)."""

    error_class: str = Field(alias="class", description="The stable error class of DESIGN.md §7.")
    message: str
    invocation_id: str | None


class ErrorBody(BaseModel):
    """The body of every refusal."""

    error: ErrorDetail


# -- the routes ---------------------------------------------------------------------------------------


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


def _count(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise ValueError(f"must be a whole number from 1 to {MAX_LIMIT}")
    return int(text)


def _cursor(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ValueError("must be an event id: a whole number, 0 or more")
    return int(text)


def _flag(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError("must be true or false")
    return text == "true"


def _status(text: str) -> str:
    if text not in STATUSES:
        raise ValueError(f"must be one of {', '.join(STATUSES)}")
    return text


LIMIT = Query(
    "limit",
    "At most this many, newest first.",
    {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
    _count,
    DEFAULT_LIMIT,
)
STATUS = Query("status", "Only invocations with this status.", {"type": "string", "enum": list(STATUSES)}, _status)
SOURCE = Query("source", "Only this source id.", {"type": "string"}, str)
SESSION = Query("session", "Only this host session id.", {"type": "string"}, str)
SINCE = Query(
    "since",
    "Only events after this event id (the `next` of the previous page; 0 for the start).",
    {"type": "integer", "minimum": 0, "default": 0},
    _cursor,
    0,
)
PAGE = Query(
    "limit",
    "At most this many events.",
    {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": MAX_LIMIT},
    _count,
    MAX_LIMIT,
)
DRIFTED = Query("drifted", "Only drifted pins.", {"type": "boolean", "default": False}, _flag, False)


def _only_own(principal: Principal) -> str | None:
    """The principal filter a listing needs: none for approvers (they see all), an agent's own name."""
    return None if principal.may_decide else principal.name


async def list_invocations(call: Call) -> dict[str, Any]:
    q = call.query
    found = await call.ledger.invocations.list(
        status=q["status"],
        source_id=q["source"],
        session_id=q["session"],
        principal=_only_own(call.principal),
        limit=q["limit"],
    )
    return {"invocations": [invocation_json(i) for i in found]}


async def get_invocation(call: Call) -> dict[str, Any]:
    invocation = await visible_invocation(call.ledger, call.principal, call.path["invocation_id"])
    return invocation_detail_json(invocation, await call.ledger.invocations.events(invocation.id))


async def list_approvals(call: Call) -> dict[str, Any]:
    now = utcnow()
    own = _only_own(call.principal)
    pending = await pending_invocations(call.ledger.invocations, now, limit=call.query["limit"], principal=own)
    return {"approvals": [pending_json(i, now) for i in pending]}


async def approve(call: Call) -> dict[str, Any]:
    note = call.body.note if isinstance(call.body, ApproveRequest) else None
    return await _decide(call, approve=True, note=note)


async def deny(call: Call) -> dict[str, Any]:
    reason = call.body.reason if isinstance(call.body, DenyRequest) else None
    return await _decide(call, approve=False, note=reason)


async def _decide(call: Call, *, approve: bool, note: str | None) -> dict[str, Any]:
    invocation_id = call.path["invocation_id"]
    decided = await decide(
        call.ledger, invocation_id, approve=approve, principal=call.principal, note=note, now=utcnow()
    )
    return invocation_json(decided)


async def list_pins(call: Call) -> dict[str, Any]:
    pins = await call.ledger.pins.pins(call.query["source"])
    return {"pins": [pin_json(pin) for pin in pins if pin.drift is not None or not call.query["drifted"]]}


async def accept(call: Call) -> dict[str, Any]:
    assert isinstance(call.body, AcceptPinsRequest)
    target = call.body.root
    if isinstance(target, AcceptKey):
        source_id, _, action_id = target.key.partition(":")
        accepted = await accept_pins(call.ledger, principal=call.principal, source_id=source_id, action_id=action_id)
        if not accepted:
            raise Conflict(f"pin {target.key} is not drifted; there is nothing to accept")
    else:
        source_id = target.source_id
        accepted = await accept_pins(call.ledger, principal=call.principal, source_id=source_id, action_id=None)
        if not accepted and not await call.ledger.pins.pins(source_id):
            raise NotFound(f"no pins of source {source_id!r}; see GET /api/pins")
    return {"pins": [pin_json(pin) for pin in accepted]}


async def reconcile_invocation(call: Call) -> dict[str, Any]:
    assert isinstance(call.body, ReconcileRequest)
    settled = await reconcile(
        call.ledger,
        call.path["invocation_id"],
        outcome=call.body.outcome,
        principal=call.principal,
        note=call.body.note,
    )
    return invocation_json(settled)


async def reconcile_invocation_by_check(call: Call) -> dict[str, Any]:
    assert isinstance(call.body, ReconcileCheckRequest)
    checked = await reconcile_by_check(
        call.ledger,
        call.path["invocation_id"],
        source_of=call.source_of,
        principal=call.principal,
        now=utcnow(),
        note=call.body.note,
    )
    return check_json(checked.invocation, checked.found)


async def audit_events(call: Call) -> dict[str, Any]:
    if not call.principal.may_decide:
        raise Forbidden(f"{call.principal.name} has the {call.principal.role} role; the audit trail is for approvers")
    since: int = call.query["since"]
    page = await call.ledger.audit.export(since, call.query["limit"])
    return {
        "events": [audit_record_json(event, invocation) for event, invocation in page],
        "next": page[-1][0].id if page else since,
    }


async def get_openapi(call: Call) -> dict[str, Any]:
    return openapi_document()


OPERATIONS: Final[tuple[Operation, ...]] = (
    Operation(
        "GET",
        "/invocations",
        "listInvocations",
        "List invocations, newest first (agents: only their own)",
        list_invocations,
        InvocationList,
        query=(STATUS, SOURCE, SESSION, LIMIT),
    ),
    Operation(
        "GET",
        "/invocations/{invocation_id}",
        "getInvocation",
        "One invocation with its event history",
        get_invocation,
        InvocationDetail,
        refusals=(404,),
        description="An agent asking for another principal's invocation gets 404, as for a missing one.",
    ),
    Operation(
        "GET",
        "/approvals",
        "listApprovals",
        "Pending invocations with redacted args and the drift diff (agents: only their own)",
        list_approvals,
        ApprovalList,
        query=(LIMIT,),
    ),
    Operation(
        "POST",
        "/approvals/{invocation_id}/approve",
        "approveInvocation",
        "Approve a pending invocation: the waiting call runs it at once",
        approve,
        Invocation,
        refusals=(403, 404, 409, 410),
        body=ApproveRequest,
        description="Owner and admin tokens only, and never on their own call. Answers the updated invocation.",
    ),
    Operation(
        "POST",
        "/approvals/{invocation_id}/deny",
        "denyInvocation",
        "Deny a pending invocation: the waiting call returns approval_denied with the reason",
        deny,
        Invocation,
        refusals=(403, 404, 409, 410),
        body=DenyRequest,
        description="Owner and admin tokens only, and never on their own call. Answers the updated invocation.",
    ),
    Operation(
        "GET",
        "/pins",
        "listPins",
        "Pinned action definitions and their drift",
        list_pins,
        PinList,
        query=(SOURCE, DRIFTED),
    ),
    Operation(
        "POST",
        "/pins/accept",
        "acceptPins",
        "Re-pin drifted definitions: one action by key, or every drifted action of a source",
        accept,
        PinList,
        refusals=(403, 404, 409),
        body=AcceptPinsRequest,
        body_required=True,
        description="Owner and admin tokens only. 409 when the named pin has not drifted. Answers the accepted pins.",
    ),
    Operation(
        "POST",
        "/invocations/{invocation_id}/reconcile",
        "reconcileInvocation",
        "Record the outcome of an unknown (or stale executing) call, found by checking the downstream",
        reconcile_invocation,
        Invocation,
        refusals=(403, 404, 409),
        body=ReconcileRequest,
        body_required=True,
        description="Owner and admin tokens only. 409 when the call is not unresolved. Records a `reconciled` "
        "event; answers the updated invocation.",
    ),
    Operation(
        "POST",
        "/invocations/{invocation_id}/reconcile/check",
        "reconcileInvocationByCheck",
        "Ask the call's source what came of an unknown (or stale executing) call, and record what it found",
        reconcile_invocation_by_check,
        CheckReport,
        refusals=(403, 404, 409, 429, 502),
        body=ReconcileCheckRequest,
        description="Owner and admin tokens only, for actions that declare a look-up (provider actions that mark "
        "what they make: see the README); 422 `invalid_arguments` for any other, to settle by hand with "
        "POST .../reconcile. 409 when the call is not unknown or executing for more than "
        f"{STALE_AFTER.total_seconds():g} s. Found: records a `reconciled` event (`how`: `check`, with what was "
        "found) and answers it with the invocation reconciled. Not found (`found` null): the call is left as it "
        "was. 502 or 429 when the source cannot be asked now; nothing is recorded.",
    ),
    Operation(
        "GET",
        "/audit/events",
        "exportAuditEvents",
        "The audit trail from a cursor: events oldest first with their chain hashes and invocations",
        audit_events,
        AuditPage,
        refusals=(403,),
        query=(SINCE, PAGE),
        description="Owner and admin tokens only. Page through the whole trail by passing each answer's `next` "
        "as `since` until `events` is empty; `bastion audit verify` checks the chain.",
    ),
    Operation("GET", "/openapi.json", "getOpenApiDocument", "This OpenAPI 3.1 document", get_openapi, None),
)


# -- serving ------------------------------------------------------------------------------------------


def _no_source(source_id: str) -> ActionSource | None:
    return None


def build_api(ledger: Ledger, source_of: SourceOf = _no_source) -> Starlette:
    """The application mounted at `/api`; `source_of` gives the running sources (reconcile by check asks them)."""
    routes = [Route(op.path, endpoint=_endpoint(op, ledger, source_of), methods=[op.method]) for op in OPERATIONS]
    return Starlette(routes=routes, exception_handlers={HTTPException: routing_error})


def _endpoint(op: Operation, ledger: Ledger, source_of: SourceOf) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            principal = principal_of(request.scope)
            if principal is None:  # BearerAuth lets no anonymous request through to /api
                raise Unauthenticated("the approver API needs a bearer token")
            call = Call(
                principal=principal,
                ledger=ledger,
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
}


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route, built once from `OPERATIONS` and the views' models."""
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [(ErrorBody, "serialization")]
    for op in OPERATIONS:
        if op.response is not None:
            models.append((op.response, "serialization"))
        if op.body is not None:
            models.append((op.body, "validation"))
    refs, top = models_json_schema(models, ref_template="#/components/schemas/{model}")
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(API_PREFIX + op.path, {})[op.method.lower()] = _operation_object(op, refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Bastion approver API",
            "version": __version__,
            "description": "Decide pending tool calls and re-pin drifted tool definitions (DESIGN.md §10).",
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
