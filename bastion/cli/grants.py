"""`bastion grants`: the standing grants approvals left behind (bastion.pipeline.grants): list and revoke them.

On the local ledger, or a remote Bastion's with `--url` and `--token` (its REST API). Listing and revoking are for
approvers: once the ledger has an owner or admin token, the local commands need one too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final

import typer

from bastion.cli.app import (
    ConfigOption,
    JsonOption,
    TokenOption,
    UrlOption,
    command_group,
    emit_json,
    out,
    timestamp,
)
from bastion.cli.tables import Column, fitted_table
from bastion.errors import Forbidden, NotFound
from bastion.program import bastion_command
from bastion.terms import DEFAULT_LIMIT

if TYPE_CHECKING:
    from bastion.models import Grant, Principal

grants_app = command_group(
    "grants",
    'Standing grants (what approvals "for this session", "for an hour" or "always" let through): list, revoke.',
)

GRANT_COLUMNS: Final = (
    Column("grant", "id"),
    Column("action", "id"),
    Column("scope", "word"),
    Column("covers"),
    Column("only when", optional=True),
    Column("by", "word"),
    Column("made", "time"),
    Column("until", "time"),
    Column("revoked", optional=True),
)


def covers(grant: Grant) -> str:
    """Whose later calls a grant lets through."""
    if grant.scope == "session":
        return f"session {grant.session_id}"
    if grant.scope == "hour":
        return f"caller {grant.principal or '(no token)'}"
    return "every caller"


@grants_app.command("list")
def grants_list(
    ended: Annotated[bool, typer.Option("--ended", help="Also the grants that were revoked or expired.")] = False,
    limit: Annotated[int, typer.Option(help="With --ended: at most this many, newest first.")] = DEFAULT_LIMIT,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """List standing grants, newest first: id, action, scope, whose calls it covers, its condition, who made it,
    until when."""
    from bastion.cli.compose import load, local_approver, open_ledger, remote_or_local, run_async
    from bastion.config import config_hint
    from bastion.models import utcnow
    from bastion.pipeline.documents import GrantView, grant_json
    from bastion.pipeline.grants import SCOPE_LABELS

    api = remote_or_local(url, token)
    if api is not None:
        remote = api

        async def fetch() -> list[GrantView]:
            async with remote:
                return [GrantView.model_validate(row) for row in await remote.grants(ended=ended, limit=limit)]

        found: list[Grant] = list(run_async(fetch))
        where = ""
    else:
        config = load(config_dir, report=False)
        where = config_hint(config)

        async def run() -> list[Grant]:
            async with open_ledger(config) as ledger:
                _approver_only(await local_approver(ledger, config, token))
                return await ledger.grants.grants(standing_at=None if ended else utcnow(), limit=limit)

        found = run_async(run)
    now = utcnow()
    if as_json:
        emit_json([grant_json(grant, now) for grant in found])
        return
    rows = [
        (
            grant.id,
            grant.policy_key,
            SCOPE_LABELS[grant.scope],
            covers(grant),
            grant.rule or "",
            grant.grantor,
            timestamp(grant.created_at),
            timestamp(grant.expires_at) if grant.expires_at is not None else "until revoked",
            "" if grant.revoked_at is None else f"{timestamp(grant.revoked_at)} by {grant.revoked_by}",
        )
        for grant in found
    ]
    standing = sum(grant.standing(now) for grant in found)
    title = f"{len(found)} grants ({standing} standing)" if ended else f"{len(found)} standing grants"
    out.print(fitted_table(GRANT_COLUMNS, rows, width=out.width, title=title))
    if standing:
        out.print(f"revoke one with: {bastion_command()} grants revoke ID{where}", markup=False, highlight=False)


@grants_app.command("revoke")
def grants_revoke(
    grant_id: Annotated[str, typer.Argument(help="The standing grant to revoke (see `bastion grants list`).")],
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Revoke a standing grant: the next call it covered waits for an approver again, on every instance sharing the
    ledger. Exit 1 when no grant of that id stands."""
    from bastion.cli.compose import load, local_approver, open_ledger, remote_or_local, run_async
    from bastion.config import config_hint
    from bastion.models import utcnow
    from bastion.pipeline.documents import GrantView, grant_json
    from bastion.pipeline.grants import SCOPE_LABELS

    api = remote_or_local(url, token)
    now = utcnow()
    if api is not None:
        remote = api

        async def revoke_remotely() -> Grant:
            async with remote:
                return GrantView.model_validate(await remote.revoke_grant(grant_id))

        revoked = run_async(revoke_remotely)
    else:
        config = load(config_dir, report=False)

        async def run() -> Grant:
            async with open_ledger(config) as ledger:
                approver = await local_approver(ledger, config, token)
                _approver_only(approver)
                try:
                    return await ledger.grants.revoke(grant_id, by=approver.name, now=now)
                except NotFound as exc:
                    raise NotFound(
                        f"no standing grant {grant_id!r}; see `{bastion_command()} grants list{config_hint(config)}`"
                    ) from exc

        revoked = run_async(run)
    if as_json:
        emit_json(grant_json(revoked, now))
        return
    out.print(
        f"revoked grant {revoked.id} on {revoked.policy_key} ({SCOPE_LABELS[revoked.scope]}); its calls wait for an "
        "approver again",
        markup=False,
        highlight=False,
    )


def _approver_only(approver: Principal) -> None:
    if not approver.may_decide:
        raise Forbidden(f"{approver.name} has the {approver.role} role; grants are for owner and admin tokens")
