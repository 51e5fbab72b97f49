"""The inbox's HTML: plain functions from views to escaped HTML strings; no template engine, no build step.

Every value shown is escaped here. Every form carries the session's CSRF token. Scripts, styles and the icon come
from `/inbox/static/` only, so the pages' Content-Security-Policy forbids inline script.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any, Final

from bastion.errors import BastionError
from bastion.models import STATUSES, Grant, Invocation, InvocationEvent, Preview, Principal, Quorum, Scope
from bastion.pipeline.documents import expires_in
from bastion.pipeline.grants import SCOPE_LABELS
from bastion.program import bastion_command

INBOX: Final = "/inbox"
ScopesOf = Callable[[Invocation], Sequence[Scope]]

KEY_ARGUMENTS: Final = 5
"""Top-level arguments a card shows at a glance; all of them are under its details."""
ARGUMENT_CHARS: Final = 120
"""How much of one argument's value a card shows at a glance."""


@dataclass(frozen=True)
class Notice:
    """A message shown once atop a page: what was done, or (with its error class) why it was not."""

    text: str
    error_class: str | None = None
    lead: str = ""
    """For an error: what went wrong in a few plain words, before `text` (the error's own message)."""


_ERROR_LEADS: Final = {
    "conflict": "Already decided",
    "approval_expired": "Too late: the call expired",
    "not_found": "Not found",
    "ambiguous_id": "Not found",
    "forbidden": "Not allowed",
    "csrf_refused": "This page was out of date, so nothing was done",
    "invalid_arguments": "Not accepted",
    "unauthenticated": "Your session has ended",
}


def error_notice(exc: BastionError) -> Notice:
    """An error as a message to a person: a plain lead, then what the error says."""
    lead = _ERROR_LEADS.get(exc.error_class, "That did not work")
    return Notice(exc.message, error_class=exc.error_class, lead=lead)


def page(title: str, body: str, *, principal: Principal | None, csrf: str | None, current: str = "") -> str:
    """A whole page: the header (with who is logged in and a logout form) around `body`."""
    nav = ""
    if principal is not None and csrf is not None:
        links = "".join(
            f'<a href="{INBOX}{href}"{" class=current" if href == current else ""}>{label}</a>'
            for href, label in (("", "Pending"), ("/grants", "Grants"), ("/history", "History"))
        )
        nav = (
            f"<nav>{links}</nav><span class=who>{escape(principal.name)} ({escape(principal.role)})</span>"
            f'<form method=post action="{INBOX}/logout">{csrf_field(csrf)}<button type=submit>Log out</button></form>'
        )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · Bastion</title>"
        f'<link rel=icon type="image/svg+xml" href="{INBOX}/static/favicon.svg">'
        f'<link rel=stylesheet href="{INBOX}/static/inbox.css"></head><body>'
        f"<header><strong>Bastion</strong>{nav}</header><main>{body}</main>"
        f'<script src="{INBOX}/static/inbox.js"></script></body></html>'
    )


def csrf_field(token: str) -> str:
    return f'<input type=hidden name=csrf value="{escape(token)}">'


def flash(notice: Notice | None) -> str:
    if notice is None:
        return ""
    if notice.error_class is None:
        return f"<div class=flash role=status>{escape(notice.text)}</div>"
    return (
        f'<div class="flash error" role=alert data-error-class="{escape(notice.error_class)}">'
        f"<strong>{escape(notice.lead)}.</strong> {escape(notice.text[:1].upper() + notice.text[1:])}</div>"
    )


def login_body(csrf: str, notice: Notice | None = None) -> str:
    return (
        '<div class="card login"><h1>Approver inbox</h1>'
        f"{flash(notice)}"
        f'<form method=post action="{INBOX}/login">{csrf_field(csrf)}'
        "<label for=token>Owner or admin token</label>"
        "<input id=token name=token type=password autocomplete=off required>"
        "<button class=approve type=submit>Log in</button></form>"
        f"<p class=empty>Create one with {shell_command(f'{bastion_command()} tokens create NAME --role admin')}.</p>"
        "</div>"
    )


def refused_body(notice: Notice) -> str:
    """The page a refused request from a browser gets instead of the error's JSON."""
    return f'<h1>Not done</h1>{flash(notice)}<p><a href="{INBOX}">Back to the pending calls</a></p>'


def shell_command(command: str) -> str:
    """A command to copy, as HTML: it wraps between words only, never inside one (a browser may break `--role`
    between its hyphens, and what is copied must run as written)."""
    words = " ".join(f"<span class=word>{escape(word)}</span>" for word in command.split())
    return f"<code class=command>{words}</code>"


# -- pending calls ---------------------------------------------------------------------------------------------


def pending_body(
    pending: Sequence[Invocation],
    now: datetime,
    csrf: str,
    notice: Notice | None,
    *,
    cursor: int,
    scopes_of: ScopesOf,
    quorums: Mapping[str, Quorum] | None = None,
    previews: Mapping[str, Preview] | None = None,
) -> str:
    """The pending calls as of ledger event `cursor`, which the page's live stream resumes after, each with the
    scopes an approval of it may take; the filters, the bulk deny form and the keyboard help (the script shows
    them)."""
    cards = "".join(
        pending_card(
            invocation,
            now,
            csrf,
            scopes_of(invocation),
            (quorums or {}).get(invocation.id),
            (previews or {}).get(invocation.id),
        )
        for invocation in pending
    )
    return (
        f"<h1>Pending calls (<span id=count>{len(pending)}</span>)</h1>{flash(notice)}"
        f'<div id=live class=live data-after="{cursor}">Connecting to live updates...</div>'
        f"{_filters(pending)}{_bulk_deny(csrf)}"
        f"<p id=empty class=empty{'' if not pending else ' hidden'}>Nothing is waiting for an approver.</p>"
        f"<div id=cards>{cards}</div>{_help()}"
    )


def _filters(pending: Sequence[Invocation]) -> str:
    def choices(name: str, label: str, everything: str, values: Iterable[str]) -> str:
        options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in sorted(set(values)))
        return (
            f'<select name={name} aria-label="{label}" data-filter={name}>'
            f'<option value="">{everything}</option>{options}</select>'
        )

    return (
        "<form id=filters class=filters role=search hidden>"
        '<input type=search name=text placeholder="Filter by action, agent, argument..." aria-label="filter">'
        f"{choices('action', 'action', 'every action', (i.policy_key for i in pending))}"
        f"{choices('agent', 'who asks', 'anyone asking', (_asker(i) for i in pending))}"
        "<button type=button id=help-open title='Keyboard shortcuts (?)'>?</button></form>"
    )


def _bulk_deny(csrf: str) -> str:
    return (
        f'<form id=bulk class=bulk method=post action="{INBOX}/approvals/deny" hidden>{csrf_field(csrf)}'
        "<span id=picked>0 selected</span>"
        '<input type=text name=reason placeholder="reason for all of them" aria-label="reason for the selected">'
        "<button class=deny type=submit>Deny selected</button></form>"
    )


def _help() -> str:
    keys = (
        ("j", "select the next call"),
        ("k", "select the previous call"),
        ("a", "approve the selected call (with its form's note and scope)"),
        ("d", "deny the selected call (with its form's reason)"),
        ("x", "pick the selected call for bulk deny"),
        ("/", "filter"),
        ("?", "show or hide this help"),
        ("Esc", "close"),
    )
    rows = "".join(f"<dt><kbd>{escape(key)}</kbd></dt><dd>{escape(does)}</dd>" for key, does in keys)
    return (
        "<div id=help class=overlay hidden><div class=dialog role=dialog aria-modal=true aria-labelledby=help-title>"
        f"<h2 id=help-title>Keyboard shortcuts</h2><dl class=keys>{rows}</dl>"
        "<p class=empty>They never fire while you type in a field.</p>"
        "<button type=button id=help-close>Close</button></div></div>"
    )


def _asker(invocation: Invocation) -> str:
    return invocation.principal or "anonymous"


def pending_card(
    invocation: Invocation,
    now: datetime,
    csrf: str,
    offered: Sequence[Scope],
    quorum: Quorum | None = None,
    preview: Preview | None = None,
) -> str:
    """One pending call as an approver reads it at a glance (what will run, who asks, why it waits, for a call that
    needs several approvers who has approved it, and the preview of what it would do), its ids, technical reason
    and whole arguments folded away, with its approve and deny forms."""
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
        f'<section class=card data-invocation="{escape(i.id)}" data-action="{escape(i.policy_key)}" '
        f'data-agent="{escape(_asker(i))}">'
        f'<h2><input type=checkbox name=id value="{escape(i.id)}" form=bulk aria-label="pick for bulk deny"> '
        f"<span class=action>{escape(i.action_id)}</span> <span class=target>on {escape(i.source_id)}</span> "
        f"<span class='badge risk-{escape(i.risk)}'>{escape(i.risk)}</span> {drift}</h2>"
        f"<p class=asks><strong>{escape(_asker(i))}</strong> asks · {countdown}</p>"
        f"{_approvals(quorum)}"
        f"{_key_arguments(i.args)}"
        f"<p class=why>{escape(plain_why(i))}</p>"
        f"{_preview(preview)}"
        f"{_diff(i.drift)}"
        "<details class=more><summary>Details</summary>"
        f"<p class=technical><strong>Technical reason:</strong> {escape(why(i))}</p>"
        f"<div><strong>All arguments</strong> (redacted)</div><pre class=args>{escape(_json(i.args))}</pre>"
        f"{_meta(i, ('expires', escape(i.expires_at.isoformat(timespec='seconds')) if i.expires_at else 'never'))}"
        "</details>"
        "<div class=decide>"
        f'<form class=approve method=post action="{action}/approve">{csrf_field(csrf)}'
        '<input type=text name=note placeholder="note (optional)" aria-label="note">'
        f'<select name=scope aria-label="scope">{scopes}</select>'
        '<input type=text name=when placeholder="later calls only when... (CEL, optional)" '
        'aria-label="condition on later calls">'
        "<button class=approve type=submit>Approve</button></form>"
        f'<form class=deny method=post action="{action}/deny">{csrf_field(csrf)}'
        '<input type=text name=reason placeholder="reason" aria-label="reason">'
        "<button class=deny type=submit>Deny</button></form>"
        "</div></section>"
    )


def _approvals(quorum: Quorum | None) -> str:
    summary = quorum.summary if quorum is not None else None
    return f"<p class=approvals><strong>{escape(summary)}</strong>: it needs another approver</p>" if summary else ""


def _key_arguments(args: Any) -> str:
    """The first few top-level arguments, each value cut to a line's worth."""
    if args is None or args == {}:
        return "<p class=empty>No arguments.</p>"
    items = list(args.items()) if isinstance(args, dict) else [("arguments", args)]
    rows = "".join(
        f"<dt>{escape(str(key))}</dt><dd>{escape(_short(value))}</dd>" for key, value in items[:KEY_ARGUMENTS]
    )
    more = (
        f"<p class=empty>and {len(items) - KEY_ARGUMENTS} more (under Details)</p>"
        if len(items) > KEY_ARGUMENTS
        else ""
    )
    return f"<dl class=key-args>{rows}</dl>{more}"


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= ARGUMENT_CHARS else text[: ARGUMENT_CHARS - 1] + "…"


_RISK_WORDS: Final = {"read": "it reads data", "write": "it changes data", "danger": "it can destroy data"}


def plain_why(invocation: Invocation) -> str:
    """Why a call waits, in a sentence an approver reads at a glance (`why` gives the technical reason)."""
    i = invocation
    source, _, key = i.mode_source.partition(":")
    if source == "inferred":
        reason = f"{_RISK_WORDS.get(i.risk, i.risk)} (risk: {i.risk}) and no rule allows it"
    elif source in ("org", "profile"):
        whose = "the organisation's policy" if source == "org" else f"the {i.profile} profile"
        reason = f"{whose} asks an approver for every {i.policy_key} call"
    elif source in ("org_rule", "profile_rule"):
        whose = "the organisation's policy" if source == "org_rule" else f"the {i.profile} profile"
        reason = f"a rule of {whose} holds {i.policy_key} calls with arguments like these"
    elif source in ("condition_failed", "conditional"):
        reason = "a rule on its arguments could not be checked, so it waits to be safe"
    elif source == "drift":
        changed = f"its step {key}" if key else "the tool"
        reason = f"{changed} changed since it was last trusted (see what changed)"
    elif source == "declared":
        reason = f"its step {key} asks for an approver" if key else "the action itself asks for an approver"
    elif source == "step":
        reason = f"its step {key} needs an approver"
    else:
        reason = f"policy ({i.mode_source}) holds it"
    return f"Held for approval: {reason}."


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


def _preview(preview: Preview | None) -> str:
    """What the call would do, as its source worked it out: a one-line summary, then its lines (a diff's coloured)."""
    if preview is None:
        return ""
    summary = f"<p class=preview-summary><strong>Preview:</strong> {escape(preview.summary)}</p>"
    if not preview.text:
        return f"<div class='preview preview-{escape(preview.kind)}'>{summary}</div>"
    shown = []
    for line in preview.text.splitlines():
        kind = ""
        if preview.kind == "diff":
            kind = "add" if line.startswith("+") and not line.startswith("+++") else ""
            kind = "del" if line.startswith("-") and not line.startswith("---") else kind
            kind = "hunk" if line.startswith("@@") else kind
        shown.append(f'<span class="{kind}">{escape(line)}</span>' if kind else escape(line))
    return (
        f"<div class='preview preview-{escape(preview.kind)}'>{summary}"
        f"<pre class=diff>{chr(10).join(shown)}</pre></div>"
    )


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def grants_body(grants: Sequence[Grant], now: datetime, csrf: str, notice: Notice | None) -> str:
    """The standing grants, newest first, each with the form that revokes it."""
    columns = ("grant", "action", "scope", "covers", "only when", "by", "made", "until", "")
    rows = [(f'data-grant="{escape(g.id)}"', _grant_cells(g, csrf)) for g in grants]
    return (
        f"<h1>Standing grants ({len(grants)})</h1>{flash(notice)}"
        "<p class=empty>Approvals beyond &ldquo;once&rdquo; let later calls of their action through without an "
        "approver, unless an operator rule denies or holds them. Revoking one holds the next call it covered.</p>"
        f"{_table(columns, rows, 'No standing grants.')}"
    )


def _grant_cells(grant: Grant, csrf: str) -> list[str]:
    g = grant
    covers = {"session": f"session {g.session_id}", "hour": f"caller {g.principal or '(no token)'}"}.get(
        g.scope, "every caller"
    )
    made = g.created_at.isoformat(timespec="seconds")
    made_by = f'<a href="{INBOX}/invocations/{escape(g.invocation_id)}">{escape(made)}</a>' if g.invocation_id else made
    until = g.expires_at.isoformat(timespec="seconds") if g.expires_at is not None else "until revoked"
    revoke = (
        f'<form method=post action="{INBOX}/grants/{escape(g.id)}/revoke">{csrf_field(csrf)}'
        "<button class=deny type=submit>Revoke</button></form>"
    )
    texts = (g.id, g.policy_key, SCOPE_LABELS[g.scope], covers, g.rule or "", g.grantor)
    return [*(escape(text) for text in texts), made_by, escape(until), revoke]


def _table(columns: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]], empty: str) -> str:
    """A table of `rows` (each its `<tr>` attributes and cells' HTML). Each cell carries its column's name, which
    a narrow screen shows beside it when the rows are laid out as blocks."""
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        f"<tr {attributes}>"
        + "".join(f'<td data-label="{escape(c)}">{cell}</td>' for c, cell in zip(columns, cells, strict=True))
        + "</tr>"
        for attributes, cells in rows
    )
    if not body:
        body = f"<tr><td colspan={len(columns)} class=empty>{escape(empty)}</td></tr>"
    return f"<table><tr>{head}</tr>{body}</table>"


def history_body(invocations: Iterable[Invocation], status: str | None, source: str | None) -> str:
    options = "".join(f'<option value="{s}"{" selected" if s == status else ""}>{s}</option>' for s in ("", *STATUSES))
    rows = [
        (
            "",
            [
                f'<a href="{INBOX}/invocations/{escape(i.id)}">{escape(i.id[:12])}</a>',
                escape(i.tool),
                escape(i.status),
                f"{escape(i.mode)} ({escape(i.mode_source)})",
                escape(i.principal or ""),
                escape(i.created_at.isoformat(timespec="seconds")),
            ],
        )
        for i in invocations
    ]
    return (
        "<h1>History</h1>"
        f'<form class=filters method=get action="{INBOX}/history">'
        f"<label>status <select name=status>{options}</select></label>"
        f'<label>source <input type=text name=source value="{escape(source or "")}"></label>'
        "<button type=submit>Filter</button></form>"
        f"{_table(('id', 'tool', 'status', 'mode', 'agent', 'created'), rows, 'No invocations.')}"
    )


def invocation_body(invocation: Invocation, events: Sequence[InvocationEvent]) -> str:
    i = invocation
    timeline = [
        (
            "",
            [
                str(e.seq),
                escape(e.kind),
                escape(e.at.isoformat(timespec="seconds")),
                escape(_json(e.detail) if e.detail else ""),
            ],
        )
        for e in events
    ]
    outcome = ""
    if i.error_class is not None:
        outcome = f"<div><strong>Error</strong> {escape(i.error_class)}: {escape(i.error_message or '')}</div>"
    elif i.result is not None:
        outcome = f"<div><strong>Result</strong> (redacted)</div><pre>{escape(_json(i.result))}</pre>"
    return (
        f"<h1>{escape(i.tool)} · {escape(i.status)}</h1><section class=card>{_meta(i)}"
        f"<div><strong>Arguments</strong> (redacted)</div><pre>{escape(_json(i.args))}</pre>"
        f"{_diff(i.drift)}{outcome}</section>"
        f"<h2>Timeline</h2>{_table(('#', 'event', 'at', 'detail'), timeline, 'No events.')}"
    )
