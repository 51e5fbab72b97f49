"""What a call that ended answered its host, read back from the ledger: for a retry attached to it after it ended
(bastion.pipeline.approvals), for a host waiting on a call another process ran, and for a task's result
(bastion.server.tasks). The ledger keeps results redacted and cut to its size limit, so this is that copy."""

from __future__ import annotations

from typing import Any, cast

import mcp_types as types
from pydantic import ValidationError

from bastion.errors import ERROR_CLASSES, ApprovalDenied, ApprovalExpired, BastionError, UnknownOutcome, UpstreamError
from bastion.models import Invocation


def refusal_of(invocation: Invocation) -> BastionError:
    """The refusal a call ended with (denied, expired, an upstream error, an unknown outcome), as the error its
    blocking host was answered with."""
    message = invocation.error_message or f"the invocation is {invocation.status}"
    if invocation.error_class is not None:
        cls = ERROR_CLASSES.get(invocation.error_class, BastionError)
    else:
        cls = {"denied": ApprovalDenied, "expired": ApprovalExpired}.get(invocation.status, UnknownOutcome)
    return cls(message, invocation_id=invocation.id)


def unpassable(invocation: Invocation, why: str | None = None) -> UpstreamError:
    """The refusal of a call that ran but whose result, as the ledger keeps it (cut to its size limit), is no longer
    one a host can receive (`why`, when known)."""
    because = f" ({why})" if why else ""
    return UpstreamError(
        f"invocation {invocation.id} {invocation.status}, but its result as the ledger keeps it cannot be passed "
        f"on{because}; its approvers see it as invocation {invocation.id}",
        invocation_id=invocation.id,
    )


def recorded_result(invocation: Invocation) -> types.CallToolResult:
    """The result of a call that ran (`completed`, or `failed` with the tool's own error result) as the ledger keeps
    it; raises the refusal of any other (see `refusal_of`), and UpstreamError when the kept copy, cut to the ledger's
    size limit, is no longer a tool result."""
    if invocation.status in ("completed", "failed") and isinstance(invocation.result, dict):
        try:
            return types.CallToolResult.model_validate(cast(dict[str, Any], invocation.result))
        except ValidationError as exc:
            raise unpassable(invocation) from exc
    if invocation.status == "completed":  # reconciled by hand: the ledger has its outcome, not a result
        text = f"invocation {invocation.id} ({invocation.tool}) completed; the ledger keeps no result of it"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
    raise refusal_of(invocation)
