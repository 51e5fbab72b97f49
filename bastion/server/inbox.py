"""`/inbox`: the approvers' web page, server-rendered, with a little vanilla JS for countdowns and live
updates.

Login is by an owner or admin token, posted once in a form: the server keeps it in memory against a random session
id, and the browser gets only that id, in an HTTP-only, SameSite=Strict cookie scoped to `/inbox` (Secure when
served over HTTPS). Each request re-checks the token, so revoking it ends the session at once. No secret ever
appears in a URL. Every form carries a CSRF token bound to the session (the login form one bound to a cookie of its
own) and a form without the right one is refused 403 before anything happens; SameSite=Strict and the Host/Origin
guard add to that. Sessions live in this process: a restart asks approvers to log in again.

Decisions go through bastion.pipeline.authority, as from every other place (a bulk deny too, one call at a time);
scopes beyond "once" leave grants, listed and revoked under `/inbox/grants`. An agent token is refused here, at login
and when presented as a bearer token. A refusal reaches a browser as a page with a message (a script, or any client
that does not ask for HTML, gets the error's JSON); an ended session sends the browser back to the login page, which
says so. The page's script fetches one card at a time (`/inbox/approvals/{id}/card`) as calls go pending.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Final
from urllib.parse import parse_qsl

from starlette.datastructures import ImmutableMultiDict
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from bastion.errors import BastionError, CsrfRefused, Forbidden, InvalidArguments, NotFound, Unauthenticated
from bastion.models import SCOPES, STATUSES, Invocation, Principal, Quorum, Scope, utcnow
from bastion.pipeline.authority import decide, visible_invocation
from bastion.pipeline.documents import pending_invocations, stored_preview
from bastion.pipeline.gateway import Gateway
from bastion.pipeline.grants import SCOPE_LABELS
from bastion.server import inbox_pages as pages
from bastion.server.auth import principal_of
from bastion.server.errors import http_response
from bastion.server.events import event_stream, resume_point
from bastion.server.inbox_pages import Notice, error_notice
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
_STATIC: Final = {
    "inbox.css": "text/css; charset=utf-8",
    "inbox.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
FAVICON: Final = "/favicon.ico"
"""Where browsers look for a site's icon unasked: served the inbox's, to anyone (BearerAuth leaves it open)."""
ENDED: Final = Notice(
    "Log in again: nothing you sent after it ended was done.", error_class="unauthenticated", lead="Your session ended"
)
Form = ImmutableMultiDict[str, str]


@dataclass
class InboxSession:
    """One logged-in browser: the token it logged in with (kept here only), its CSRF token, a message to show."""

    secret: str
    csrf: str
    last_used: float
    notice: Notice | None = None

    def told(self) -> Notice | None:
        """The message to show on the next page, once."""
        notice, self.notice = self.notice, None
        return notice


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
            Route(f"{INBOX}/approvals/deny", self._guarded(self.deny_picked), methods=post),
            Route(f"{INBOX}/approvals/{{invocation_id}}/card", self._guarded(self.card, page=False), methods=get),
            Route(f"{INBOX}/grants", self._guarded(self.grants), methods=get),
            Route(f"{INBOX}/grants/{{grant_id}}/revoke", self._guarded(self.revoke_grant), methods=post),
            Route(f"{INBOX}/history", self._guarded(self.history), methods=get),
            Route(f"{INBOX}/invocations/{{invocation_id}}", self._guarded(self.invocation), methods=get),
            Route(f"{INBOX}/events", self._guarded(self.events, page=False), methods=get),
            Route(f"{INBOX}/static/{{name}}", self.static, methods=get),
            Route(FAVICON, self.favicon, methods=get),
        ]

    # -- sessions ------------------------------------------------------------------------------------

    def _guarded(
        self, handler: Callable[[Request, Principal, str, InboxSession], Awaitable[Response]], *, page: bool = True
    ) -> Callable[[Request], Awaitable[Response]]:
        """A route for logged-in approvers only: others go to the login page (an agent token gets 403). Not a
        `page` (what the page's script fetches): 401 instead, which the script tells its reader."""

        async def endpoint(request: Request) -> Response:
            bearer = principal_of(request.scope)
            if bearer is not None and not bearer.may_decide:
                return _refused(
                    request, Forbidden(f"{bearer.name} has the {bearer.role} role; the inbox is for approvers")
                )
            found = await self._session(request)
            if found is None:
                if page and (request.method == "GET" or _wants_html(request)):
                    ended = SESSION_COOKIE in request.cookies  # it had a session, which ended
                    return _redirect(f"{INBOX}/login{'?ended=1' if ended else ''}")
                return _refused(request, Unauthenticated("log in to the inbox first, at /inbox/login"))
            session_id, session, principal = found
            if request.method == "POST":
                form = await _form(request)
                if not _same_token(form.get("csrf", ""), session.csrf):
                    return _refused(
                        request, CsrfRefused("the form's CSRF token is missing or wrong; reload the page and retry")
                    )
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

    async def login_form(self, request: Request, notice: Notice | None = None, status: int = 200) -> Response:
        if notice is None and request.query_params.get("ended"):
            notice = ENDED
        csrf = secrets.token_urlsafe(32)
        response = _html(pages.page("Log in", pages.login_body(csrf, notice), principal=None, csrf=None), status)
        _set_cookie(request, response, LOGIN_COOKIE, csrf, max_age=3600)
        return response

    async def login(self, request: Request) -> Response:
        form = await _form(request)
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not _same_token(form.get("csrf", ""), expected):
            return _refused(
                request, CsrfRefused("the login form's CSRF token is missing or wrong; reload the page and retry")
            )
        secret = form.get("token", "").strip()
        principal = await self.gateway.ledger.tokens.authenticate(secret) if secret else None
        if principal is None:
            refusal = Notice("That token is unknown, revoked or mistyped.", "unauthenticated", lead="Not logged in")
            return await self.login_form(request, refusal, 401)
        if not principal.may_decide:
            refusal = Notice(
                f"{principal.name} has the {principal.role} role; the inbox is for owner and admin tokens.",
                "forbidden",
                lead="Not logged in",
            )
            return await self.login_form(request, refusal, 403)
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
        events_of = {i.id: await self.gateway.ledger.invocations.events(i.id) for i in found}
        quorums = {key: Quorum.of(events) for key, events in events_of.items()}
        previews = {key: preview for key, events in events_of.items() if (preview := stored_preview(events))}
        body = pages.pending_body(
            found,
            now,
            session.csrf,
            session.told(),
            cursor=cursor,
            scopes_of=lambda i: self.gateway.grants.offered(i, approvers=quorums[i.id].required),
            quorums=quorums,
            previews=previews,
        )
        return _html(pages.page("Pending", body, principal=principal, csrf=session.csrf))

    async def card(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        """One pending call's card, for the page's script to show as the call goes pending; 404 once it is not."""
        invocation_id = request.path_params["invocation_id"]
        found = await self.gateway.ledger.invocations.get(invocation_id)
        now = utcnow()
        if found is None or found.status != "pending" or (found.expires_at is not None and found.expires_at <= now):
            return _refused(request, NotFound(f"no pending call {invocation_id!r}", invocation_id=invocation_id))
        events = await self.gateway.ledger.invocations.events(found.id)
        quorum = Quorum.of(events)
        offered = self.gateway.grants.offered(found, approvers=quorum.required)
        card = pages.pending_card(found, now, session.csrf, offered, quorum, stored_preview(events))
        return _html(card)

    async def grants(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        now = utcnow()
        standing = await self.gateway.grants.store.grants(standing_at=now)
        body = pages.grants_body(standing, now, session.csrf, session.told())
        return _html(pages.page("Grants", body, principal=principal, csrf=session.csrf, current="/grants"))

    async def history(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        status = request.query_params.get("status") or None  # the form's empty choice: every status
        source = request.query_params.get("source") or None
        if status is not None and status not in STATUSES:
            return _refused(
                request, InvalidArguments(f"unknown status {status!r}: expected one of {', '.join(STATUSES)}")
            )
        found = await self.gateway.ledger.invocations.list(status=status, source_id=source, limit=DEFAULT_LIMIT)
        body = pages.history_body(found, status, source)
        return _html(pages.page("History", body, principal=principal, csrf=session.csrf, current="/history"))

    async def invocation(
        self, request: Request, principal: Principal, session_id: str, session: InboxSession
    ) -> Response:
        try:
            found = await visible_invocation(self.gateway.ledger, principal, request.path_params["invocation_id"])
        except BastionError as exc:
            return _refused(request, exc)
        body = pages.invocation_body(found, await self.gateway.ledger.invocations.events(found.id))
        return _html(pages.page(found.tool, body, principal=principal, csrf=session.csrf, current="/history"))

    async def events(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        try:
            after = resume_point(request)
        except InvalidArguments as exc:
            return _refused(request, exc)

        async def still_allowed() -> bool:  # not logged out, its token not revoked
            return await self._live_session(session_id, used=False) is not None

        return event_stream(self.gateway.ledger, principal, after, still_allowed=still_allowed, slots=self._slots)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return Response("not found", status_code=404, media_type="text/plain")
        return _static_file(name)

    async def favicon(self, request: Request) -> Response:
        return _static_file("favicon.svg")

    # -- decisions -----------------------------------------------------------------------------------

    async def approve(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        form: Form = request.state.form
        scope = form.get("scope", "once")
        if scope not in SCOPES:  # the page offers only these: a forged or stale form, refused before deciding
            return _refused(request, InvalidArguments(f"unknown scope {scope!r}: expected one of {', '.join(SCOPES)}"))
        rule = form.get("when", "").strip() or None
        try:
            decided = await self._decide(
                principal,
                request.path_params["invocation_id"],
                approve=True,
                note=form.get("note"),
                scope=scope,
                rule=rule,
            )
        except BastionError as exc:
            session.notice = error_notice(exc)
        else:
            scoped = f" ({SCOPE_LABELS[scope]}: see Grants)" if scope != "once" else ""
            session.notice = Notice(f"{decided.tool} approved{scoped}.")
            if decided.status == "pending":  # one approval of a call that needs several
                summary = Quorum.of(await self.gateway.ledger.invocations.events(decided.id)).summary
                session.notice = Notice(f"{decided.tool}: your approval is recorded ({summary}); it waits for another.")
        return _redirect(INBOX)

    async def deny(self, request: Request, principal: Principal, session_id: str, session: InboxSession) -> Response:
        form: Form = request.state.form
        try:
            decided = await self._decide(
                principal, request.path_params["invocation_id"], approve=False, note=form.get("reason")
            )
        except BastionError as exc:
            session.notice = error_notice(exc)
        else:
            session.notice = Notice(f"{decided.tool} denied.")
        return _redirect(INBOX)

    async def deny_picked(
        self, request: Request, principal: Principal, session_id: str, session: InboxSession
    ) -> Response:
        """Deny every call picked on the page with one reason: each decided on its own, as a single deny is (one
        already decided elsewhere is told, and the others are still denied)."""
        form: Form = request.state.form
        picked = list(dict.fromkeys(form.getlist("id")))
        if not picked or len(picked) > DEFAULT_LIMIT:
            session.notice = error_notice(
                InvalidArguments(f"pick from 1 to {DEFAULT_LIMIT} calls to deny (the box beside each call's name)")
            )
            return _redirect(INBOX)
        denied: list[Invocation] = []
        failed: list[BastionError] = []
        for invocation_id in picked:
            try:
                denied.append(await self._decide(principal, invocation_id, approve=False, note=form.get("reason")))
            except BastionError as exc:
                failed.append(exc)
        said = f"{len(denied)} denied ({', '.join(i.tool for i in denied)})."
        if not failed:
            session.notice = Notice(said)
        else:
            reasons = "; ".join(exc.message for exc in failed) + "."
            lead = f"{len(failed)} of {len(picked)} not denied"
            text = f"{reasons} The others: {said}" if denied else reasons
            session.notice = Notice(text, error_class=failed[0].error_class, lead=lead)
        return _redirect(INBOX)

    async def _decide(
        self,
        principal: Principal,
        invocation_id: str,
        *,
        approve: bool,
        note: str | None,
        scope: Scope = "once",
        rule: str | None = None,
    ) -> Invocation:
        """One decision, through the authority every surface decides through."""
        return await decide(
            self.gateway.ledger,
            invocation_id,
            approve=approve,
            principal=principal,
            note=note or None,
            now=utcnow(),
            scope=scope,
            rule=rule,
            grants=self.gateway.grants,
        )

    async def revoke_grant(
        self, request: Request, principal: Principal, session_id: str, session: InboxSession
    ) -> Response:
        try:
            revoked = await self.gateway.grants.store.revoke(
                request.path_params["grant_id"], by=principal.name, now=utcnow()
            )
        except BastionError as exc:
            session.notice = error_notice(exc)
        else:
            session.notice = Notice(f"Grant {revoked.id} on {revoked.policy_key} revoked.")
        return _redirect(f"{INBOX}/grants")


# -- responses -------------------------------------------------------------------------------------------


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=SECURITY_HEADERS)


def _redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)


def _wants_html(request: Request) -> bool:
    """Whether the request comes from a browser's page (a form sent, a link followed), which asks for HTML."""
    return "text/html" in request.headers.get("accept", "")


def _refused(request: Request, exc: BastionError) -> Response:
    """A refusal: a page with a message for a browser, the error's JSON for a script."""
    if _wants_html(request):
        body = pages.refused_body(error_notice(exc))
        return _html(pages.page("Not done", body, principal=None, csrf=None), exc.http_status)
    return http_response(exc, headers=SECURITY_HEADERS)


def _static_file(name: str) -> Response:
    text = resources.files("bastion.server").joinpath("static", name).read_text(encoding="utf-8")
    return Response(text, media_type=_STATIC[name], headers={"Cache-Control": "no-cache"})


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


async def _form(request: Request) -> Form:
    """A urlencoded form's fields (`getlist` for a field sent more than once); too large or not a form: empty."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return Form()
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return Form()
    return Form(parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True))


def _same_token(sent: str, expected: str) -> bool:
    """A form's CSRF token against the expected one, in constant time; any text a form sends is compared (as UTF-8
    bytes: `compare_digest` refuses non-ASCII strings, which a forged form may hold)."""
    return hmac.compare_digest(sent.encode(), expected.encode())
