"""The error tree and its registry. Each class carries its stable `class` string (what hosts, scripts and the
ledger see), whether a retry may succeed, and its HTTP status.

Foreign errors (MCPError, httpx2 errors, sqlite3 errors) are translated into these at the edge
with `raise ... from exc`; the translators back out (to an MCP tool result, an HTTP answer, and from an
HTTP answer for the remote CLI) live beside each other in `bastion.server.errors`.
"""

from __future__ import annotations

import math
from typing import ClassVar


class BastionError(Exception):
    """Root of every error Bastion raises on purpose; as a class of its own, a bug of ours (`internal`)."""

    error_class: ClassVar[str] = "internal"
    retriable: ClassVar[bool] = False
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, *, invocation_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.invocation_id = invocation_id


class NotFound(BastionError):
    """No such tool, invocation, pin, grant or token (or one the caller may not see)."""

    error_class = "not_found"
    http_status = 404


class InvalidArguments(BastionError):
    """Arguments or a request that do not fit: the tool's input schema, a command's options, an API body.
    Nothing was recorded or sent."""

    error_class = "invalid_arguments"
    http_status = 422


class PolicyDenied(BastionError):
    """Policy denies the call (a mode, a rule, a plugin's scope, a drifted tool listed as `hide`): recorded
    `denied`, nothing sent."""

    error_class = "policy_denied"
    http_status = 403


class CapabilityDenied(BastionError):
    """A manifest action's step outside the capabilities its manifest declares for that source."""

    error_class = "capability_denied"
    http_status = 403


class SourceDisabled(BastionError):
    """The call's source is disabled (`[sources] disabled` of a policy file): nothing sent."""

    error_class = "source_disabled"
    http_status = 403


class ApprovalDenied(BastionError):
    """An approver denied the held call (the reason is in the message); it never ran."""

    error_class = "approval_denied"
    http_status = 403


class ApprovalExpired(BastionError):
    """Nobody decided the held call within `[approvals] expiry_seconds`; it never ran."""

    error_class = "approval_expired"
    http_status = 410


class ApprovalPending(BastionError):
    """Not a refusal: the call waits for an approver still, but its host cannot be kept waiting (it sent no
    progress token). The invocation stays pending; once decided, `bastion__invocation` returns its outcome.
    Not retriable: calling again would ask for a second approval of the same thing."""

    error_class = "approval_pending"
    http_status = 409


class PendingLimit(BastionError):
    """The session has `[approvals] max_pending_per_session` calls waiting already; decide some first."""

    error_class = "pending_limit"
    http_status = 429
    retriable = True


class RateLimited(BastionError):
    """Too many calls: Bastion's own per-session limit, or an upstream API's (its 429). The wait is in the message
    and, when known, in `retry_after` (seconds)."""

    error_class = "rate_limited"
    http_status = 429
    retriable = True

    def __init__(self, message: str, *, invocation_id: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, invocation_id=invocation_id)
        self.retry_after = retry_after

    @classmethod
    def session_over(cls, per_minute: int, wait: float) -> RateLimited:
        """Bastion's own limit refused a session's call: `per_minute` allowed, the next fits in `wait` seconds."""
        seconds = math.ceil(wait)
        return cls(
            f"session over its limit of {per_minute} invocations per minute; retry in {seconds} s", retry_after=seconds
        )


class ConnectorUnavailable(BastionError):
    """The call's source is down, still starting or stopping: nothing was sent, so calling again is safe."""

    error_class = "connector_unavailable"
    http_status = 502
    retriable = True


class BindingRequired(ConnectorUnavailable):
    """A source that cannot run until a credential is bound in the configuration (a provider's `token`): nothing
    was sent, and a retry cannot help until the configuration changes."""

    error_class = "binding_required"
    retriable = False


class CallTimeout(BastionError):
    """The source did not answer within `[limits] call_timeout_seconds`."""

    error_class = "timeout"
    http_status = 502


class UpstreamError(BastionError):
    """The source answered with an error, or with a result that breaks the tool's own output schema."""

    error_class = "upstream_error"
    http_status = 502


class UnknownOutcome(BastionError):
    """The call may have run, but its answer never came (a timeout or a lost connection after it was sent, a
    stop): recorded `unknown`. Check the downstream before calling again; `bastion invocations reconcile` settles it."""

    error_class = "unknown_outcome"
    http_status = 502


class RequestTooLarge(BastionError):
    """An HTTP request body over the limit of its path, refused as it arrived (nothing of it was acted on)."""

    error_class = "request_too_large"
    http_status = 413


class UrlTooLong(RequestTooLarge):
    """An HTTP request whose URL is over 8 KiB."""

    error_class = "url_too_long"
    http_status = 414


class HeadersTooLarge(RequestTooLarge):
    """An HTTP request whose headers are over 32 KiB in all."""

    error_class = "headers_too_large"
    http_status = 431


class Conflict(BastionError):
    """The thing is not in the state the operation needs: a call already decided, a pin that has not drifted."""

    error_class = "conflict"
    http_status = 409


class AmbiguousId(BastionError):
    """An id prefix that starts more than one id: the message names them and asks for more characters."""

    error_class = "ambiguous_id"
    http_status = 422


class ConfigError(BastionError):
    """The configuration cannot be used; the message names the file, line and fix."""

    error_class = "config_error"
    http_status = 422


class Unauthenticated(BastionError):
    """No valid token: the message never says whether the thing asked for exists."""

    error_class = "unauthenticated"
    http_status = 401


class Forbidden(BastionError):
    """A valid token whose role (or relation to the invocation) does not allow the operation."""

    error_class = "forbidden"
    http_status = 403


class CsrfRefused(Forbidden):
    """A form of the inbox without the CSRF token of the session (or of the login form) that served it."""

    error_class = "csrf_refused"


class HostNotAllowed(BastionError):
    """An HTTP request whose Host names no host this Bastion answers to (DNS-rebinding protection)."""

    error_class = "host_not_allowed"
    http_status = 421


class OriginNotAllowed(BastionError):
    """An HTTP request from a web page of a site this Bastion does not answer to (DNS-rebinding protection)."""

    error_class = "origin_not_allowed"
    http_status = 403


class LedgerUnavailable(BastionError):
    """The ledger cannot be read or written right now (a full disk, an I/O error, a lock held too long)."""

    error_class = "ledger_unavailable"
    retriable = True
    http_status = 503


class ChangesLost(BastionError):
    """A waiter of the change feed fell further behind than the feed keeps: it must re-read what it watches."""

    error_class = "changes_lost"
    retriable = True
    http_status = 410


def _every_class(root: type[BastionError]) -> list[type[BastionError]]:
    found = [root]
    for sub in root.__subclasses__():
        found.extend(_every_class(sub))
    return found


ERROR_CLASSES: dict[str, type[BastionError]] = {cls.error_class: cls for cls in _every_class(BastionError)}
"""Every error class string to its exception type: the one registry the translators read."""
