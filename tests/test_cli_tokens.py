"""`bastion tokens`: a secret printed once at creation, listed never, and refused once revoked."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import anyio

from bastion.ledger import Redactor, open_ledger
from bastion.models import Principal
from tests.processes import bastion_env, run_cli, write_config

SECRET = re.compile(r"bst_[A-Za-z0-9_-]{43}")
POLICY = '[profiles.nightly.modes]\n"notes:write_note" = "deny"\n'


def make_config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False, policy=POLICY)


def cli(config: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, "--config", str(config), env=bastion_env(tmp_path / "home"))


async def authenticate(config: Path, secret: str) -> Principal | None:
    async with await open_ledger(config / "state" / "ledger.db", redactor=Redactor()) as ledger:
        return await ledger.tokens.authenticate(secret)


def test_create_prints_the_secret_once_and_list_never_shows_it(tmp_path: Path) -> None:
    config = make_config(tmp_path)

    created = cli(config, tmp_path, "tokens", "create", "ci-agent", "--role", "agent", "--profile", "nightly")
    assert created.returncode == 0, created.stderr
    secrets = SECRET.findall(created.stdout + created.stderr)
    assert len(secrets) == 1
    assert "cannot be shown again" in created.stdout
    assert "Authorization: Bearer" in created.stdout
    assert "BASTION_TOKEN" in created.stdout
    assert anyio.run(authenticate, config, secrets[0]) == Principal(name="ci-agent", role="agent", profile="nightly")

    as_json = cli(config, tmp_path, "tokens", "create", "alice@example.com", "--role", "owner", "--json")
    assert as_json.returncode == 0, as_json.stderr
    owner = json.loads(as_json.stdout)
    assert SECRET.fullmatch(owner["token"])
    assert (owner["name"], owner["role"], owner["profile"], owner["active"]) == (
        "alice@example.com",
        "owner",
        None,
        True,
    )

    table = cli(config, tmp_path, "tokens", "list")
    assert table.returncode == 0, table.stderr
    assert "ci-agent" in table.stdout
    assert "nightly" in table.stdout
    listed = cli(config, tmp_path, "tokens", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(row["name"], row["role"], row["profile"]) for row in rows] == [
        ("alice@example.com", "owner", None),
        ("ci-agent", "agent", "nightly"),
    ]
    assert set(rows[0]) == {"name", "role", "profile", "created_at", "revoked_at", "active"}
    for output in (table, listed):
        assert "bst_" not in output.stdout + output.stderr


def test_a_name_in_use_is_refused_until_its_token_is_revoked(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    first = cli(config, tmp_path, "tokens", "create", "ci-agent", "--role", "agent")
    assert first.returncode == 0, first.stderr

    taken = cli(config, tmp_path, "tokens", "create", "ci-agent", "--role", "admin")
    assert taken.returncode == 1
    assert taken.stderr.startswith("error: conflict:")
    assert not SECRET.search(taken.stdout + taken.stderr)

    revoked = cli(config, tmp_path, "tokens", "revoke", "ci-agent")
    assert revoked.returncode == 0, revoked.stderr
    assert "ci-agent" in revoked.stdout
    assert anyio.run(authenticate, config, SECRET.findall(first.stdout)[0]) is None

    again = cli(config, tmp_path, "tokens", "revoke", "ci-agent")
    assert again.returncode == 1
    assert again.stderr.startswith("error: not_found:")

    reused = cli(config, tmp_path, "tokens", "create", "ci-agent", "--role", "admin")
    assert reused.returncode == 0, reused.stderr
    rows = json.loads(cli(config, tmp_path, "tokens", "list", "--json").stdout)
    assert [(row["role"], row["active"], row["revoked_at"] is None) for row in rows] == [
        ("admin", True, True),
        ("agent", False, False),
    ]


def test_profile_must_be_known_and_only_given_to_agent_tokens(tmp_path: Path) -> None:
    config = make_config(tmp_path)

    unknown = cli(config, tmp_path, "tokens", "create", "ci-agent", "--role", "agent", "--profile", "weekly")
    assert unknown.returncode == 2
    assert "nightly" in unknown.stderr  # names the known profiles
    owner = cli(config, tmp_path, "tokens", "create", "alice", "--role", "owner", "--profile", "nightly")
    assert owner.returncode == 2
    assert "--role agent" in owner.stderr

    assert cli(config, tmp_path, "tokens", "create", "has space", "--role", "agent").returncode == 2
    assert cli(config, tmp_path, "tokens", "create", "ci-agent", "--role", "root").returncode == 2
    assert cli(config, tmp_path, "tokens", "create", "ci-agent").returncode == 2
    assert json.loads(cli(config, tmp_path, "tokens", "list", "--json").stdout) == []


def test_once_an_approver_token_exists_only_its_holder_creates_or_revokes_tokens(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    made = cli(config, tmp_path, "tokens", "create", "alice", "--role", "admin", "--json")
    assert made.returncode == 0, made.stderr
    admin = json.loads(made.stdout)["token"]

    minted = cli(config, tmp_path, "tokens", "create", "me", "--role", "owner", "--json")
    assert minted.returncode == 1
    assert json.loads(minted.stdout)["error"]["class"] == "unauthenticated"
    assert cli(config, tmp_path, "tokens", "revoke", "alice").returncode == 1
    agent = cli(config, tmp_path, "tokens", "create", "ci-agent", "--role", "agent", "--json", "--token", admin)
    assert agent.returncode == 0, agent.stderr
    by_agent = cli(
        config,
        tmp_path,
        "tokens",
        "create",
        "me",
        "--role",
        "owner",
        "--json",
        "--token",
        json.loads(agent.stdout)["token"],
    )
    assert json.loads(by_agent.stdout)["error"]["class"] == "forbidden"
    assert anyio.run(authenticate, config, admin) == Principal(name="alice", role="admin")

    revoked = cli(config, tmp_path, "tokens", "revoke", "alice", "--token", admin)
    assert revoked.returncode == 0, revoked.stderr
    assert anyio.run(authenticate, config, admin) is None
