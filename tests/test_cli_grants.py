"""`bastion approvals approve --scope/--when` and `bastion grants list|revoke` as an approver runs them: real
processes on a real SQLite ledger, and against a live Bastion's API with `--url`."""

from __future__ import annotations

import json
from pathlib import Path

import anyio

from bastion.models import Grant, utcnow
from tests.processes import bastion_env
from tests.test_cli_approvals import (
    cli,
    error_class,
    make_config,
    make_invocation,
    make_token,
    open_ledger,
    seed,
    stored,
)


async def _grants(config: Path) -> list[Grant]:
    async with open_ledger(config) as ledger:
        return await ledger.grants.grants()


def grants_of(config: Path) -> list[Grant]:
    return anyio.run(_grants, config)


def test_an_approval_with_a_scope_and_a_condition_leaves_a_grant_the_grants_commands_list_and_revoke(
    tmp_path: Path,
) -> None:
    env = bastion_env(tmp_path / "home", BASTION_PRINCIPAL="alice@example.com")
    config = make_config(tmp_path)
    seed(config, make_invocation(1), make_invocation(2))

    shown = cli(config, env, "approvals", "show", "inv-0001")
    assert "--scope session|hour|always [--when CONDITION]" in shown.stdout, shown.stdout
    shown_json = json.loads(cli(config, env, "approvals", "show", "inv-0001", "--json").stdout)
    assert shown_json["scopes"] == ["once", "session", "hour", "always"]

    when = "normpath(args.name).startsWith('groceries')"
    approved = cli(config, env, "approvals", "approve", "inv-0001", "--scope", "always", "--when", when)
    assert approved.returncode == 0, approved.stderr
    assert "always (see `bastion grants list`)" in approved.stdout
    (grant,) = grants_of(config)
    assert (grant.policy_key, grant.scope, grant.rule, grant.grantor, grant.invocation_id) == (
        "notes:write_note", "always", when, "alice@example.com", "inv-0001"
    )  # fmt: skip
    assert stored(config, "inv-0001")[1][-1].detail["grant"] == grant.id

    listed = cli(config, env, "grants", "list", "--json")
    assert [(g["id"], g["active"]) for g in json.loads(listed.stdout)] == [(grant.id, True)]
    table = cli(config, env, "grants", "list")
    assert grant.id in table.stdout and "1 standing grants" in table.stdout
    assert f"bastion grants revoke ID --config {config}" in table.stdout

    revoked = cli(config, env, "grants", "revoke", grant.id)
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked grant {grant.id} on notes:write_note" in revoked.stdout
    assert json.loads(cli(config, env, "grants", "list", "--json").stdout) == []
    ended = json.loads(cli(config, env, "grants", "list", "--ended", "--json").stdout)
    assert [(g["id"], g["active"], g["revoked_by"]) for g in ended] == [(grant.id, False, "alice@example.com")]
    again = cli(config, env, "grants", "revoke", grant.id, "--json")
    assert again.returncode == 1 and error_class(again) == "not_found"


def test_a_scope_or_a_condition_that_cannot_be_granted_is_refused_and_decides_nothing(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home", BASTION_PRINCIPAL="alice@example.com")
    config = make_config(tmp_path)
    modern = make_invocation(1, session_id="ci-agent/claude-code")  # a 2026-07-28 host: no session of its own
    seed(config, modern)
    assert json.loads(cli(config, env, "approvals", "show", "inv-0001", "--json").stdout)["scopes"] == [
        "once", "hour", "always"
    ]  # fmt: skip

    for extra, words in (
        (("--scope", "session"), "has no session"),
        (("--scope", "always", "--when", "args.name.startsWith("), "not a valid CEL expression"),
        (("--scope", "always", "--when", "args.path.startsWith('/srv/')"), "normpath(args.path)"),
        (("--when", "true"), '"once" approves this call only; drop the condition or choose "hour" or "always"'),
    ):
        refused = cli(config, env, "approvals", "approve", "inv-0001", *extra, "--json")
        assert refused.returncode == 1, refused.stdout
        error = json.loads(refused.stdout)["error"]
        assert error["class"] == "invalid_arguments" and words in error["message"], error
    assert stored(config, "inv-0001")[0].status == "pending"
    assert grants_of(config) == []


def test_grants_are_for_approvers_once_the_ledger_has_an_approver_token(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home", BASTION_PRINCIPAL="alice@example.com")
    config = make_config(tmp_path)
    seed(config, make_invocation(1))
    admin = make_token(config, "alice")
    agent = make_token(config, "agent:ci-2", "agent")
    assert cli(config, env, "approvals", "approve", "inv-0001", "--scope", "hour", "--token", admin).returncode == 0
    (grant,) = grants_of(config)
    assert (grant.scope, grant.principal) == ("hour", "agent:ci")

    for given, expected in (((), "unauthenticated"), (("--token", agent), "forbidden")):
        for command in (("grants", "list"), ("grants", "revoke", grant.id)):
            refused = cli(config, env, *command, *given, "--json")
            assert refused.returncode == 1 and error_class(refused) == expected, refused.stdout
    assert grants_of(config)[0].standing(utcnow())
    assert cli(config, env, "grants", "revoke", grant.id, "--token", admin).returncode == 0
