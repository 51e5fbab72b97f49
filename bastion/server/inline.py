"""Inline approval: ask the host's own user with a form, beside the approver path.

Only for a profile with `inline_approval = true`, a host that supports form elicitation, and an
anonymous local session: the host's user answers for the agent's own client, so with tokens (where
an agent must never approve its own call) the approver path is the only one. On a 2025-era
connection the form is sent as `elicitation/create` while the call waits; on 2026-07-28 the call
returns `InputRequiredResult` with a sealed `request_state` and is resumed by the host's retry.
Cancelling the form leaves the invocation pending for the approvers; whoever decides first wins.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError

from bastion.errors import ApprovalExpired, Conflict, InvalidArguments, NotFound
from bastion.models import Invocation, Principal, utcnow
from bastion.pipeline.authority import decide
from bastion.pipeline.gateway import Gateway
from bastion.policies import canonical_json

logger = logging.getLogger(__name__)

INPUT_KEY = "bastion.approval"
STATE_VERSION = 1
DECISION_SCHEMA: types.ElicitRequestedSchema = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Decision",
            "description": "Run this call, or refuse it.",
            "enum": ["approve", "deny"],
        },
        "reason": {"type": "string", "title": "Reason", "description": "Optional; kept in Bastion's ledger."},
    },
    "required": ["decision"],
}


def supports_elicitation(ctx: ServerRequestContext[Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


def prompt(invocation: Invocation, arguments: dict[str, Any]) -> str:
    shown = canonical_json(arguments).decode()
    if len(shown) > 1000:
        shown = shown[:1000] + "…"
    text = (
        f"Bastion holds a call for your approval: {invocation.tool} ({invocation.risk} risk, "
        f"mode from {invocation.mode_source}). Arguments: {shown}"
    )
    if invocation.drift:
        text += "\nIts definition changed since it was trusted:\n" + "\n".join(invocation.drift[:40])
    return text


async def apply(gateway: Gateway, invocation_id: str, answer: types.ElicitResult, session_id: str) -> None:
    """Turn the user's answer into a decision; a cancelled form leaves the call to the approvers."""
    if answer.action == "cancel":
        return
    content = answer.content or {}
    approve = answer.action == "accept" and content.get("decision") == "approve"
    reason = content.get("reason")
    note = str(reason) if reason else (None if approve else "declined by the host's user")
    principal = Principal(name=f"inline:{session_id}", role="admin")
    try:
        await decide(gateway.ledger, invocation_id, approve=approve, principal=principal, note=note, now=utcnow())
    except (Conflict, ApprovalExpired, NotFound) as exc:
        logger.info("inline answer for %s came too late: %s", invocation_id, exc.message)


async def ask_over_back_channel(
    ctx: ServerRequestContext[Any], gateway: Gateway, invocation: Invocation, arguments: dict[str, Any]
) -> None:
    """2025-era: send the form on the request's own channel while the call waits."""
    try:
        answer = await ctx.session.elicit_form(
            prompt(invocation, arguments), DECISION_SCHEMA, related_request_id=ctx.request_id
        )
    except MCPError as exc:
        logger.info("the host could not show the approval form (%s); waiting for an approver", exc)
        return
    await apply(gateway, invocation.id, answer, invocation.session_id)


def input_required(invocation: Invocation, arguments: dict[str, Any]) -> types.InputRequiredResult:
    """2026-07-28: ask in the result; the host retries the call with the answer and this state."""
    state = {"v": STATE_VERSION, "invocation_id": invocation.id, "tool": invocation.tool, "args": invocation.args_hash}
    form = types.ElicitRequestFormParams(message=prompt(invocation, arguments), requested_schema=DECISION_SCHEMA)
    return types.InputRequiredResult(
        input_requests={INPUT_KEY: types.ElicitRequest(params=form)},
        request_state=json.dumps(state),
    )


def resumed_invocation(params: types.CallToolRequestParams, args_hash: str) -> tuple[str, types.ElicitResult | None]:
    """The invocation a retried call resumes, checked against the state Bastion minted, and the answer."""
    try:
        state = json.loads(params.request_state or "")
        matches = (
            state["v"] == STATE_VERSION and state["tool"] == params.name and state["args"] == args_hash
        )  # fmt: skip
        invocation_id = str(state["invocation_id"])
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidArguments("the request_state of this retry is not one Bastion issued") from exc
    if not matches:
        raise InvalidArguments("this retry does not match the call it resumes (tool or arguments differ)")
    answer = (params.input_responses or {}).get(INPUT_KEY)
    return invocation_id, answer if isinstance(answer, types.ElicitResult) else None
