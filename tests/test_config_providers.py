"""`[providers.<id>]` in bastion.toml: enabled by being there, each checked alone, its credential optional to load."""

from __future__ import annotations

from pathlib import Path

from bastion.config import load_config
from tests.providers import CANARY


def _config_dir(tmp_path: Path, text: str) -> Path:
    (tmp_path / "bastion.toml").write_text(text)
    return tmp_path


def test_a_provider_with_its_token_bound_loads_and_never_shows_the_token(tmp_path: Path) -> None:
    directory = _config_dir(
        tmp_path,
        '[providers.github]\ntoken = "${env:GH_TOKEN}"\n\n'
        '[providers.ghe]\nkind = "github"\ntoken = "${env:GH_TOKEN}"\nbase_url = "https://ghe.example.com/api/v3"\n'
        'namespace = "work"\n',
    )
    config = load_config(directory, env={"GH_TOKEN": CANARY})
    assert config.issues == [] and config.unbound == {}
    github, ghe = config.providers["github"], config.providers["ghe"]
    assert github.token is not None and github.token.get_secret_value() == CANARY
    assert (ghe.effective_kind("ghe"), ghe.effective_namespace("ghe"), github.effective_namespace("github")) == (
        "github",
        "work",
        "github",
    )
    assert CANARY not in repr(config) + config.model_dump_json()


def test_an_unset_token_variable_unbinds_only_that_provider_and_the_rest_of_the_file_applies(tmp_path: Path) -> None:
    directory = _config_dir(
        tmp_path,
        "[limits]\ncall_timeout_seconds = 7\n\n"
        '[providers.github]\ntoken = "${env:GH_TOKEN}"\n\n'
        '[providers.slack]\ntoken = "${env:SLACK_TOKEN}"\n\n'
        "[providers.linear]\n",
    )
    config = load_config(directory, env={"SLACK_TOKEN": "xoxb-1"})
    assert config.issues == []
    assert config.settings.limits.call_timeout_seconds == 7
    assert set(config.providers) == {"github", "slack", "linear"}
    assert set(config.unbound) == {"github", "linear"}
    unset, missing = config.unbound["github"], config.unbound["linear"]
    assert (unset.file, unset.line) == (directory / "bastion.toml", 5)
    assert "binding_required" in unset.message and "GH_TOKEN" in unset.message
    assert missing.line == 10 and "LINEAR_TOKEN" in missing.message


def test_each_broken_provider_is_reported_at_its_line_and_left_out_alone(tmp_path: Path) -> None:
    directory = _config_dir(
        tmp_path,
        '[providers.github]\ntoken = "t"\ntokn = "typo"\n\n'  # 1-3
        '[providers.jira]\ntoken = "t"\n\n'  # 5
        '[providers.sentry]\ntoken = "t"\n\n'  # 8
        '[providers.Slack]\ntoken = "t"\n\n'  # 11
        '[providers.notes]\nkind = "slack"\ntoken = "t"\n\n'  # 14: a connector's id
        '[providers.gitlab]\nkind = "gitlab"\ntoken = "t"\n\n'  # 18
        '[providers.ok]\nkind = "slack"\ntoken = "t"\nbase_url = "ftp://x"\n\n'  # 22-25
        '[providers.linear]\ntoken = "t"\n',  # 27
    )
    (directory / "connectors").mkdir()
    (directory / "connectors" / "notes.toml").write_text('command = "python"\n')
    config = load_config(directory, env={})
    assert list(config.providers) == ["linear"]
    lines = {issue.line: issue.message for issue in config.issues}
    assert sorted(lines) == [3, 5, 8, 11, 14, 19, 25]
    assert 'did you mean "token"' in lines[3]
    assert "kind" in lines[5] and "organization" in lines[8] and "connector" in lines[14]


def test_providers_must_be_tables(tmp_path: Path) -> None:
    config = load_config(_config_dir(tmp_path, 'providers = "github"\n'), env={})
    assert config.providers == {}
    assert [issue.line for issue in config.issues] == [1]
    config = load_config(_config_dir(tmp_path, '[providers]\ngithub = "t"\n'), env={})
    assert config.providers == {} and [issue.line for issue in config.issues] == [2]


def test_a_source_id_claimed_twice_by_any_two_kinds_is_an_error_naming_both_places(tmp_path: Path) -> None:
    directory = _config_dir(
        tmp_path,
        '[providers.actions]\nkind = "github"\ntoken = "t"\n\n'  # 1: reserved for the manifest actions
        '[providers.ops]\nkind = "github"\ntoken = "t"\n\n'  # 5: a connector's id
        '[providers.bastion]\nkind = "slack"\ntoken = "t"\n',  # 9: reserved for bastion__invocation
    )
    (directory / "connectors").mkdir()
    (directory / "connectors" / "ops.toml").write_text('command = "true"\n')
    (directory / "connectors" / "second.toml").write_text('id = "ops"\ncommand = "true"\n')
    (directory / "connectors" / "plugins.toml").write_text('command = "true"\n')

    config = load_config(directory)
    found = {(issue.file.name, issue.line): issue.message for issue in config.issues}
    assert set(config.providers) == set() and [c.id for c in config.connectors] == ["ops"]
    assert "already claimed by connectors/ops.toml:1" in found[("second.toml", 1)]
    assert "the plugin actions of actions/" in found[("plugins.toml", 1)]
    assert "the manifest actions of actions/" in found[("bastion.toml", 1)]
    assert "already claimed by connectors/ops.toml:1" in found[("bastion.toml", 5)]
    assert "bastion__invocation" in found[("bastion.toml", 9)]
    assert all("rename" in message for message in found.values())
