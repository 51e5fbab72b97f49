"""`bastion tokens`: the bearer tokens of the HTTP surface.

A token's secret is shown once, when it is created; the ledger keeps only its SHA-256, so neither
`list` nor anything else can show it again. A lost secret is replaced by revoking the token and creating
a new one. Once an owner or admin token exists, creating or revoking one needs an owner or admin token
(`--token` or `$BASTION_TOKEN`): an agent with a shell as the same user could otherwise make itself an
approver.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from bastion.cli.app import ConfigOption, Exit, JsonOption, TokenOption, command_group, emit_json, out, timestamp
from bastion.cli.tables import Column, fitted_table
from bastion.errors import ConfigError, Conflict, Forbidden, NotFound
from bastion.program import bastion_command
from bastion.terms import ROLES, Role

if TYPE_CHECKING:
    from bastion.config import Config
    from bastion.ledger import OpenLedger
    from bastion.models import TokenInfo

tokens_app = command_group("tokens", "Bearer tokens for the HTTP surface: create, list, revoke.")

TOKEN_COLUMNS: Final = (
    Column("name", "id"),
    Column("role", "word"),
    Column("profile"),
    Column("created", "time"),
    Column("revoked", "time", optional=True),
)


def token_json(token: TokenInfo) -> dict[str, Any]:
    """A token as scripts see it: name, role, profile, created_at, revoked_at and `active`; never a secret."""
    data = token.model_dump(mode="json")
    data["active"] = token.active
    return data


@tokens_app.command("create")
def tokens_create(
    name: Annotated[str, typer.Argument(help="The new token's name, recorded as the principal of what it does.")],
    role: Annotated[Role, typer.Option("--role", help=f"What the token may do: {', '.join(ROLES)}.")],
    profile: Annotated[
        str | None, typer.Option("--profile", help="Agent tokens only: the profile their sessions use.")
    ] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
    approver_token: TokenOption = None,
) -> None:
    """Create a token and print its secret, once: it cannot be shown again.

    Once the ledger has an owner or admin token, this needs one (--token or $BASTION_TOKEN). The first token
    changes what hosts over HTTP need: from then on they connect with an agent token (it says how).
    """
    from bastion.cli.compose import load, open_ledger, run_async
    from bastion.config import config_hint, validate_profile
    from bastion.ledger.tokens import validate_token_name
    from bastion.models import TokenInfo, utcnow

    try:
        validate_token_name(name)
    except ValueError as exc:
        raise Exit(f"error: {exc}", 2) from exc
    if profile is not None and role != "agent":
        raise Exit("error: --profile is only for agent tokens (--role agent); owner and admin tokens take none", 2)
    config = load(config_dir, report=False)
    if profile is not None:
        try:
            validate_profile(config, profile)
        except ConfigError as exc:
            raise Exit.of(exc) from exc
    now = utcnow()

    async def run() -> tuple[str, bool]:
        async with open_ledger(config) as ledger:
            await _approver_only(ledger, config, approver_token)
            first = not await ledger.tokens.has_tokens()
            try:
                return await ledger.tokens.create_token(name, role=role, profile=profile, now=now), first
            except Conflict as exc:
                raise Conflict(
                    f"a token named {name!r} is already active; revoke it first (`{bastion_command()} tokens revoke "
                    f"{shlex.quote(name)}{config_hint(config)}`) or pick another name"
                ) from exc

    secret, first = run_async(run)
    token = TokenInfo(name=name, role=role, profile=profile, created_at=now)
    if as_json:
        emit_json(token_json(token) | {"token": secret, "first_token": first})
        return
    bound = f", profile {profile}" if profile is not None else ""
    lines = [
        f"created token {name} (role {role}{bound})",
        secret,
        "Store it now: it cannot be shown again (a lost token can only be revoked and replaced).",
        "Use it as the HTTP header `Authorization: Bearer <token>`; "
        "from the command line with --token or $BASTION_TOKEN.",
    ]
    if first:
        lines += ["", *first_token_notice(role)]
    for line in lines:
        out.print(line, markup=False, highlight=False)


def first_token_notice(role: Role) -> list[str]:
    """What the first token changes for hosts, and how each reconnects (hosts over stdio are not affected)."""
    which = (
        "this token (or another agent token)"
        if role == "agent"
        else f"an agent token (`{bastion_command()} tokens create NAME --role agent`), never this one"
    )
    url = "http://127.0.0.1:8765/mcp"
    return [
        "This is the first token: from now on Bastion refuses hosts that connect over HTTP without one (/mcp, /sse, "
        "/messages/; a running `bastion serve` within a second, and it logs the change). Hosts over stdio are not "
        f"affected. Reconnect each HTTP host with {which}, at your server's address (here {url}):",
        f'  Claude Code: claude mcp add --transport http bastion {url} --header "Authorization: Bearer <token>"',
        f'  Codex:       [mcp_servers.bastion] url = "{url}" and bearer_token_env_var = "BASTION_AGENT_TOKEN" in '
        "~/.codex/config.toml, the token exported in that variable",
        f"  Inspector:   npx @modelcontextprotocol/inspector --cli {url} --transport http "
        '--header "Authorization: Bearer <token>" --method tools/list',
    ]


@tokens_app.command("list")
def tokens_list(config_dir: ConfigOption = None, as_json: JsonOption = False) -> None:
    """List tokens, active and revoked, newest first: name, role, profile, created, revoked. Never secrets."""
    from bastion.cli.compose import load, open_ledger, run_async

    config = load(config_dir, report=False)

    async def run() -> list[TokenInfo]:
        async with open_ledger(config) as ledger:
            return await ledger.tokens.tokens()

    tokens = run_async(run)
    if as_json:
        emit_json([token_json(token) for token in tokens])
        return
    active = sum(token.active for token in tokens)
    rows = [
        (
            token.name,
            token.role,
            token.profile or "",
            timestamp(token.created_at),
            timestamp(token.revoked_at) if token.revoked_at is not None else "",
        )
        for token in tokens
    ]
    title = f"{len(tokens)} tokens ({active} active)"
    out.print(fitted_table(TOKEN_COLUMNS, rows, width=out.width, title=title))


@tokens_app.command("revoke")
def tokens_revoke(
    name: Annotated[str, typer.Argument(help="The active token to revoke, by name (see `bastion tokens list`).")],
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
    approver_token: TokenOption = None,
) -> None:
    """Revoke the active token NAME: requests presenting it are refused from now on.

    Once the ledger has an owner or admin token, this needs one (--token or $BASTION_TOKEN).
    """
    from bastion.cli.compose import load, open_ledger, run_async
    from bastion.config import config_hint
    from bastion.models import utcnow

    config = load(config_dir, report=False)
    now = utcnow()

    async def run() -> TokenInfo:
        async with open_ledger(config) as ledger:
            await _approver_only(ledger, config, approver_token)
            try:
                return await ledger.tokens.revoke_token(name, now=now)
            except NotFound as exc:
                listing = f"{bastion_command()} tokens list{config_hint(config)}"
                raise NotFound(f"no active token named {name!r}; see `{listing}`") from exc

    token = run_async(run)
    if as_json:
        emit_json(token_json(token))
        return
    out.print(
        f"revoked token {token.name} (role {token.role}); it is refused from now on", markup=False, highlight=False
    )


async def _approver_only(ledger: OpenLedger, config: Config, token: str | None) -> None:
    """Tokens are made and revoked by approvers: the local owner while the ledger has no owner or admin token,
    then only the holder of one (else an agent with a shell could make itself an approver)."""
    from bastion.cli.compose import local_approver

    approver = await local_approver(ledger, config, token)
    if not approver.may_decide:
        raise Forbidden(
            f"{approver.name} has the {approver.role} role; only owner and admin tokens may create or revoke tokens"
        )
