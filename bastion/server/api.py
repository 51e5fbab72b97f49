"""The approver REST API under `/api`: invocations, pending approvals, decisions, grants, pins.

JSON in and out. Every route is declared once, in `OPERATIONS`; the Starlette routes and the OpenAPI
document (`GET /api/openapi.json`) are both built from that table, and the response schemas from the
pydantic models of bastion.pipeline.documents, so the document describes exactly what is served. Who may do what is
decided by bastion.pipeline.authority; `BearerAuth` has authenticated the caller before any of this runs.
"""

from __future__ import annotations

import functools
import logging
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, RootModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from bastion.errors import Conflict, Forbidden, NotFound
from bastion.ledger.offline import export_line
from bastion.models import STATUSES, Invocation, Principal, Scope, utcnow
from bastion.pipeline.authority import (
    STALE_AFTER,
    Outcome,
    SourceOf,
    accept_pins,
    decide,
    reconcile,
    reconcile_by_check,
    visible_invocation,
)
from bastion.pipeline.documents import (
    CheckReport,
    GrantView,
    InvocationDetail,
    PendingInvocation,
    PinView,
    approvals_json,
    check_json,
    decided_json,
    grant_json,
    invocation_detail_json,
    invocation_json,
    pending_invocations,
    pin_json,
)
from bastion.pipeline.grants import Grants
from bastion.pipeline.seams import Ledger
from bastion.server.events import MAX_EVENT_ID, event_id
from bastion.server.rest import Call, Operation, Query, describe, endpoint, routing_error
from bastion.sources.seam import ActionSource
from bastion.terms import DEFAULT_LIMIT

logger = logging.getLogger(__name__)

MAX_LIMIT: Final = 1000


# -- request and error bodies -----------------------------------------------------------------------


class ApproveRequest(BaseModel):
    """Approve a pending invocation; the note is kept in the ledger with the decision. A scope beyond "once" leaves
    a grant that lets later calls of the action through (see docs/approvers.md), narrowed by `when` if given."""

    model_config = ConfigDict(extra="forbid")

    note: str | None = None
    scope: Scope = Field(default="once", description="One of the invocation's `scopes` (GET /approvals).")
    when: str | None = Field(
        default=None,
        description="A condition on the arguments (CEL, as in policy rules) a later call must meet to be covered.",
    )


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


class GrantList(BaseModel):
    """Grants, newest first."""

    grants: list[GrantView]


# -- the routes ---------------------------------------------------------------------------------------


def _count(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise ValueError(f"must be a whole number from 1 to {MAX_LIMIT}")
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
    "Only events after this chain position (the `next` of the previous page; 0 for the start).",
    {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID, "default": 0},
    event_id,
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
ENDED = Query(
    "ended",
    "Also the grants that ended (revoked or expired): the latest, up to `limit`.",
    {"type": "boolean", "default": False},
    _flag,
    False,
)


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
    return invocation_detail_json(invocation, await call.ledger.invocations.events(invocation.id), call.grants)


async def list_approvals(call: Call) -> dict[str, Any]:
    now = utcnow()
    own = _only_own(call.principal)
    pending = await pending_invocations(call.ledger.invocations, now, limit=call.query["limit"], principal=own)
    return {"approvals": await approvals_json(call.ledger.invocations, pending, now, call.grants)}


async def approve(call: Call) -> dict[str, Any]:
    body = call.body if isinstance(call.body, ApproveRequest) else ApproveRequest()
    decided = await decide(
        call.ledger,
        call.path["invocation_id"],
        approve=True,
        principal=call.principal,
        note=body.note,
        now=utcnow(),
        scope=body.scope,
        rule=body.when,
        grants=call.grants,
    )
    return await decided_json(call.ledger.invocations, decided)


async def deny(call: Call) -> dict[str, Any]:
    reason = call.body.reason if isinstance(call.body, DenyRequest) else None
    decided = await decide(
        call.ledger, call.path["invocation_id"], approve=False, principal=call.principal, note=reason, now=utcnow()
    )
    return await decided_json(call.ledger.invocations, decided)


async def list_grants(call: Call) -> dict[str, Any]:
    _approvers_only(call.principal, "grants are")
    now = utcnow()
    found = await call.grants.store.grants(standing_at=None if call.query["ended"] else now, limit=call.query["limit"])
    return {"grants": [grant_json(grant, now) for grant in found]}


async def revoke_grant(call: Call) -> dict[str, Any]:
    _approvers_only(call.principal, "revoking grants is")
    now = utcnow()
    revoked = await call.grants.store.revoke(call.path["grant_id"], by=call.principal.name, now=now)
    return grant_json(revoked, now)


async def list_pins(call: Call) -> dict[str, Any]:
    _approvers_only(call.principal, "pinned definitions (and drifted ones, which hosts are not shown) are")
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


def _approvers_only(principal: Principal, what: str) -> None:
    """Refuse an agent token what is for approvers only (`what` ... "for approvers")."""
    if not principal.may_decide:
        raise Forbidden(
            f"{principal.name} has the {principal.role} role; {what} for approvers (owner and admin tokens)"
        )


async def audit_events(call: Call) -> dict[str, Any]:
    _approvers_only(call.principal, "the audit trail is")
    since: int = call.query["since"]
    page = await call.ledger.audit.export(since, call.query["limit"])
    return {
        "events": [export_line(exported) for exported in page],
        "next": page[-1].event.position if page else since,
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
        description="Owner and admin tokens only, and never on their own call. 422 when the scope is not one of the "
        "invocation's `scopes` or `when` is not a valid condition: nothing is decided. Answers the updated invocation.",
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
        "/grants",
        "listGrants",
        'Standing grants (what approvals beyond "once" let through), newest first',
        list_grants,
        GrantList,
        query=(ENDED, LIMIT),
        refusals=(403,),
        description="Owner and admin tokens only. With `ended=true`, also the grants that were revoked or expired.",
    ),
    Operation(
        "POST",
        "/grants/{grant_id}/revoke",
        "revokeGrant",
        "Revoke a standing grant: the calls it let through wait for an approver again",
        revoke_grant,
        GrantView,
        refusals=(403, 404),
        description="Owner and admin tokens only. 404 when no grant of that id stands (it ended, or never was). "
        "Every instance sharing the ledger holds the next call it covered. Answers the revoked grant.",
    ),
    Operation(
        "GET",
        "/pins",
        "listPins",
        "Pinned action definitions and their drift",
        list_pins,
        PinList,
        query=(SOURCE, DRIFTED),
        refusals=(403,),
        description="Owner and admin tokens only: a drifted definition may be written to steer an agent, which is "
        "why hosts are not shown it until an approver accepts it.",
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
        "what they make: see docs/serving.md); 422 `invalid_arguments` for any other, to settle by hand with "
        "POST .../reconcile. 409 when the call is not unknown or executing for more than "
        f"{STALE_AFTER.total_seconds():g} s. Found: records a `reconciled` event (`how`: `check`, with what was "
        "found: where, its creator and creation time) and answers it with the invocation reconciled. Found but "
        "no proof the call made it (`found.accepted` false, `found.reason` saying why: its mark not keyed by this "
        "Bastion, made by another than the provider's credential, elsewhere or outside the call's time): the call's "
        "status is left as it was, and a `checked` event records who asked, what was found and why it was refused. "
        "Not found (`found` null): the call is left as it was. 502 or 429 when the source cannot be asked now; "
        "nothing is recorded.",
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
        "as `since` until `events` is empty; `bastion audit verify` checks the chain. The events of tokens, pins, "
        "grants and tool names are in it too (`record`: `token:7`, `pin:fs:write_file`, `grant:...`, "
        "`name:fs__write_file`), without an `invocation`.",
    ),
    Operation("GET", "/openapi.json", "getOpenApiDocument", "This OpenAPI 3.1 document", get_openapi, None),
)


# -- serving ------------------------------------------------------------------------------------------


def _no_source(source_id: str) -> ActionSource | None:
    return None


def build_api(ledger: Ledger, grants: Grants, source_of: SourceOf = _no_source) -> Starlette:
    """The application mounted at `/api`; `grants` the ledger's standing grants, `source_of` the running sources
    (reconcile by check asks them)."""
    routes = [
        Route(op.path, endpoint=endpoint(op, ledger, grants, source_of), methods=[op.method]) for op in OPERATIONS
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: routing_error})


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route, built once from `OPERATIONS` and the views' models."""
    return describe(
        OPERATIONS,
        title="Bastion approver API",
        description="Decide pending tool calls and re-pin drifted tool definitions.",
    )
