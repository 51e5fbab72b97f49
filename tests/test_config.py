"""Configuration discovery, loading, issues with file:line, the starter directory and the shipped manifests."""

from __future__ import annotations

import json
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.config import (
    STARTER_FILES,
    Config,
    ConfigIssue,
    LimitSettings,
    config_option,
    find_config_dir,
    init_config_dir,
    load_config,
    sqlite_path,
    validate_profile,
)
from bastion.config.tomlpos import MAX_NESTING, KeyIndex, KeyPath, describe_syntax_error
from bastion.errors import ConfigError

REPOSITORY = Path(__file__).resolve().parent.parent


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A configuration directory; resolved, since loaded issues carry resolved paths."""
    directory = tmp_path.resolve() / "config"
    directory.mkdir()
    return directory


def write(root: Path, name: str, text: str) -> Path:
    """Write a file whose first line is the first line of `text` (a leading newline is dropped)."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).removeprefix("\n"), encoding="utf-8")
    return path


def issues_of(config: Config, path: Path) -> list[tuple[int, str]]:
    return [(issue.line, issue.message) for issue in config.issues if issue.file == path]


def load(root: Path, **env: str) -> Config:
    return load_config(root, env=env, home=root / "home")


# -- discovery


def test_config_flag_wins_over_env_cwd_and_home(tmp_path: Path) -> None:
    flag, from_env, cwd, home = (tmp_path / name for name in ("flag", "env", "cwd", "home"))
    for directory in (flag, from_env, cwd, home / ".config" / "bastion"):
        directory.mkdir(parents=True)
    (cwd / "bastion.toml").write_text("")
    env = {"BASTION_CONFIG": str(from_env)}
    assert find_config_dir(flag, env=env, cwd=cwd, home=home) == flag


def test_env_variable_is_used_when_there_is_no_flag(tmp_path: Path) -> None:
    (tmp_path / "env").mkdir()
    (tmp_path / "bastion.toml").write_text("")
    found = find_config_dir(None, env={"BASTION_CONFIG": str(tmp_path / "env")}, cwd=tmp_path, home=tmp_path)
    assert found == tmp_path / "env"


def test_cwd_with_bastion_toml_comes_before_the_user_directory(tmp_path: Path) -> None:
    (tmp_path / ".config" / "bastion").mkdir(parents=True)
    (tmp_path / "bastion.toml").write_text("")
    assert find_config_dir(None, env={"BASTION_CONFIG": ""}, cwd=tmp_path, home=tmp_path) == tmp_path


def test_user_config_directory_is_the_last_resort(tmp_path: Path) -> None:
    (tmp_path / "home" / ".config" / "bastion").mkdir(parents=True)
    found = find_config_dir(None, env={}, cwd=tmp_path, home=tmp_path / "home")
    assert found == tmp_path / "home" / ".config" / "bastion"


def test_nothing_found_means_the_embedded_default(tmp_path: Path) -> None:
    assert find_config_dir(None, env={}, cwd=tmp_path, home=tmp_path) is None


def test_relative_and_home_paths_are_resolved_against_cwd_and_home(tmp_path: Path) -> None:
    (tmp_path / "cwd" / "rel").mkdir(parents=True)
    (tmp_path / "home" / "conf").mkdir(parents=True)
    home = tmp_path / "home"
    assert find_config_dir(Path("rel"), env={}, cwd=tmp_path / "cwd", home=home) == tmp_path / "cwd" / "rel"
    assert find_config_dir(None, env={"BASTION_CONFIG": "~/conf"}, cwd=tmp_path, home=home) == home / "conf"


@pytest.mark.parametrize("origin", ["flag", "env"])
def test_a_named_directory_that_does_not_exist_is_an_error_naming_init(tmp_path: Path, origin: str) -> None:
    missing = tmp_path / "nope"
    explicit = missing if origin == "flag" else None
    env = {"BASTION_CONFIG": str(missing)} if origin == "env" else {}
    with pytest.raises(ConfigError, match="bastion init") as caught:
        find_config_dir(explicit, env=env, cwd=tmp_path, home=tmp_path)
    assert str(missing) in caught.value.message


def test_load_config_refuses_a_directory_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_config(tmp_path / "nope", env={})


# -- defaults


def test_an_empty_directory_loads_the_defaults_without_issues(root: Path) -> None:
    config = load(root)
    assert config.issues == []
    assert not config.has_errors
    assert config.directory == root
    assert config.connectors == []
    assert config.settings.approvals.expiry_seconds == 300
    assert config.settings.limits.invocations_per_minute == 60
    assert config.ledger_url == f"sqlite:///{root}/state/ledger.db"


def test_embedded_default_runs_the_notes_demo_with_state_under_home(tmp_path: Path) -> None:
    config = load_config(None, env={}, home=tmp_path)
    state = tmp_path / ".local" / "state" / "bastion"
    assert config.directory is None
    assert config.issues == []
    [notes] = config.connectors
    assert notes.id == "notes"
    assert notes.transport == "stdio"
    assert notes.command == sys.executable
    assert notes.args == ["-m", "bastion.demo.notes"]
    assert notes.env == {"BASTION_NOTES_FILE": str(state / "notes.json")}
    assert config.ledger_url == f"sqlite:///{state}/ledger.db"
    assert sqlite_path(config.ledger_url) == state / "ledger.db"


def test_embedded_default_honours_xdg_state_home(tmp_path: Path) -> None:
    config = load_config(None, env={"XDG_STATE_HOME": str(tmp_path / "xdg")}, home=tmp_path / "home")
    assert config.ledger_url == f"sqlite:///{tmp_path}/xdg/bastion/ledger.db"
    assert config.connectors[0].env["BASTION_NOTES_FILE"] == str(tmp_path / "xdg" / "bastion" / "notes.json")


# -- environment references


def test_env_references_are_replaced_in_every_string(root: Path) -> None:
    write(
        root,
        "connectors/api.toml",
        """
        transport = "http"
        url = "https://${env:API_HOST}/mcp"
        headers = { Authorization = "Bearer ${env:API_TOKEN}" }
        [tools.search]
        pin = { fingerprint = "${env:PIN}" }
        """,
    )
    write(root, "bastion.toml", '[server]\nledger = "sqlite:///${env:LEDGER_DIR}/ledger.db"\n')
    config = load(root, API_HOST="api.example.com", API_TOKEN="t0k", PIN="abc", LEDGER_DIR="data")
    assert config.issues == []
    [api] = config.connectors
    assert api.url == "https://api.example.com/mcp"
    assert api.headers == {"Authorization": "Bearer t0k"}
    pin = api.tools["search"].pin
    assert pin is not None
    assert pin.fingerprint == "abc"
    assert config.ledger_url == f"sqlite:///{root}/data/ledger.db"


def test_an_unset_env_variable_skips_the_file_and_points_at_its_line(root: Path) -> None:
    path = write(
        root,
        "connectors/fs.toml",
        """
        command = "npx"
        args = [
          "-y",
          "--token=${env:FS_TOKEN}",
        ]
        env = { OTHER = "${env:OTHER}" }
        """,
    )
    config = load(root, OTHER="set")
    assert config.connectors == []
    [(line, message)] = issues_of(config, path)
    assert line == 4
    assert "FS_TOKEN" in message


def test_an_unset_env_variable_in_bastion_toml_leaves_out_only_what_uses_it(root: Path) -> None:
    """The ledger, the limits and the other webhook stay: only the webhook, the setting and the plugin variable whose
    variable is unset are left out, each reported at its line (the whole file used to be dropped, ledger and all)."""
    path = write(
        root,
        "bastion.toml",
        """
        [server]
        ledger = "sqlite:///elsewhere/ledger.db"
        [limits]
        invocations_per_minute = 7
        call_timeout_seconds = "${env:TIMEOUT}"
        [[notify.webhook]]
        url = "${env:SLACK_WEBHOOK_URL}"
        format = "slack"
        [[notify.webhook]]
        url = "https://hooks.example.com/bastion"
        secret = "s3cret"
        [plugins]
        env = { KEPT = "a", GONE = "${env:PLUGIN_TOKEN}" }
        [providers.github]
        token = "${env:GITHUB_TOKEN}"
        [providers.linear]
        token = "lin_x"
        base_url = "${env:LINEAR_URL}"
        """,
    )
    config = load(root)
    assert config.ledger_url == f"sqlite:///{root}/elsewhere/ledger.db"
    assert config.settings.limits.invocations_per_minute == 7
    assert config.settings.limits.call_timeout_seconds == LimitSettings().call_timeout_seconds
    assert [str(hook.url) for hook in config.settings.notify.webhook] == ["https://hooks.example.com/bastion"]
    assert set(config.settings.plugins.env) == {"KEPT"}
    assert "github" in config.unbound and "linear" not in config.providers  # unbound; left out
    assert [line for line, _ in issues_of(config, path)] == [5, 7, 13, 18]
    assert all("is not set" in message for _, message in issues_of(config, path))


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("server", "ledger", '"sqlite:///${env:LEDGER_DIR}/l.db"'), ("ledger", "key_file", '"${env:KEY_FILE}"')],
)
def test_an_unset_env_variable_where_data_lives_or_how_it_is_protected_stops_everything(
    root: Path, section: str, key: str, value: str
) -> None:
    write(root, "bastion.toml", f"[limits]\ninvocations_per_minute = 7\n[{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError, match=r"bastion.toml:4: environment variable \w+ is not set") as stopped:
        load(root)
    assert f"[{section}] {key}" in stopped.value.message


def test_a_policy_file_with_an_unset_variable_denies_rather_than_falling_back_to_defaults(root: Path) -> None:
    path = write(root, "policies/strict.toml", '[modes]\n"fs:*" = "${env:FS_MODE}"\n')
    config = load(root)
    assert config.unreadable_policies == ["policies/strict.toml:2"]  # every call is denied while it stands
    assert [line for line, _ in issues_of(config, path)] == [2]


def test_a_malformed_env_reference_is_an_issue(root: Path) -> None:
    path = write(root, "connectors/fs.toml", 'command = "npx"\nenv = { TOKEN = "${env: TOKEN}" }\n')
    config = load(root, TOKEN="x")
    assert config.connectors == []
    assert [line for line, _ in issues_of(config, path)] == [2]


# -- syntax and validation errors


def test_a_syntax_error_reports_the_line_tomllib_gives(root: Path) -> None:
    path = write(root, "bastion.toml", "[approvals]\nexpiry_seconds = 10\nheartbeat_seconds = = 2\n")
    config = load(root)
    [(line, message)] = issues_of(config, path)
    assert line == 3
    assert message.startswith("TOML syntax error")
    assert config.settings.approvals.expiry_seconds == 300


def test_an_unquoted_policy_key_gets_a_quoting_hint(root: Path) -> None:
    path = write(root, "policies/default.toml", '[modes]\nfs:write_file = "deny"\n')
    [(line, message)] = issues_of(load(root), path)
    assert line == 2
    assert '"fs:write_file"' in message


def test_an_invalid_nested_value_is_reported_at_its_own_line(root: Path) -> None:
    path = write(
        root,
        "connectors/fs.toml",
        """
        command = "npx"

        [tools.read_file]
        hidden = true

        [tools.write_file]
        hidden = false
        risk = "extreme"
        """,
    )
    config = load(root)
    [(line, message)] = issues_of(config, path)
    assert line == 8
    assert "tools.write_file.risk" in message
    assert config.connectors == []


def test_an_unknown_key_is_reported_with_a_suggestion(root: Path) -> None:
    path = write(root, "connectors/fs.toml", 'command = "npx"\n[tools.write_file]\nriks = "danger"\n')
    [(line, message)] = issues_of(load(root), path)
    assert line == 3
    assert 'did you mean "risk"' in message


def test_an_unknown_key_without_a_close_match_lists_the_known_keys(root: Path) -> None:
    path = write(root, "bastion.toml", "[limits]\nfrobnicate = 1\n")
    [(line, message)] = issues_of(load(root), path)
    assert line == 2
    assert "invocations_per_minute" in message


def test_a_missing_key_in_a_nested_table_is_reported_at_that_table(root: Path) -> None:
    path = write(root, "connectors/fs.toml", 'command = "npx"\n[tools.x.pin]\nstructural = "s"\n')
    [(line, message)] = issues_of(load(root), path)
    assert line == 2
    assert "fingerprint" in message


def test_invalid_settings_fall_back_one_key_at_a_time(root: Path) -> None:
    path = write(
        root,
        "bastion.toml",
        """
        [servr]
        ledger = "sqlite:///elsewhere.db"

        [approvals]
        expiry_seconds = -1
        heartbeat_seconds = 2

        [limits]
        invocations_per_minute = "many"
        call_timeout_seconds = 9
        """,
    )
    config = load(root)
    issues = issues_of(config, path)
    assert [line for line, _ in issues] == [1, 5, 9]
    assert 'did you mean "server"' in issues[0][1]
    assert config.settings.approvals.expiry_seconds == 300
    assert config.settings.approvals.heartbeat_seconds == 2
    assert config.settings.limits.invocations_per_minute == 60
    assert config.settings.limits.call_timeout_seconds == 9


_DEEP = 5000
DEEP_NESTING = {
    "arrays": "bad = " + "[" * _DEEP + "]" * _DEEP,
    "unclosed arrays": "bad = " + "[" * _DEEP,
    "inline tables": "bad = " + "{ a = " * _DEEP + "1" + " }" * _DEEP,
    "a dotted key": "bad." + ".".join(["a"] * _DEEP) + " = 1",
    "a table header": "[bad." + ".".join(["a"] * _DEEP) + "]\nx = 1",
    "an array of tables": "[[bad." + ".".join(["a"] * _DEEP) + "]]\nx = 1",
}


@pytest.mark.parametrize("shape", list(DEEP_NESTING))
@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("bastion.toml", "[limits]\ncall_timeout_seconds = 9\n"),
        ("connectors/deep.toml", 'command = "npx"\n# the next line nests too deep\n'),
        ("policies/deep.toml", '[modes]\n"fs:*" = "deny"\n'),
    ],
)
def test_deep_nesting_is_an_issue_at_its_line_and_the_other_files_still_load(
    root: Path, shape: str, name: str, prefix: str
) -> None:
    path = write(root, name, prefix + DEEP_NESTING[shape] + "\n")
    write(root, "connectors/fine.toml", 'command = "npx"\n')
    write(root, "policies/fine.toml", '[modes]\n"fine:*" = "allow"\n')
    config = load(root)
    [(line, message)] = issues_of(config, path)
    assert line == 3
    assert str(MAX_NESTING) in message
    assert [issue.file for issue in config.issues] == [path]
    assert [connector.id for connector in config.connectors] == ["fine"]
    assert config.policy.modes == {"fine:*": "allow"}
    assert config.settings.limits.call_timeout_seconds == 30


def test_nesting_up_to_the_limit_loads_and_one_level_more_does_not(root: Path) -> None:
    arrays = MAX_NESTING  # `args` is level 1 and each array inside it one more
    path = write(root, "connectors/edge.toml", f'command = "npx"\nargs = {"[" * arrays}{"]" * arrays}\n')
    assert [line for line, _ in issues_of(load(root), path)] == [2]  # a list, not strings: a validation issue
    path.write_text(f'command = "npx"\nargs = {"[" * (arrays + 1)}{"]" * (arrays + 1)}\n')
    [(line, message)] = issues_of(load(root), path)
    assert line == 2
    assert str(MAX_NESTING) in message


def test_issues_print_as_file_line_message(root: Path) -> None:
    issue = ConfigIssue(file=root / "bastion.toml", line=3, message="fix it")
    assert str(issue) == f"{root}/bastion.toml:3: fix it"


# -- connectors


def test_a_broken_connector_is_skipped_while_its_sibling_loads(root: Path) -> None:
    broken = write(root, "connectors/a_broken.toml", 'command = "npx"\nargs = [\n')
    write(root, "connectors/b_good.toml", 'command = "npx"\n')
    config = load(root)
    assert [connector.id for connector in config.connectors] == ["b_good"]
    assert [issue.file for issue in config.issues] == [broken]


def test_every_broken_file_is_reported_in_one_pass(root: Path) -> None:
    settings = write(root, "bastion.toml", "[limits]\ninvocations_per_minute = 0\n")
    connector = write(root, "connectors/fs.toml", 'transport = "stdio"\ncomand = "npx"\n')
    policy = write(root, "policies/a.toml", '[modes]\n"fs:*" = \n')
    write(root, "policies/b.toml", '[modes]\n"fs:read_file" = "allow"\n')
    write(root, "actions/summarise.md", "+++\nname = 'summarise'\n+++\nNot loaded yet.\n")
    config = load(root)
    assert config.has_errors
    assert list(config.issues_by_file()) == [settings, connector, policy]
    assert issues_of(config, settings)[0][0] == 2
    assert [line for line, _ in issues_of(config, connector)] == [2]
    assert issues_of(config, policy)[0][0] == 2
    assert config.policy.modes == {"fs:read_file": "allow"}


def test_duplicate_connector_ids_keep_the_first_file_in_sorted_order(root: Path) -> None:
    write(root, "connectors/fs.toml", 'command = "first"\n')
    second = write(root, "connectors/zz_other.toml", '# same id\nid = "fs"\ncommand = "second"\n')
    config = load(root)
    [fs] = config.connectors
    assert fs.command == "first"
    [(line, message)] = issues_of(config, second)
    assert line == 2
    assert "connectors/fs.toml" in message


def test_the_connector_id_is_the_file_stem_unless_set(root: Path) -> None:
    write(root, "connectors/files.toml", 'command = "npx"\n')
    write(root, "connectors/My Server.toml", 'id = "mine"\ncommand = "npx"\n')
    config = load(root)
    assert config.issues == []
    assert sorted(connector.id for connector in config.connectors) == ["files", "mine"]


def test_a_file_stem_that_is_not_an_id_needs_an_explicit_id(root: Path) -> None:
    path = write(root, "connectors/My Server.toml", 'command = "npx"\n')
    config = load(root)
    assert config.connectors == []
    [(line, message)] = issues_of(config, path)
    assert line == 1
    assert "my_server" in message


def test_an_explicit_id_must_be_a_valid_source_id(root: Path) -> None:
    path = write(root, "connectors/fs.toml", 'command = "npx"\nid = "File System"\n')
    assert [line for line, _ in issues_of(load(root), path)] == [2]


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ('args = ["x"]\n', 1),
        ('command = "npx"\ntransport = "http"\n', 2),
        ('# remote\ntransport = "sse"\ncommand = "npx"\n', 2),
        ('transport = "stdio"\ncommand = ""\n', 1),
    ],
)
def test_a_transport_without_its_command_or_url_is_skipped(root: Path, body: str, line: int) -> None:
    path = write(root, "connectors/remote.toml", body)
    config = load(root)
    assert config.connectors == []
    assert [issue_line for issue_line, _ in issues_of(config, path)] == [line]


def test_python_as_command_means_the_interpreter_running_bastion(root: Path) -> None:
    write(root, "connectors/a.toml", 'command = "python"\nargs = ["-m", "x"]\n')
    write(root, "connectors/b.toml", 'command = "python3"\n')
    a, b = load(root).connectors
    assert a.command == sys.executable
    assert b.command == "python3"


def test_a_relative_cwd_is_relative_to_the_config_directory(root: Path) -> None:
    write(root, "connectors/a.toml", 'command = "npx"\ncwd = "work"\n')
    write(root, "connectors/b.toml", 'command = "npx"\ncwd = "/srv/data"\n')
    a, b = load(root).connectors
    assert a.cwd == str(root / "work")
    assert b.cwd == "/srv/data"


def test_files_other_than_toml_are_ignored(root: Path) -> None:
    write(root, "connectors/README.md", "# not a connector\n")
    write(root, "connectors/.fs.toml", "this is an editor's swap file")
    write(root, "actions/deploy.md", "+++\nname = 'deploy'\n+++\n")
    config = load(root)
    assert config.issues == []
    assert config.connectors == []


@pytest.mark.parametrize(
    ("tier", "risk"), [("R0", "read"), ("R1", "read"), ("R2", "write"), ("r3", "danger"), ("R4", "danger")]
)
def test_seed_risk_tiers_are_aliases(root: Path, tier: str, risk: str) -> None:
    write(root, "connectors/fs.toml", f'command = "npx"\ndefault_risk = "{tier}"\n[tools.x]\nrisk = "{tier}"\n')
    [fs] = load(root).connectors
    assert fs.default_risk == risk
    assert fs.tools["x"].risk == risk


# -- policies


def test_policy_files_are_merged(root: Path) -> None:
    write(root, "policies/a.toml", '[modes]\n"fs:*" = "require_approval"\n[sources]\ndisabled = ["slack"]\n')
    write(
        root,
        "policies/b.toml",
        """
        [modes]
        "github:create_issue" = "allow"
        [profiles.nightly.modes]
        "fs:write_file" = "deny"
        [sources]
        disabled = ["slack", "linear"]
        """,
    )
    config = load(root)
    assert config.issues == []
    assert config.policy.modes == {"fs:*": "require_approval", "github:create_issue": "allow"}
    assert config.policy.profiles["nightly"].modes == {"fs:write_file": "deny"}
    assert config.policy.sources.disabled == ["slack", "linear"]


@pytest.mark.parametrize(("first", "second"), [("deny", "allow"), ("allow", "deny"), ("require_approval", "allow")])
def test_a_key_set_in_two_files_keeps_the_stricter_mode(root: Path, first: str, second: str) -> None:
    a = write(root, "policies/a.toml", f'[modes]\n"fs:write_file" = "{first}"\n')
    b = write(root, "policies/b.toml", f'# org\n[modes]\n"fs:write_file" = "{second}"\n')
    config = load(root)
    stricter = {"allow": 0, "require_approval": 1, "deny": 2}
    assert config.policy.modes["fs:write_file"] == max(first, second, key=stricter.__getitem__)
    assert issues_of(config, a) == []
    [(line, message)] = issues_of(config, b)
    assert line == 3
    assert "policies/a.toml:2" in message
    assert "policies/b.toml:3" in message


def test_a_profile_key_set_in_two_files_keeps_the_stricter_mode(root: Path) -> None:
    write(root, "policies/a.toml", '[profiles.nightly.modes]\n"fs:*" = "deny"\n')
    b = write(root, "policies/b.toml", '[profiles.nightly]\nmodes = { "fs:*" = "allow", "git:*" = "allow" }\n')
    config = load(root)
    assert config.policy.profiles["nightly"].modes == {"fs:*": "deny", "git:*": "allow"}
    assert [line for line, _ in issues_of(config, b)] == [2]


def test_an_unknown_mode_is_kept_and_reported(root: Path) -> None:
    path = write(root, "policies/default.toml", '[modes]\n"fs:read_file" = "allow"\n"fs:write_file" = "ask"\n')
    config = load(root)
    assert config.policy.modes == {"fs:read_file": "allow", "fs:write_file": "ask"}
    assert [line for line, _ in issues_of(config, path)] == [3]


def test_a_non_string_mode_is_kept_as_text_so_it_fails_safe(root: Path) -> None:
    path = write(root, "policies/default.toml", '[profiles.ci.modes]\n"fs:write_file" = true\n')
    config = load(root)
    assert config.policy.profiles["ci"].modes == {"fs:write_file": "true"}
    assert [line for line, _ in issues_of(config, path)] == [2]


def test_an_unknown_mode_outranks_allow_but_not_deny_in_a_conflict(root: Path) -> None:
    write(root, "policies/a.toml", '[modes]\n"fs:x" = "ask"\n"fs:y" = "ask"\n')
    write(root, "policies/b.toml", '[modes]\n"fs:x" = "allow"\n"fs:y" = "deny"\n')
    assert load(root).policy.modes == {"fs:x": "ask", "fs:y": "deny"}


@pytest.mark.parametrize("key", ["fs", "Fs:write", "fs:write*", "*:*", "fs:", ":write", "fs:write file"])
def test_a_malformed_policy_key_is_reported(root: Path, key: str) -> None:
    path = write(root, "policies/default.toml", f'[modes]\n"fs:ok" = "allow"\n"{key}" = "deny"\n')
    assert [line for line, _ in issues_of(load(root), path)] == [3]


def test_an_invalid_part_of_a_policy_file_is_dropped_and_the_rest_applies(root: Path) -> None:
    path = write(
        root,
        "policies/default.toml",
        """
        [modes]
        "fs:write_file" = "deny"
        [profile.nightly.modes]
        "fs:*" = "deny"
        [profiles.ci]
        inline_approval = "sometimes"
        modes = { "fs:*" = "require_approval" }
        """,
    )
    config = load(root)
    issues = issues_of(config, path)
    assert [line for line, _ in issues] == [3, 6]
    assert 'did you mean "profiles"' in issues[0][1]
    assert config.policy.modes == {"fs:write_file": "deny"}
    assert config.policy.profiles["ci"].modes == {"fs:*": "require_approval"}
    assert config.policy.profiles["ci"].inline_approval is False


def test_conflicting_inline_approval_stays_off(root: Path) -> None:
    write(root, "policies/a.toml", "[profiles.local]\ninline_approval = true\n")
    b = write(root, "policies/b.toml", "[profiles.local]\ninline_approval = false\n")
    write(root, "policies/c.toml", "[profiles.solo]\ninline_approval = true\n")
    config = load(root)
    assert config.policy.profiles["local"].inline_approval is False
    assert config.policy.profiles["solo"].inline_approval is True
    assert [line for line, _ in issues_of(config, b)] == [2]


def test_validate_profile_names_the_known_profiles(root: Path) -> None:
    write(root, "policies/default.toml", '[profiles.nightly.modes]\n"fs:*" = "deny"\n[profiles.ci]\n')
    config = load(root)
    validate_profile(config, "nightly")
    validate_profile(config, "ci")
    with pytest.raises(ConfigError, match="ci, nightly"):
        validate_profile(config, "weekly")


# -- ledger


def test_a_relative_sqlite_ledger_is_relative_to_the_config_directory(root: Path) -> None:
    write(root, "bastion.toml", '[server]\nledger = "sqlite:///data/bastion.db"\n')
    config = load(root)
    assert config.ledger_url == f"sqlite:///{root}/data/bastion.db"
    assert sqlite_path(config.ledger_url) == root / "data" / "bastion.db"


def test_an_absolute_sqlite_ledger_is_kept(root: Path) -> None:
    write(root, "bastion.toml", '[server]\nledger = "sqlite:////var/lib/bastion/ledger.db"\n')
    assert load(root).ledger_url == "sqlite:////var/lib/bastion/ledger.db"


@pytest.mark.parametrize("url", ["mysql://bastion:secret@db/bastion", "sqlite:///", "ledger.db"])
def test_an_unsupported_ledger_url_is_an_issue_and_falls_back_to_the_default(root: Path, url: str) -> None:
    path = write(root, "bastion.toml", f'# ledger\n[server]\nledger = "{url}"\n')
    config = load(root)
    [(line, message)] = issues_of(config, path)
    assert line == 3
    assert "secret" not in message
    assert config.ledger_url == f"sqlite:///{root}/state/ledger.db"


def test_a_postgresql_ledger_is_kept_as_given_with_its_key_in_the_config_directory(root: Path) -> None:
    write(root, "bastion.toml", '[server]\nledger = "postgresql://bastion:secret@db:5432/bastion"\n')
    config = load(root)
    assert (config.ledger_url, config.ledger_key) == (
        "postgresql://bastion:secret@db:5432/bastion",
        root / "state" / "ledger.key",
    )
    assert config.ledger_display == "postgresql://bastion:***@db:5432/bastion"
    assert config.issues == []
    write(
        root, "bastion.toml", '[server]\nledger = "postgres://db/bastion"\n[ledger]\nkey_file = "secrets/bastion.key"\n'
    )
    config = load(root)
    assert (config.ledger_display, config.ledger_key) == ("postgres://db/bastion", root / "secrets" / "bastion.key")


def test_sqlite_path_reads_relative_and_absolute_urls() -> None:
    assert sqlite_path("sqlite:///state/ledger.db") == Path("state/ledger.db")
    assert sqlite_path("sqlite:////srv/ledger.db") == Path("/srv/ledger.db")
    with pytest.raises(ConfigError):
        sqlite_path("postgresql://db/bastion")


# -- starter directory and shipped manifests


def test_init_writes_a_starter_directory_that_loads_clean(tmp_path: Path) -> None:
    target = tmp_path.resolve() / "new" / "bastion"
    written = init_config_dir(target)
    assert written == [target / name for name in STARTER_FILES]
    config = load_config(target, env={}, home=tmp_path)
    assert config.issues == []
    [notes] = config.connectors
    assert (notes.id, notes.command, notes.args) == ("notes", sys.executable, ["-m", "bastion.demo.notes"])
    assert "nightly" in config.policy.profiles


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "default.toml").write_text("# mine\n")
    with pytest.raises(ConfigError, match=r"default\.toml"):
        init_config_dir(tmp_path)
    assert not (tmp_path / "bastion.toml").exists()
    assert (tmp_path / "policies" / "default.toml").read_text() == "# mine\n"


def test_init_refuses_a_target_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    with pytest.raises(ConfigError):
        init_config_dir(tmp_path / "taken")


def test_the_shipped_manifests_load_clean() -> None:
    config = load_config(REPOSITORY / "manifests", env={}, home=REPOSITORY)
    assert config.issues == []
    connectors = {connector.id: connector for connector in config.connectors}
    assert sorted(connectors) == ["git", "notes", "time"]
    assert connectors["git"].tools["git_reset"].risk == "danger"
    assert any(tool.hidden for tool in connectors["git"].tools.values())
    assert config.policy.modes
    assert config.policy.profiles["nightly"].modes


# -- locating keys in TOML text

TRICKY = """\
# [not.a.table] in a comment
title = "value with # and [brackets]"
site."google.com".ok = true
notes = \"\"\"
[fake.header]
"modes" = 1 \\\"\"\" still inside
\"\"\"
raw = '''
[[fake]]'''''
[tools."write:file"]
risk = "danger"   # trailing comment
[tools.'x y']
pin = { fingerprint = "abc", inner = { deep = 1 } }
args = [
  "a",
  { name = "b" },
]
[[steps]]
name = "first"
[[steps]]
name = "second"
[[steps.sub]]
q = 1
[steps.meta]
when = 1979-05-27 07:32:00Z
"""


def test_the_tricky_document_is_valid_toml() -> None:
    data = tomllib.loads(TRICKY)
    assert data["tools"]["write:file"]["risk"] == "danger"
    assert data["steps"][1]["sub"][0]["q"] == 1


@pytest.mark.parametrize(
    ("path", "line"),
    [
        (("title",), 2),
        (("site", "google.com", "ok"), 3),
        (("notes",), 4),
        (("raw",), 8),
        (("tools",), 10),
        (("tools", "write:file", "risk"), 11),
        (("tools", "x y", "pin", "fingerprint"), 13),
        (("tools", "x y", "pin", "inner", "deep"), 13),
        (("tools", "x y", "args", 0), 15),
        (("tools", "x y", "args", 1, "name"), 16),
        (("steps", 0, "name"), 19),
        (("steps", 1), 20),
        (("steps", 1, "name"), 21),
        (("steps", 1, "sub", 0, "q"), 23),
        (("steps", 1, "meta", "when"), 25),
    ],
)
def test_the_locator_finds_each_key_line(path: KeyPath, line: int) -> None:
    assert KeyIndex(TRICKY).line_of(path) == line


def test_the_locator_falls_back_to_the_table_then_to_line_one() -> None:
    index = KeyIndex(TRICKY)
    assert index.line_of(("tools", "write:file", "missing")) == 10
    assert index.line_of(("steps", 1, "meta", "missing")) == 24
    assert index.line_of(("fake", "header")) == 1
    assert index.line_of(()) == 1


def test_the_locator_never_fails_on_broken_text() -> None:
    for text in ['a = "unterminated\n[b', "[[", "x = [1, {", 'k = """never closed', "= = ="]:
        KeyIndex(text).line_of(("a", "b"))


def test_the_locator_stops_at_the_first_line_nesting_too_deep() -> None:
    text = "a = 1\nb = " + "[\n" * (MAX_NESTING + 1) + "]\n" * (MAX_NESTING + 1)  # level n on line n + 1
    index = KeyIndex(text)
    assert index.too_deep == MAX_NESTING + 2
    assert index.line_of(("a",)) == 1
    assert KeyIndex("b = " + "[" * MAX_NESTING).too_deep is None


def test_a_syntax_error_at_end_of_document_points_at_the_last_line() -> None:
    text = "a = 1\nb = [1,\n"
    with pytest.raises(tomllib.TOMLDecodeError, match="end of document") as caught:
        tomllib.loads(text)
    line, _ = describe_syntax_error(caught.value, text)
    assert line == 2


_KEYS = st.text(alphabet="ab_-.:# []=\"'\\é", min_size=1, max_size=6)
_LEAVES = st.one_of(
    st.integers(),
    st.text(alphabet="xy #[]=\"'\\\n", max_size=8),
    st.lists(st.one_of(st.integers(), st.dictionaries(_KEYS, st.integers(), max_size=2)), max_size=3),
)
_TABLES = st.dictionaries(
    _KEYS, st.dictionaries(_KEYS, st.one_of(_LEAVES, st.dictionaries(_KEYS, _LEAVES, max_size=3)))
)


class _Emitter:
    """Writes generated data as TOML and notes the line where each key is written."""

    def __init__(self) -> None:
        self.text = ""
        self.expected: dict[KeyPath, int] = {}

    def key(self, path: KeyPath) -> None:
        self.expected[path] = self.text.count("\n") + 1
        self.text += json.dumps(path[-1], ensure_ascii=False)

    def value(self, path: KeyPath, value: object) -> None:
        if isinstance(value, dict):
            self.text += "{ "
            for i, (key, item) in enumerate(value.items()):
                self.text += ", " if i else ""
                self.key((*path, key))
                self.text += " = "
                self.value((*path, key), item)
            self.text += " }"
        elif isinstance(value, list):
            self.text += "[  # one element per line\n"
            for i, item in enumerate(value):
                self.expected[(*path, i)] = self.text.count("\n") + 1
                self.value((*path, i), item)
                self.text += ",\n"
            self.text += "]"
        elif isinstance(value, str) and "\n" in value:
            self.text += '"""\n' + value.replace("\\", "\\\\").replace('"', '\\"') + '"""'
        else:
            self.text += json.dumps(value, ensure_ascii=False)


@given(_TABLES)
def test_the_locator_finds_every_key_of_generated_documents(tables: dict[str, dict[str, object]]) -> None:
    emitter = _Emitter()
    for table, body in tables.items():
        emitter.text += "["
        emitter.key((table,))
        emitter.text += "]  # [decoy]\n"
        for key, value in body.items():
            emitter.key((table, key))
            emitter.text += " = "
            emitter.value((table, key), value)
            emitter.text += "\n"
    assert tomllib.loads(emitter.text) == tables
    index = KeyIndex(emitter.text)
    for path, line in emitter.expected.items():
        assert index.line_of(path) == line, (path, emitter.text)


def test_hints_name_a_config_directory_unless_every_command_finds_it_by_default(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert config_option(None, home=home) == ""
    assert config_option((home / ".config" / "bastion").resolve(), home=home) == ""
    assert config_option(tmp_path / "my config", home=home) == f" --config '{tmp_path}/my config'"
    assert config_option(tmp_path / "cfg", home=None) == f" --config {tmp_path}/cfg"
