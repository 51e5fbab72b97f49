"""The inbox's HTML: plain functions from views to escaped HTML strings; no template engine, no build step.

Every value shown is escaped here. Every form carries the session's CSRF token. Scripts and styles come from
`/inbox/static/` only, so the pages' Content-Security-Policy forbids inline script.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from html import escape
from typing import Any, Final

from bastion.models import STATUSES, Grant, Invocation, InvocationEvent, Principal, Scope
from bastion.pipeline.documents import expires_in
from bastion.pipeline.grants import SCOPE_LABELS
from bastion.program import bastion_command

INBOX: Final = "/inbox"
ScopesOf = Callable[[Invocation], Sequence[Scope]]


def page(title: str, body: str, *, principal: Principal | None, csrf: str | None, current: str = "") -> str:
    """A whole page: the header (with who is logged in and a logout form) around `body`."""
    nav = ""
    if principal is not None and csrf is not None:
        links = "".join(
            f'<a href="{INBOX}{href}"{" class=current" if href == current else ""}>{label}</a>'
            for href, label in (("", "Pending"), ("/grants", "Grants"), ("/history", "History"))
        )
        nav = (
            f"{links}<span class=who>{escape(principal.name)} ({escape(principal.role)})</span>"
            f'<form method=post action="{INBOX}/logout">{csrf_field(csrf)}<button type=submit>Log out</button></form>'
        )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · Bastion</title>"
        f'<link rel=stylesheet href="{INBOX}/static/inbox.css"></head><body>'
        f"<header><strong>Bastion</strong>{nav}</header><main>{body}</main>"
        f'<script src="{INBOX}/static/inbox.js"></script></body></html>'
    )


def csrf_field(token: str) -> str:
    return f'<input type=hidden name=csrf value="{escape(token)}">'


def flash(message: str | None, *, error: bool = False) -> str:
    if not message:
        return ""
    return f'<div class="flash{" error" if error else ""}" role=status>{escape(message)}</div>'


def login_body(csrf: str, message: str | None = None) -> str:
    return (
        '<div class="card login"><h1>Approver inbox</h1>'
        f"{flash(message, error=True)}"
        f'<form method=post action="{INBOX}/login">{csrf_field(csrf)}'
        "<label for=token>Owner or admin token</label>"
        "<input id=token name=token type=password autocomplete=off required>"
        "<button class=approve type=submit>Log in</button></form>"
        f"<p class=empty>Create one with {shell_command(f'{bastion_command()} tokens create NAME --role admin')}.</p>"
        "</div>"
    )


def shell_command(command: str) -> str:
    """A command to copy, as HTML: it wraps between words only, never inside one (a browser may break `--role`
    between its hyphens, and what is copied must run as written)."""
    words = " ".join(f"<span class=word>{escape(word)}</span>" for word in command.split())
    return f"<code class=command>{words}</code>"


def pending_body(
    pending: Sequence[Invocation],
    now: datetime,
    csrf: str,
    message: str | None,
    error: bool,
    *,
    cursor: int,
    scopes_of: ScopesOf,
) -> str:
    """The pending calls as of ledger event `cursor`, which the page's live stream resumes after, each with the
    scopes an approval of it may take."""
    cards = "".join(_pending_card(invocation, now, csrf, scopes_of(invocation)) for invocation in pending)
    if not cards:
        cards = "<p class=empty>Nothing is waiting for an approver.</p>"
    return (
        f"<h1>Pending calls ({len(pending)})</h1>{flash(message, error=error)}"
        f'<div id=live class=live data-after="{cursor}">Connecting to live updates...</div>'
        f"{cards}"
    )


def _pending_card(invocation: Invocation, now: datetime, csrf: str, offered: Sequence[Scope]) -> str:
    i = invocation
    left = expires_in(i, now)
    countdown = (
        f'<span class=countdown data-expires-at="{escape(i.expires_at.isoformat())}">{left} s left</span>'
        if i.expires_at is not None
        else "no expiry"
    )
    drift = '<span class="badge drift">drifted</span>' if i.drift is not None else ""
    action = f"{INBOX}/approvals/{escape(i.id)}"
    scopes = "".join(f'<option value="{s}">{escape(SCOPE_LABELS[s])}</option>' for s in offered)
    return (
        f'<section class=card data-invocation="{escape(i.id)}">'
        f"<h2>{escape(i.tool)} <span class='badge risk-{escape(i.risk)}'>{escape(i.risk)}</span> {drift}</h2>"
        f"{_meta(i, ('expires', countdown))}"
        f"<div class=why><strong>Why it waits:</strong> {escape(why(i))}</div>"
        f"<div><strong>Arguments</strong> (redacted)</div><pre class=args>{escape(_json(i.args))}</pre>"
        f"{_diff(i.drift)}"
        "<div class=decide>"
        f'<form method=post action="{action}/approve">{csrf_field(csrf)}'
        '<input type=text name=note placeholder="note (optional)" aria-label="note">'
        f'<select name=scope aria-label="scope">{scopes}</select>'
        '<input type=text name=when placeholder="later calls only when... (CEL, optional)" '
        'aria-label="condition on later calls">'
        "<button class=approve type=submit>Approve</button></form>"
        f'<form method=post action="{action}/deny">{csrf_field(csrf)}'
        '<input type=text name=reason placeholder="reason" aria-label="reason">'
        "<button class=deny type=submit>Deny</button></form>"
        "</div></section>"
    )


def why(invocation: Invocation) -> str:
    """Why a call waits, in a phrase: the rule that gave its mode, and where its risk came from."""
    reason = _why_mode(invocation)
    risk = _why_risk(invocation)
    if risk:
        reason += f"; its risk ({invocation.risk}) {risk}"
    if invocation.drift is not None and invocation.mode_source != "drift":
        reason += "; its tool's definition also drifted from the pinned one (diff below)"
    return reason


_RISK_REASONS: Final = {
    "override": "is set by the tool's risk override in its connector file",
    "destructiveHint": "comes from the tool's destructiveHint annotation",
    "readOnlyHint": "comes from the tool's readOnlyHint annotation",
    "default_risk": "is its connector's default_risk",
    "default": "is the default: no override, no annotation, no default_risk",
    "declared": "is declared by the action",
}


def _why_risk(invocation: Invocation) -> str:
    source = invocation.risk_source
    if source is None:  # recorded before Bastion kept it
        return ""
    if source.startswith("step:"):
        return f"is that of its riskiest step, {source.removeprefix('step:')}"
    return _RISK_REASONS.get(source, f"comes from {source}")


def _why_mode(invocation: Invocation) -> str:
    source = invocation.mode_source
    if source == "drift":
        return "its tool's definition drifted from the pinned one, so an allowed call needs a look (diff below)"
    if source == "profile":
        return f"the session's profile ({invocation.profile}) asks for approval of {invocation.policy_key}"
    if source == "org":
        return f"the organisation policy asks for approval of {invocation.policy_key}"
    if source == "inferred":
        return f"no policy names it; a {invocation.risk} action needs approval by default"
    return f"mode source {source}"


def _meta(invocation: Invocation, *extra: tuple[str, str]) -> str:
    i = invocation
    rows: list[tuple[str, str]] = [
        ("id", escape(i.id)),
        ("source", escape(i.source_id)),
        ("policy key", escape(i.policy_key)),
        ("risk", escape(i.risk if i.risk_source is None else f"{i.risk} (from {i.risk_source})")),
        ("mode", f"{escape(i.mode)} (from {escape(i.mode_source)})"),
        ("agent", escape(i.principal or "anonymous")),
        ("session", escape(i.session_id)),
        ("created", escape(i.created_at.isoformat(timespec="seconds"))),
        *extra,
    ]
    return "<dl class=meta>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def _diff(lines: list[str] | None) -> str:
    if not lines:
        return ""
    shown = []
    for line in lines:
        kind = "add" if line.startswith("+") and not line.startswith("+++") else ""
        kind = "del" if line.startswith("-") and not line.startswith("---") else kind
        shown.append(f'<span class="{kind}">{escape(line)}</span>' if kind else escape(line))
    return "<div><strong>Drift</strong> (pinned → current)</div><pre class=diff>" + "\n".join(shown) + "</pre>"


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def grants_body(grants: Sequence[Grant], now: datetime, csrf: str, message: str | None, error: bool) -> str:
    """The standing grants, newest first, each with the form that revokes it."""
    rows = "".join(_grant_row(grant, csrf) for grant in grants)
    return (
        f"<h1>Standing grants ({len(grants)})</h1>{flash(message, error=error)}"
        "<p class=empty>Approvals beyond &ldquo;once&rdquo; let later calls of their action through without an "
        "approver, unless an operator rule denies or holds them. Revoking one holds the next call it covered.</p>"
        "<table><tr><th>grant</th><th>action</th><th>scope</th><th>covers</th><th>only when</th><th>by</th>"
        "<th>made</th><th>until</th><th></th></tr>"
        f"{rows or '<tr><td colspan=9 class=empty>No standing grants.</td></tr>'}</table>"
    )


def _grant_row(grant: Grant, csrf: str) -> str:
    g = grant
    covers = {"session": f"session {g.session_id}", "hour": f"caller {g.principal or '(no token)'}"}.get(
        g.scope, "every caller"
    )
    made = g.created_at.isoformat(timespec="seconds")
    made_by = f'<a href="{INBOX}/invocations/{escape(g.invocation_id)}">{escape(made)}</a>' if g.invocation_id else made
    until = g.expires_at.isoformat(timespec="seconds") if g.expires_at is not None else "until revoked"
    return (
        f'<tr data-grant="{escape(g.id)}"><td>{escape(g.id)}</td><td>{escape(g.policy_key)}</td>'
        f"<td>{escape(SCOPE_LABELS[g.scope])}</td><td>{escape(covers)}</td><td>{escape(g.rule or '')}</td>"
        f"<td>{escape(g.grantor)}</td><td>{made_by}</td><td>{escape(until)}</td>"
        f'<td><form method=post action="{INBOX}/grants/{escape(g.id)}/revoke">{csrf_field(csrf)}'
        "<button class=deny type=submit>Revoke</button></form></td></tr>"
    )


def history_body(invocations: Iterable[Invocation], status: str | None, source: str | None) -> str:
    options = "".join(f'<option value="{s}"{" selected" if s == status else ""}>{s}</option>' for s in ("", *STATUSES))
    rows = "".join(
        f'<tr><td><a href="{INBOX}/invocations/{escape(i.id)}">{escape(i.id[:12])}</a></td>'
        f"<td>{escape(i.tool)}</td><td>{escape(i.status)}</td><td>{escape(i.mode)} ({escape(i.mode_source)})</td>"
        f"<td>{escape(i.principal or '')}</td><td>{escape(i.created_at.isoformat(timespec='seconds'))}</td></tr>"
        for i in invocations
    )
    return (
        "<h1>History</h1>"
        f'<form class=filters method=get action="{INBOX}/history">'
        f"<label>status <select name=status>{options}</select></label>"
        f'<label>source <input type=text name=source value="{escape(source or "")}"></label>'
        "<button type=submit>Filter</button></form>"
        "<table><tr><th>id</th><th>tool</th><th>status</th><th>mode</th><th>agent</th><th>created</th></tr>"
        f"{rows or '<tr><td colspan=6 class=empty>No invocations.</td></tr>'}</table>"
    )


def invocation_body(invocation: Invocation, events: Sequence[InvocationEvent]) -> str:
    i = invocation
    timeline = "".join(
        f"<tr><td>{e.seq}</td><td>{escape(e.kind)}</td><td>{escape(e.at.isoformat(timespec='seconds'))}</td>"
        f"<td>{escape(_json(e.detail) if e.detail else '')}</td></tr>"
        for e in events
    )
    outcome = ""
    if i.error_class is not None:
        outcome = f"<div><strong>Error</strong> {escape(i.error_class)}: {escape(i.error_message or '')}</div>"
    elif i.result is not None:
        outcome = f"<div><strong>Result</strong> (redacted)</div><pre>{escape(_json(i.result))}</pre>"
    return (
        f"<h1>{escape(i.tool)} · {escape(i.status)}</h1><section class=card>{_meta(i)}"
        f"<div><strong>Arguments</strong> (redacted)</div><pre>{escape(_json(i.args))}</pre>"
        f"{_diff(i.drift)}{outcome}</section>"
        "<h2>Timeline</h2><table><tr><th>#</th><th>event</th><th>at</th><th>detail</th></tr>"
        f"{timeline}</table>"
    )
