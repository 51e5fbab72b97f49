"""How a connection failure is told: one line for the status and the log, and whether it is ordinary."""

from __future__ import annotations

import anyio
import httpx2
from mcp import MCPError
from mcp.client.subscriptions import SubscriptionLost

from bastion.errors import BastionError

__all__ = ["describe", "first_line", "is_expected"]


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (some, like jsonschema's, run to many)."""
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def describe(exc: BaseException) -> str:
    """A one-line reason, looking through exception groups (the HTTP transport raises those)."""
    parts = []
    for leaf in _leaves(exc):
        text = str(leaf) or type(leaf).__name__
        parts.append(f"{type(leaf).__name__}: {text}" if not isinstance(leaf, BastionError) else text)
    return "; ".join(parts)


EXPECTED_FAILURES = (
    MCPError,
    BastionError,
    OSError,
    TimeoutError,
    httpx2.HTTPError,
    SubscriptionLost,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


def is_expected(exc: BaseException) -> bool:
    """Whether a connection failure is ordinary (a downstream gone or misbehaving), not a bug of ours."""
    return all(isinstance(leaf, EXPECTED_FAILURES) for leaf in _leaves(exc))
