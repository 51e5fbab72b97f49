"""The one place Bastion reaches past the MCP SDK's public API (`mcp` 2.3), and why.

Every other module uses the SDK's public names only; `tests/test_sdk_private.py` checks that no other module
reads a private attribute of an SDK object or imports a private SDK name. Should the SDK change what is
reached here, only this module needs to follow.
"""

from __future__ import annotations

from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.connection import Connection


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
