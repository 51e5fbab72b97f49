"""Providers on the command line: `doctor` checks their credentials, `connectors list|check` and `catalog` show them
like connectors (none of them calls a provider's API)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.processes import bastion_env, run_cli
from tests.providers import CANARY

TOML = (
    '[server]\nledger = "sqlite:///state/ledger.db"\n\n'
    '[providers.github]\ntoken = "${env:CLI_GITHUB_TOKEN}"\n\n'  # lines 4-5
    '[providers.slack]\ntoken = "${env:CLI_SLACK_TOKEN}"\n'  # lines 7-8
)


def _config(tmp_path: Path) -> Path:
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "bastion.toml").write_text(TOML)
    return directory


def test_doctor_checks_each_provider_s_credential_with_file_and_line(tmp_path: Path) -> None:
    config = _config(tmp_path)
    env = bastion_env(tmp_path / "home", CLI_GITHUB_TOKEN=CANARY)
    doctor = run_cli("doctor", "--json", "--config", str(config), env=env)
    assert doctor.returncode == 2, doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["counts"]["providers"] == 2
    checks = {(c["check"], c["subject"]): c["ok"] for c in report["checks"]}
    assert (checks[("credential", "github")], checks[("credential", "slack")]) == (True, False)
    (problem,) = report["problems"]
    assert (problem["file"], problem["line"]) == (str(config / "bastion.toml"), 8)
    assert "binding_required" in problem["message"] and "CLI_SLACK_TOKEN" in problem["message"]

    bound = run_cli("doctor", "--config", str(config), env=env | {"CLI_SLACK_TOKEN": "xoxb-" + CANARY})
    assert bound.returncode == 0, bound.stdout
    assert "ok: provider github: github API at https://api.github.com, token bound" in bound.stdout
    assert CANARY not in doctor.stdout + doctor.stderr + bound.stdout + bound.stderr


def test_connectors_list_and_check_show_a_provider_without_its_token_as_unavailable(tmp_path: Path) -> None:
    config = _config(tmp_path)
    env = bastion_env(tmp_path / "home", CLI_GITHUB_TOKEN=CANARY)
    listed = run_cli("connectors", "list", "--json", "--config", str(config), env=env)
    assert listed.returncode == 0, listed.stderr
    statuses = {s["source_id"]: s for s in json.loads(listed.stdout)}
    assert (statuses["github"]["state"], statuses["github"]["tools"]) == ("ready", 8)
    assert statuses["slack"]["state"] == "unavailable"
    assert "binding_required" in statuses["slack"]["last_error"]

    unbound = run_cli("connectors", "check", "slack", "--config", str(config), env=env)
    assert unbound.returncode == 1 and "binding_required" in unbound.stdout
    unknown = run_cli("connectors", "check", "jira", "--json", "--config", str(config), env=env)
    assert unknown.returncode == 1
    assert json.loads(unknown.stdout)["error"]["class"] == "not_found"
    assert "github" in json.loads(unknown.stdout)["error"]["message"]


def test_the_catalog_lists_provider_actions_with_their_declared_risks_and_modes(tmp_path: Path) -> None:
    config = _config(tmp_path)
    env = bastion_env(tmp_path / "home", CLI_GITHUB_TOKEN=CANARY)
    catalog = run_cli("catalog", "--json", "--config", str(config), env=env)
    assert catalog.returncode == 0, catalog.stderr
    rows = {row["tool"]: (row["risk"], row["mode"]) for row in json.loads(catalog.stdout)}
    assert rows["github__list_issues"] == ("read", "allow")
    assert rows["github__create_issue"] == ("write", "require_approval")
    assert rows["github__merge_pull_request"] == ("danger", "deny")
    assert not any(tool.startswith("slack__") for tool in rows)
