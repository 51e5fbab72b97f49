"""`bastion approvals`: pending invocations and the approver's decision on them.

Decisions go straight to the ledger; a Bastion process holding the call notices them (across processes)
and runs or refuses it. Of two racing decisions exactly one wins; the other exits 1 with `conflict`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from bastion.cli.app import (
    TOKEN_ENV_VAR,
    ConfigOption,
    JsonOption,
    TokenOption,
    UrlOption,
    command_group,
    emit_json,
    out,
    timestamp,
)
from bastion.cli.inspect import details_table
from bastion.cli.tables import Column, fitted_table
from bastion.program import bastion_command
from bastion.terms import DEFAULT_LIMIT, MIN_ID_PREFIX, Scope

if TYPE_CHECKING:
    from rich.table import Table

    from bastion.cli.remote import RemoteApi
    from bastion.config import Config
    from bastion.models import Invocation

approvals_app = command_group(
    "approvals", "Calls waiting for a human: list and inspect them, approve or deny, or watch them live."
)

_ID_FORMS = f"its id, or the first {MIN_ID_PREFIX}+ characters of it"


def _id_argument(what: str) -> Any:
    return typer.Argument(help=f"{what}: {_ID_FORMS} (see `bastion approvals list`).", show_default=False)


# -- shared with `approvals watch` ------------------------------------------------------------------


def format_seconds(seconds: int | None) -> str:
    """A countdown for people: `4m 05s`, `12s`, `expired`, or `-` for never."""
    if seconds is None:
        return "-"
    if seconds <= 0:
        return "expired"
    minutes, rest = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {rest:02d}s" if minutes else f"{rest}s"


PENDING_COLUMNS: Final = (
    Column("id", "id"),
    Column("created", "time", optional=True),
    Column("tool"),
    Column("session", optional=True),
    Column("principal", optional=True),
    Column("expires in", "word"),
    Column("drift", "word"),
    Column("approvals", optional=True),
)


def pending_table(
    pending: list[Invocation],
    now: datetime,
    *,
    width: int,
    selected: str | None = None,
    total: int | None = None,
    approvals: Mapping[str, str] | None = None,
) -> Table:
    """The pending invocations as a table `width` columns wide; the `selected` one is highlighted. `total`: how
    many are pending in all, when the table shows only some of them. `approvals`: by invocation id, the approvals
    of a call that needs several (`1 of 2 approvals, by alice`)."""
    from bastion.pipeline.documents import expires_in

    rows = [
        (
            invocation.id,
            timestamp(invocation.created_at),
            invocation.tool,
            invocation.session_id,
            invocation.principal or "",
            format_seconds(expires_in(invocation, now)),
            "drifted" if invocation.drift is not None else "",
            (approvals or {}).get(invocation.id, ""),
        )
        for invocation in pending
    ]
    styles = ["reverse" if invocation.id == selected else None for invocation in pending]
    title = f"{len(pending) if total is None else total} pending"
    return fitted_table(PENDING_COLUMNS, rows, width=width, title=title, row_styles=styles)


def summaries(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """By invocation id, the approvals of each pending call (as `pending_json` gives it) that needs several."""
    return {str(row["id"]): str(row["approvals"]["summary"]) for row in rows if row.get("approvals")}


def decide_commands(config: Config, invocation_id: str) -> dict[str, str]:
    """The exact commands that approve or deny this invocation against the same configuration."""
    from bastion.config import config_hint

    where = config_hint(config)
    target = shlex.quote(invocation_id)
    return {
        "approve": f"{bastion_command()} approvals approve {target}{where}",
        "deny": f"{bastion_command()} approvals deny {target}{where} --reason TEXT",
    }


# -- commands ---------------------------------------------------------------------------------------


@approvals_app.command("list")
def approvals_list(
    config_dir: ConfigOption = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = DEFAULT_LIMIT,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """List pending invocations, newest first: tool, session, who asked, time left, drift."""
    from bastion.cli.compose import load, open_ledger, remote_or_local, run_async
    from bastion.config import config_hint
    from bastion.models import Invocation, utcnow
    from bastion.pipeline.documents import approvals_json, pending_invocations
    from bastion.pipeline.grants import Grants

    api = remote_or_local(url, token)
    where = ""
    if api is not None:
        remote_api = api

        async def fetch() -> list[dict[str, Any]]:
            async with remote_api:
                return await remote_api.pending(limit)

        rows = run_async(fetch)
    else:
        config = load(config_dir, report=False)
        where = config_hint(config)

        async def run() -> list[dict[str, Any]]:
            async with open_ledger(config) as ledger:
                found = await pending_invocations(ledger.invocations, utcnow(), limit=limit)
                return await approvals_json(ledger.invocations, found, utcnow(), Grants.of(ledger.grants, config))

        rows = run_async(run)
    if as_json:
        emit_json(rows)
        return
    pending = [Invocation.model_validate(row) for row in rows]
    out.print(pending_table(pending, utcnow(), width=out.width, approvals=summaries(rows)))
    if pending:
        out.print(
            f"decide with: {bastion_command()} approvals show|approve|deny ID{where}", markup=False, highlight=False
        )


@approvals_app.command("show")
def approvals_show(
    invocation_id: Annotated[str, _id_argument("The invocation to show, pending or not")],
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Show one invocation: redacted args, events, the drift diff, and the commands that decide it."""
    from bastion.cli.compose import find_invocation, load, open_ledger, remote_or_local, run_async
    from bastion.models import Invocation, Quorum, utcnow
    from bastion.pipeline.documents import pending_json
    from bastion.pipeline.grants import Grants

    api = remote_or_local(url, token)
    if api is not None:
        remote_api = api

        async def fetch() -> dict[str, Any]:
            async with remote_api:
                detail = await remote_api.invocation(invocation_id)
            invocation = Invocation.model_validate(detail)
            data = pending_json(invocation, utcnow(), detail.get("scopes", []))
            data["approvals"] = detail.get("approvals")
            data["events"] = detail.get("events", [])
            flags = f" --url {shlex.quote(remote_api.base)}"
            target = shlex.quote(invocation.id)
            data["commands"] = (
                {
                    "approve": f"{bastion_command()} approvals approve {target}{flags}",
                    "deny": f"{bastion_command()} approvals deny {target}{flags} --reason TEXT",
                }
                if invocation.status == "pending"
                else None
            )
            return data

        _show(run_async(fetch), as_json)
        return
    config = load(config_dir, report=False)

    async def run() -> tuple[dict[str, Any], bool]:
        async with open_ledger(config) as ledger:
            invocation = await find_invocation(ledger, config, invocation_id)
            events = await ledger.invocations.events(invocation.id)
            quorum = Quorum.of(events)
            grants = Grants.of(ledger.grants, config)
            offered = grants.offered(invocation, approvers=quorum.required) if invocation.status == "pending" else ()
            data = pending_json(invocation, utcnow(), offered, quorum)
            data["events"] = [e.model_dump(mode="json") for e in events]
            data["commands"] = decide_commands(config, invocation.id) if invocation.status == "pending" else None
            return data, await ledger.tokens.has_approver_tokens()

    data, needs_token = run_async(run)
    _show(data, as_json, needs_token=needs_token)


def _show(data: dict[str, Any], as_json: bool, *, needs_token: bool = False) -> None:
    if as_json:
        emit_json(data)
        return
    commands = data.pop("commands")
    seconds = data.pop("expires_in_seconds")
    data.pop("drifted")
    scopes = data.pop("scopes")
    approvals = data.pop("approvals", None)
    out.print(details_table(data))
    if commands is None:
        out.print(f"not pending: this invocation is {data['status']}", highlight=False)
        return
    if approvals:
        out.print(
            f"{approvals['summary']}: it runs once {approvals['required']} distinct approvers (not its caller) approve",
            markup=False,
            highlight=False,
        )
    with_token = f" (with an owner or admin token: --token TOKEN or ${TOKEN_ENV_VAR})" if needs_token else ""
    out.print(f"expires in {format_seconds(seconds)}; decide with{with_token}:", markup=False, highlight=False)
    out.print(f"  {commands['approve']}", markup=False, highlight=False)
    out.print(f"  {commands['deny']}", markup=False, highlight=False)
    if len(scopes) > 1:
        out.print(
            f"an approval may also let later calls of {data['tool']} through: --scope {'|'.join(scopes[1:])} "
            "[--when CONDITION]",
            markup=False,
            highlight=False,
        )


@approvals_app.command("approve")
def approvals_approve(
    invocation_id: Annotated[str, _id_argument("The pending invocation to approve")],
    note: Annotated[str | None, typer.Option(help="A note kept in the ledger with your decision.")] = None,
    scope: Annotated[
        Scope,
        typer.Option(
            help='How far the approval reaches: this call ("once"), or also later calls of the same action: in the '
            'same host session ("session"), by the same caller for an hour ("hour"), by anyone ("always"). '
            "`approvals show` lists the scopes this call may take.",
        ),
    ] = "once",
    when: Annotated[
        str | None,
        typer.Option(
            # The example breaks at its spaces: help 80 columns wide cuts a longer word short.
            help="With a scope beyond once: only later calls whose arguments meet this CEL condition, e.g. "
            "\"normpath(args.path) == '/srv/public/notes.md'\".",
        ),
    ] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Approve a pending invocation: the waiting call runs it at once. Exit 1 if it is no longer pending.

    A call that policy marks for two approvers (approvers = 2) runs on the approval of the second distinct
    approver: the first is recorded ("1 of 2 approvals") and the call keeps waiting; it takes "once" only.
    A scope beyond "once" leaves a grant (see `bastion grants list`). Once the ledger has an owner or admin token,
    this needs one (--token or $BASTION_TOKEN).
    """
    from bastion.cli.compose import remote_or_local

    _decide(
        config_dir,
        invocation_id,
        approve=True,
        note=note,
        as_json=as_json,
        api=remote_or_local(url, token),
        token=token,
        scope=scope,
        when=when,
    )


@approvals_app.command("deny")
def approvals_deny(
    invocation_id: Annotated[str, _id_argument("The pending invocation to deny")],
    reason: Annotated[str | None, typer.Option(help="Why; the agent is told this reason.")] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Deny a pending invocation: the waiting call returns approval_denied. Exit 1 if it is no longer pending.

    Once the ledger has an owner or admin token, this needs one (--token or $BASTION_TOKEN).
    """
    from bastion.cli.compose import remote_or_local

    _decide(
        config_dir,
        invocation_id,
        approve=False,
        note=reason,
        as_json=as_json,
        api=remote_or_local(url, token),
        token=token,
    )


def _decide(
    config_dir: Path | None,
    invocation_id: str,
    *,
    approve: bool,
    note: str | None,
    as_json: bool,
    api: RemoteApi | None,
    token: str | None,
    scope: Scope = "once",
    when: str | None = None,
) -> None:
    from bastion.cli.compose import load, local_approver, open_ledger, run_async
    from bastion.models import Invocation, utcnow
    from bastion.pipeline import authority
    from bastion.pipeline.documents import decided_json
    from bastion.pipeline.grants import SCOPE_LABELS, Grants

    if api is not None:
        remote_api = api

        async def remotely() -> tuple[dict[str, Any], str]:
            async with remote_api:
                answer = await remote_api.decide(invocation_id, approve=approve, note=note, scope=scope, when=when)
                detail = await remote_api.invocation(str(answer["id"]))
            kind = "approval_recorded" if answer["status"] == "pending" else answer["status"]
            by = [e.get("detail", {}).get("by") for e in detail.get("events", []) if e.get("kind") == kind]
            return answer, str(by[-1]) if by and by[-1] else "your token"

        answer, principal = run_async(remotely)
    else:
        config = load(config_dir, report=False)

        async def run() -> tuple[dict[str, Any], str]:
            async with open_ledger(config) as ledger:
                approver = await local_approver(ledger, config, token)
                decided = await authority.decide(
                    ledger,
                    invocation_id,
                    approve=approve,
                    principal=approver,
                    note=note,
                    now=utcnow(),
                    scope=scope,
                    rule=when,
                    grants=Grants.of(ledger.grants, config),
                )
                return await decided_json(ledger.invocations, decided), approver.name

        answer, principal = run_async(run)
    if as_json:
        emit_json(answer)
        return
    decided = Invocation.model_validate(answer)
    if decided.status == "pending":  # an approval of a call that needs more than one, not the last
        summary = answer["approvals"]["summary"]
        out.print(
            f"recorded your approval of {decided.id} ({decided.tool}) as {principal}: {summary}; it waits for "
            "another approver",
            markup=False,
            highlight=False,
        )
        return
    scoped = f", {SCOPE_LABELS[scope]} (see `bastion grants list`)" if approve and scope != "once" else ""
    out.print(f"{decided.status} {decided.id} ({decided.tool}) as {principal}{scoped}", markup=False, highlight=False)


@approvals_app.command("watch")
def approvals_watch(config_dir: ConfigOption = None, url: UrlOption = None, token: TokenOption = None) -> None:
    """A live view of pending calls and the selected one in detail; approve or deny each with confirmation.

    Once the ledger has an owner or admin token, watching it locally needs one (--token or $BASTION_TOKEN).
    With --url it watches a remote Bastion, redrawing on each event of its stream (/api/events).
    """
    from bastion.cli.watch import watch_in_terminal

    watch_in_terminal(config_dir, url, token)
