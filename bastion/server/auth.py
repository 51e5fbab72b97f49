"""Who is calling over HTTP, and how a refusal reads there.

`BearerAuth` resolves `Authorization: Bearer <secret>` through the ledger before any routing, so a
wrong or revoked token learns nothing about what it asked for. The principal it finds is left in the
request scope for the API and the MCP host server (`principal_of`).

Refusals are answered by `bastion.server.errors`, as every refusal of the HTTP surface is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

import anyio
from anyio.abc import TaskStatus
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from bastion.errors import LedgerUnavailable, NotFound, Unauthenticated
from bastion.models import Principal
from bastion.pipeline.seams import TokenStore
from bastion.server.errors import error_body, http_response

logger = logging.getLogger(__name__)

PRINCIPAL_KEY: Final = "bastion.principal"
"""Where the authenticated principal (None when anonymous) is kept in `scope["state"]`."""

OPEN_PATHS: Final = frozenset({"/healthz", "/metrics", "/favicon.ico"})
"""Open to anyone, tokens or none (`/favicon.ico`: browsers ask for it unasked, with no credentials)."""
API_PREFIX: Final = "/api"
INBOX_PREFIX: Final = "/inbox"

TOKENS_RECHECK_SECONDS: Final = 1.0
"""How long the answer to "does any token exist?" is reused for anonymous requests. Asking costs about
70 µs of CPU (one query through aiosqlite's thread) on every anonymous MCP request of a local, token-less
setup; reusing it means a token created with the CLI binds anonymous hosts within this delay. A presented
token is always checked at once, so a revocation takes effect immediately."""

_INVALID_TOKEN: Final = 'Bearer realm="bastion", error="invalid_token"'
_NO_TOKEN: Final = 'Bearer realm="bastion"'

OAUTH_PATHS: Final = frozenset({"/register", "/authorize", "/token"})
"""Where an OAuth client that was refused looks for an authorization server (besides `/.well-known/`): Bastion has
none, and says so there, so the host shows how to connect instead of an OAuth failure."""

HOST_TOKEN_FIX: Final = (
    "create an agent token with `bastion tokens create NAME --role agent` and reconnect the host with the header "
    '`Authorization: Bearer <token>` (Claude Code: `claude mcp add --transport http NAME URL --header "Authorization: '
    'Bearer <token>"`; Codex: `bearer_token_env_var` in its [mcp_servers] entry; MCP Inspector: `--header`)'
)
"""How a host refused for want of a token gets in: said in the refusal, by `tokens create` and in the log."""


def principal_of(scope: Scope) -> Principal | None:
    """The principal `BearerAuth` authenticated for this request; None when the caller is anonymous."""
    state = scope.get("state")
    found = state.get(PRINCIPAL_KEY) if isinstance(state, dict) else None
    return found if isinstance(found, Principal) else None


def bearer_secret(header: str | None) -> str | None:
    """The secret of an `Authorization: Bearer <secret>` header; None for no header or any other."""
    scheme, _, secret = (header or "").strip().partition(" ")
    return secret.strip() if scheme.lower() == "bearer" and secret.strip() else None


def _token_hint(is_api: bool) -> str:
    if not is_api:
        return HOST_TOKEN_FIX
    return "create one with `bastion tokens create NAME --role admin` and send it as `Authorization: Bearer <token>`"


def _is_oauth_discovery(path: str) -> bool:
    return path in OAUTH_PATHS or path.startswith("/.well-known/")


class BearerAuth:
    """ASGI middleware: authenticate every HTTP request before it reaches a route.

    `/healthz` and `/favicon.ico` are open. `/api/*` always needs a valid token. Everything else (`/mcp`, `/sse`,
    `/messages/`) needs one once any token exists in the ledger, or always when `tokens_required`
    (Bastion listens beyond loopback); until then local hosts may connect anonymously. A token that is
    presented is always checked, wherever it is sent.
    """

    def __init__(
        self,
        app: ASGIApp,
        tokens: TokenStore,
        *,
        tokens_required: bool = False,
        recheck_seconds: float = TOKENS_RECHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.tokens_required = tokens_required
        self.recheck_seconds = recheck_seconds
        self._clock = clock
        self._tokens_seen: tuple[float, bool] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            principal, refusal, challenge = await self._check(scope["path"], Headers(scope=scope).get("authorization"))
        except Exception:  # the ledger failed: answer like every other HTTP refusal, never a bare 500
            logger.exception("authenticating %s failed unexpectedly", scope["path"])
            await JSONResponse(error_body("internal", "internal error; see the server log"), status_code=500)(
                scope, receive, send
            )
            return
        if refusal is not None:
            headers = {"WWW-Authenticate": challenge} if isinstance(refusal, Unauthenticated) else None
            await http_response(refusal, headers=headers)(scope, receive, send)
            return
        scope.setdefault("state", {})[PRINCIPAL_KEY] = principal
        await self.app(scope, receive, send)

    async def _check(
        self, path: str, header: str | None
    ) -> tuple[Principal | None, Unauthenticated | NotFound | None, str]:
        """The caller's principal, or why it is refused and the `WWW-Authenticate` challenge to send."""
        if _is_oauth_discovery(path):
            message = "Bastion has no OAuth authorization server: hosts authenticate with a bearer token; "
            return None, NotFound(message + HOST_TOKEN_FIX), _NO_TOKEN
        if path in OPEN_PATHS or (header is None and (path == INBOX_PREFIX or path.startswith(INBOX_PREFIX + "/"))):
            return None, None, _NO_TOKEN  # the inbox authenticates by its own session cookie
        is_api = path == API_PREFIX or path.startswith(API_PREFIX + "/")
        if header is None:
            return None, await self._anonymous_refusal(is_api), _NO_TOKEN
        principal = await self._principal(header)
        if principal is None:
            message = "the bearer token is not valid (malformed, unknown or revoked); " + _token_hint(is_api)
            return None, Unauthenticated(message), _INVALID_TOKEN
        return principal, None, _NO_TOKEN

    async def _anonymous_refusal(self, is_api: bool) -> Unauthenticated | None:
        """Why a request without a token is refused; None when anonymous callers are allowed there."""
        if is_api:
            return Unauthenticated("the approver API needs a bearer token; " + _token_hint(is_api))
        if self.tokens_required or await self._tokens_exist():
            return Unauthenticated("this Bastion requires a bearer token from every caller; " + _token_hint(is_api))
        return None

    async def _tokens_exist(self) -> bool:
        """Whether the ledger holds an active token, asked at most once per `recheck_seconds`; a change is logged."""
        now = self._clock()
        if self._tokens_seen is not None and now - self._tokens_seen[0] < self.recheck_seconds:
            return self._tokens_seen[1]
        exists = await self.tokens.has_tokens()
        if self._tokens_seen is not None and exists != self._tokens_seen[1] and not self.tokens_required:
            if exists:
                # Not HOST_TOKEN_FIX: its `Bearer <token>` would read as a credential to the log's redaction.
                logger.warning(
                    "a token now exists: hosts without one are refused on /mcp, /sse and /messages/ from now on; "
                    "reconnect each with an agent token (`bastion tokens create NAME --role agent`) sent in its "
                    "Authorization header (Claude Code and the Inspector: --header; Codex: bearer_token_env_var)"
                )
            else:
                logger.warning("no token is active any more: local hosts may connect without one again")
        self._tokens_seen = (now, exists)
        return exists

    async def watch_tokens(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled, look whether tokens exist every `recheck_seconds`, so the change is logged when it
        happens (and anonymous requests find the answer fresh). Started (`task_group.start`) once it has looked. A
        ledger that cannot be read for a while is looked at again later (requests meanwhile are answered 500)."""
        started = False
        while True:
            try:
                await self._tokens_exist()
            except LedgerUnavailable as exc:
                logger.debug("whether tokens exist could not be read: %s", exc.message)
            if not started:
                task_status.started()
                started = True
            await anyio.sleep(self.recheck_seconds)

    async def _principal(self, header: str) -> Principal | None:
        """The principal of an `Authorization: Bearer <secret>` header; None for any other header."""
        secret = bearer_secret(header)
        return None if secret is None else await self.tokens.authenticate(secret)
