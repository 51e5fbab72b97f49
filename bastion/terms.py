"""The words and numbers people type to Bastion: the statuses of a call, the roles of a token, the scopes of an
approval, how short an invocation id may be and how long a listing is.

Plain `Literal`s and constants that import nothing, so that `bastion --help` shows them without loading the models
or the pipeline; `bastion.models` and the pipeline build on them.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Status = Literal["pending", "approved", "executing", "completed", "denied", "failed", "expired", "unknown"]
STATUSES: Final[tuple[Status, ...]] = get_args(Status)

Role = Literal["owner", "admin", "agent"]
ROLES: Final[tuple[Role, ...]] = get_args(Role)

Scope = Literal["once", "session", "hour", "always"]
"""How far an approval reaches: this call only, later calls of its action in the same host session, by the same
caller for an hour, or by anyone until the grant ends (see bastion.pipeline.grants)."""
SCOPES: Final[tuple[Scope, ...]] = get_args(Scope)

MIN_ID_PREFIX: Final = 6
"""The fewest characters of an invocation id that name it (when no other id starts with them)."""

DEFAULT_LIMIT: Final = 100
"""How many rows a listing shows when it is not told."""
