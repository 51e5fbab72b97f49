"""The one place Bastion reaches past the MCP SDK's public API (`mcp` 2.3), and why.

Every other module uses the SDK's public names only; `tests/test_sdk_private.py` checks that no other module
reads a private attribute of an SDK object or imports a private SDK name. Should the SDK change what is
reached here, only this module needs to follow.
"""

from __future__ import annotations

import math
from typing import Any

import anyio
from mcp.server import ServerRequestContext
from mcp.server.connection import Connection
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager


def connection_of(ctx: ServerRequestContext[Any]) -> Connection:
    """The `Connection` (one host's connection) that the request of a low-level handler arrived on.

    Bastion keeps per-connection facts there: the log level a 2025-era host set with `logging/setLevel`
    (`Connection.state`); what to forget when the connection closes, so that sets of connections do not only
    grow (`Connection.exit_stack`: the sessions told of catalog changes, the resource subscriptions); and who
    the host is (`session_id`, `client_params`: the session that rate limits count against). The high-level
    `MCPServer` gives its handlers a `Context` with a public `connection`, but the low-level
    `ServerRequestContext` Bastion's handlers receive offers only `session`, a per-request `ServerSession`
    that keeps the connection in its private `_connection`. There is no public path from a low-level handler
    to its connection, so it is read here.
    """
    connection: Connection = ctx.session._connection
    return connection


def keep_http_session(manager: StreamableHTTPSessionManager, session_id: str) -> bool:
    """Whether the SDK still serves the handshake-era streamable-HTTP session `session_id`; if so, a request the
    express lane answered for it counts as the session's activity, as one the SDK answered would.

    The SDK closes a session after `session_idle_timeout` without a request (its transport's `idle_scope`), and
    counts only the requests its transport serves. A host whose every request the lane answered would see its
    session closed in the middle of its work. The manager keeps its transports by session id only in its private
    `_server_instances`; the deadline is moved the way the transport moves it when a request ends.
    """
    transport = manager._server_instances.get(session_id)
    if transport is None:
        return False
    idle = transport.idle_scope
    if idle is None:
        return True
    if idle.cancel_called:
        return False
    timeout = manager.session_idle_timeout
    if timeout is not None and idle.deadline != math.inf:
        idle.deadline = max(idle.deadline, anyio.current_time() + timeout)
    return True
