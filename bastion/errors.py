"""The error tree. Each class carries the stable `class` string of DESIGN.md §7.

Foreign errors (MCPError, httpx2 errors, sqlite3 errors) are translated into these at the edge
with `raise ... from exc`; the MCP and HTTP boundaries each have one translator back out.
"""

from __future__ import annotations

from typing import ClassVar


class BastionError(Exception):
    """Root of every error Bastion raises on purpose."""

    error_class: ClassVar[str] = "internal"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str, *, invocation_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.invocation_id = invocation_id


class NotFound(BastionError):
    error_class = "not_found"


class InvalidArguments(BastionError):
    error_class = "invalid_arguments"


class PolicyDenied(BastionError):
    error_class = "policy_denied"


class SourceDisabled(BastionError):
    error_class = "source_disabled"


class ApprovalDenied(BastionError):
    error_class = "approval_denied"


class ApprovalExpired(BastionError):
    error_class = "approval_expired"


class PendingLimit(BastionError):
    error_class = "pending_limit"
    retriable = True


class RateLimited(BastionError):
    error_class = "rate_limited"
    retriable = True


class ConnectorUnavailable(BastionError):
    error_class = "connector_unavailable"
    retriable = True


class CallTimeout(BastionError):
    error_class = "timeout"


class UpstreamError(BastionError):
    error_class = "upstream_error"


class UnknownOutcome(BastionError):
    error_class = "unknown_outcome"


class Conflict(BastionError):
    error_class = "conflict"


class AmbiguousId(BastionError):
    """An id prefix that starts more than one id: the message names them and asks for more characters."""

    error_class = "ambiguous_id"


class ConfigError(BastionError):
    """The configuration cannot be used; the message names the file, line and fix."""

    error_class = "config_error"


class Unauthenticated(BastionError):
    """No valid token: the message never says whether the thing asked for exists."""

    error_class = "unauthenticated"


class Forbidden(BastionError):
    """A valid token whose role (or relation to the invocation) does not allow the operation."""

    error_class = "forbidden"
