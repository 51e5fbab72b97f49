"""`/inbox`: the approvers' web page, server-rendered, with a little vanilla JS for countdowns and live
updates.

Login is by an owner or admin token, posted once in a form: the server keeps it in memory against a random session
id, and the browser gets only that id, in an HTTP-only, SameSite=Strict cookie scoped to `/inbox` (Secure when
served over HTTPS). Each request re-checks the token, so revoking it ends the session at once. No secret ever
appears in a URL. Every form carries a CSRF token bound to the session (the login form one bound to a cookie of its
own) and a form without the right one is refused 403 before anything happens; SameSite=Strict and the Host/Origin
guard add to that. Sessions live in this process: a restart asks approvers to log in again.

Decisions go through bastion.pipeline.authority, as from every other place; scopes beyond "once" leave grants,
listed and revoked under `/inbox/grants`. An agent token is refused here, at login and when presented as a bearer token.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Final
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from bastion.errors import BastionError, CsrfRefused, Forbidden, InvalidArguments, Unauthenticated
from bastion.models import SCOPES, STATUSES, Principal, Scope, utcnow
from bastion.pipeline.authority import decide, visible_invocation
from bastion.pipeline.documents import pending_invocations
from bastion.pipeline.gateway import Gateway
from bastion.pipeline.grants import SCOPE_LABELS
from bastion.server import inbox_pages as pages
from bastion.server.auth import principal_of
from bastion.server.errors import http_response
from bastion.server.events import event_stream, resume_point
from bastion.server.limits import StreamSlots
from bastion.terms import DEFAULT_LIMIT

INBOX: Final = pages.INBOX
SESSION_COOKIE: Final = "bastion_inbox"
LOGIN_COOKIE: Final = "bastion_login"
SESSION_SECONDS: Final = 8 * 3600
"""How long a login lasts without being used."""
MAX_FORM_BYTES: Final = 16 * 1024

SECURITY_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_STATIC: Final = {"inbox.css": "text/css; charset=utf-8", "inbox.js": "text/javascript; charset=utf-8"}


@dataclass
class InboxSession:
    """One logged-in browser: the token it logged in with (kept here only), its CSRF token, a message to show."""

    secret: str
    csrf: str
    last_used: float
    message: tuple[str, bool] | None = None


class Inbox:
    """The routes of `/inbox` over one gateway."""

    def __init__(
        self, gateway: Gateway, *, slots: StreamSlots | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.gateway = gateway
        self._sessions: dict[str, InboxSession] = {}
        self._clock = clock
        self._slots = slots if slots is not None else StreamSlots()
        """The event streams held open, per principal (shared with `/api/events`)."""

    def routes(self) -> list[BaseRoute]:
        get, post = ["GET"], ["POST"]
        return [
            Route(INBOX, self._guarded(self.pending), methods=get),
            Route(f"{INBOX}/login", self.login_form, methods=get),
            Route(f"{INBOX}/login", self.login, methods=post),
            Route(f"{INBOX}/logout", self._guarded(self.logout), methods=post),
            Route(f"{INBOX}/approvals/{{invocation_id}}/approve", self._guarded(self.approve), methods=post),
            Route(f"{INBOX}/approvals/{{invocation_id}}/deny", self._guarded(self.deny), methods=post),
            Route(f"{INBOX}/grants", self._guarded(self.grants), methods=get),
            Route(f"{INBOX}/grants/{{grant_id}}/revoke", self._guarded(self.revoke_grant), methods=post),
            Route(f"{INBOX}/history", self._guarded(self.history), methods=get),
            Route(f"{INBOX}/invocations/{{invocation_id}}", self._guarded(self.invocation), methods=get),
            Route(f"{INBOX}/events", self._guarded(self.events), methods=get),
            Route(f"{INBOX}/static/{{name}}", self.static, methods=get),
        ]

    # -- sessions ------------------------------------------------------------------------------------

    def _guarded(
        self, handler: Callable[[Request, Principal, str, InboxSession], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """A route for logged-in approvers only: others go to the login page (an agent token gets 403)."""

        async def endpoint(request: Request) -> Response:
            bearer = principal_of(request.scope)
            if bearer is not None and not bearer.may_decide:
                return _refused(Forbidden(f"{bearer.name} has the {bearer.role} role; the inbox is for approvers"))
            found = await self._session(request)
            if found is None:
                if request.method == "GET" and request.url.path != f"{INBOX}/events":
                    return _redirect(f"{INBOX}/login")
                return _refused(Unauthenticated("log in to the inbox first, at /inbox/login"))
            session_id, session, principal = found
            if request.method == "POST":
                form = await _form(request)
                if not _same_token(form.get("csrf", ""), session.csrf):
                    return _refused(CsrfRefused("the form's CSRF token is missing or wrong; reload the page and retry"))
                request.state.form = form
            response = await handler(request, principal, session_id, session)
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return endpoint

    async def _session(self, request: Request) -> tuple[str, InboxSession, Principal] | None:
        return await self._live_session(request.cookies.get(SESSION_COOKIE, ""))

    async def _live_session(self, session_id: str, *, used: bool = True) -> tuple[str, InboxSession, Principal] | None:
        """The session, if it is still logged in and its token still an approver's (it is forgotten otherwise);
        `used`: a request of the approver's, which keeps it from idling out (an open stream's checks do not)."""
        session = self._sessions.get(session_id)
        now = self._clock()
        if session is None or now - session.last_used > SESSION_SECONDS:
            self._sessions.pop(session_id, None)
            return None
        principal = await self.gateway.ledger.tokens.authenticate(session.secret)
        if principal is None or not principal.may_decide:  # revoked since
            self._sessions.pop(session_id, None)
            return None
        if used:
            session.last_used = now
        return session_id, session, principal

    # -- login ---------------------------------------------------------------------------------------

    async def login_form(self, request: Request, message: str | None = None, status: int = 200) -> Response:
        csrf = secrets.token_urlsafe(32)
        response = _html(pages.page("Log in", pages.login_body(csrf, message), principal=None, csrf=None), status)
        _set_cookie(request, response, LOGIN_COOKIE, csrf, max_age=3600)
        return response

    async def login(self, request: Request) -> Response:
        form = await _form(request)
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not _same_token(form.get("csrf", ""), expected):
            return _refused(CsrfRefused("the login form's CSRF token is missing or wrong; reload the page and retry"))
        secret = form.get("token", "").strip()
        principal = await self.gateway.ledger.tokens.authenticate(secret) if secret else None
        if principal is None:
            return await self.login_form(request, "That token is not valid (unknown, revoked or mistyped).", 401)
        if not principal.may_decide:
            return await self.login_form(
                request,
                f"{principal.name} has the {principal.role} role; the inbox is for owner and admin tokens.",
                403,
            )
        session_id = secrets.token_urlsafe(32)
        self._sessions[session_id] = InboxSession(secret, secrets.token_urlsafe(32), self._clock())
        response = _redirect(INBOX)
        _set_cookie(request, response, SESSION_COOKIE, session_id, max_age=SESSION_SECONDS)
        response.delete_cookie(LOGIN_COOKIE, path=INBOX)
        return response

    async def logout(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        self._sessions.pop(session_id, None)
        response = _redirect(f"{INBOX}/login")
        response.delete_cookie(SESSION_COOKIE, path=INBOX)
        return response

    # -- pages ---------------------------------------------------------------------------------------

    async def pending(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        now = utcnow()
        # The feed's cursor before the list is read: the page's live stream resumes after it, so a call that goes
        # pending while the page loads or its stream connects is announced to it (at worst shown and announced).
        cursor = self.gateway.ledger.changes.cursor
        found = await pending_invocations(self.gateway.ledger.invocations, now, limit=DEFAULT_LIMIT)
        message, session.message = session.message, None
        text, error = message if message is not None else (None, False)
        body = pages.pending_body(
            found, now, session.csrf, text, error, cursor=cursor, scopes_of=self.gateway.grants.offered
        )
        return _html(pages.page("Pending", body, principal=principal, csrf=session.csrf))

    async def grants(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        now = utcnow()
        standing = await self.gateway.grants.store.grants(standing_at=now)
        message, session.message = session.message, None
        text, error = message if message is not None else (None, False)
        body = pages.grants_body(standing, now, session.csrf, text, error)
        return _html(pages.page("Grants", body, principal=principal, csrf=session.csrf, current="/grants"))

    async def history(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        status = request.query_params.get("status") or None  # the form's empty choice: every status
        source = request.query_params.get("source") or None
        if status is not None and status not in STATUSES:
            return _refused(InvalidArguments(f"unknown status {status!r}: expected one of {', '.join(STATUSES)}"))
        found = await self.gateway.ledger.invocations.list(status=status, source_id=source, limit=DEFAULT_LIMIT)
        body = pages.history_body(found, status, source)
        return _html(pages.page("History", body, principal=principal, csrf=session.csrf, current="/history"))

    async def invocation(
        self, request: Request, principal: Principal, session_id: str, session: InboxSession
    ) -> Response:
        try:
            found = await visible_invocation(self.gateway.ledger, principal, request.path_params["invocation_id"])
        except BastionError as exc:
            return _refused(exc)
        body = pages.invocation_body(found, await self.gateway.ledger.invocations.events(found.id))
        return _html(pages.page(found.tool, body, principal=principal, csrf=session.csrf, current="/history"))

    async def events(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        try:
            after = resume_point(request)
        except InvalidArguments as exc:
            return _refused(exc)

        async def still_allowed() -> bool:  # not logged out, its token not revoked
            return await self._live_session(session_id, used=False) is not None

        return event_stream(self.gateway.ledger, principal, after, still_allowed=still_allowed, slots=self._slots)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return Response("not found", status_code=404, media_type="text/plain")
        text = resources.files("bastion.server").joinpath("static", name).read_text(encoding="utf-8")
        return Response(text, media_type=_STATIC[name], headers={"Cache-Control": "no-cache"})

    # -- decisions -----------------------------------------------------------------------------------

    async def approve(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        form: dict[str, str] = request.state.form
        scope = form.get("scope", "once")
        if scope not in SCOPES:  # the page offers only these: a forged or stale form, refused before deciding
            return _refused(InvalidArguments(f"unknown scope {scope!r}: expected one of {', '.join(SCOPES)}"))
        return await self._decide(
            request,
            principal,
            session,
            approve=True,
            note=form.get("note") or None,
            scope=scope,
            rule=form.get("when", "").strip() or None,
        )

    async def deny(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        form: dict[str, str] = request.state.form
        return await self._decide(request, principal, session, approve=False, note=form.get("reason") or None)

    async def _decide(
        self,
        request: Request,
        principal: Principal,
        session: InboxSession,
        *,
        approve: bool,
        note: str | None,
        scope: Scope = "once",
        rule: str | None = None,
    ) -> Response:
        invocation_id = request.path_params["invocation_id"]
        try:
            decided = await decide(
                self.gateway.ledger,
                invocation_id,
                approve=approve,
                principal=principal,
                note=note,
                now=utcnow(),
                scope=scope,
                rule=rule,
                grants=self.gateway.grants,
            )
        except BastionError as exc:
            session.message = (f"{exc.error_class}: {exc.message}", True)
            return _redirect(INBOX)
        verb = "approved" if approve else "denied"
        scoped = f" ({SCOPE_LABELS[scope]}: see Grants)" if approve and scope != "once" else ""
        session.message = (f"{decided.tool} {verb}{scoped}.", False)
        return _redirect(INBOX)

    async def revoke_grant(
        self, request: Request, principal: Principal, session_id: str, session: InboxSession
    ) -> Response:
        try:
            revoked = await self.gateway.grants.store.revoke(
                request.path_params["grant_id"], by=principal.name, now=utcnow()
            )
        except BastionError as exc:
            session.message = (f"{exc.error_class}: {exc.message}", True)
        else:
            session.message = (f"Grant {revoked.id} on {revoked.policy_key} revoked.", False)
        return _redirect(f"{INBOX}/grants")


# -- responses -------------------------------------------------------------------------------------------


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=SECURITY_HEADERS)


def _redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)


def _refused(exc: BastionError) -> Response:
    return http_response(exc, headers=SECURITY_HEADERS)


def _set_cookie(request: Request, response: Response, name: str, value: str, *, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=INBOX,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


async def _form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (the first value of each); too large or not a form: empty."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    parsed = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {key: values[0] for key, values in parsed.items()}


def _same_token(sent: str, expected: str) -> bool:
    """A form's CSRF token against the expected one, in constant time; any text a form sends is compared (as UTF-8
    bytes: `compare_digest` refuses non-ASCII strings, which a forged form may hold)."""
    return hmac.compare_digest(sent.encode(), expected.encode())
