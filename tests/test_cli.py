"""The `bastion` command line as a user runs it: real processes, real files, exit statuses of DESIGN.md §9."""

from __future__ import annotations

import json
from pathlib import Path

from tests.processes import bastion_env, run_cli, write_config

INVOCATION_KEYS = {
    "id", "status", "policy_key", "tool", "source_id", "risk", "mode", "mode_source",
    "error_class", "created_at", "expires_at", "args", "result",
}  # fmt: skip


def test_init_writes_a_starter_that_doctor_accepts_and_never_overwrites(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    target = tmp_path / "starter"
    first = run_cli("init", str(target), env=env)
    assert first.returncode == 0, first.stderr
    assert (target / "bastion.toml").exists()
    doctor = run_cli("doctor", "--config", str(target), env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert doctor.stdout.startswith("ok:")
    again = run_cli("init", str(target), env=env)
    assert again.returncode == 2
    assert "bastion.toml" in again.stderr


def test_usage_errors_exit_2_and_name_the_fix(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    profile = run_cli("serve", "--config", str(config), "--profile", "nope", env=env)
    assert profile.returncode == 2
    assert "nope" in profile.stderr
    exposed = run_cli("serve", "--config", str(config), "--transport", "http", "--host", "0.0.0.0", env=env)
    assert exposed.returncode == 2
    assert "127.0.0.1" in exposed.stderr
    status = run_cli("invocations", "list", "--status", "bogus", "--config", str(config), env=env)
    assert status.returncode == 2
    missing_dir = run_cli("doctor", "--config", str(tmp_path / "absent"), env=env)
    assert missing_dir.returncode == 2
    assert "bastion init" in missing_dir.stderr


def test_a_missing_invocation_is_a_refusal_exit_1(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    shown = run_cli("invocations", "show", "0123456789ab", "--config", str(config), env=env)
    assert shown.returncode == 1
    assert "0123456789ab" in shown.stderr
    listed = run_cli("invocations", "list", "--json", "--config", str(config), env=env)
    assert listed.returncode == 0
    assert json.loads(listed.stdout) == []


def test_connectors_list_and_check_report_each_source(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    broken = 'command = "/nonexistent/server"\n'
    config = write_config(
        tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False, extra_connectors={"gone": broken}
    )
    listed = run_cli("connectors", "list", "--json", "--config", str(config), env=env)
    assert listed.returncode == 0, listed.stderr
    states = {s["source_id"]: s for s in json.loads(listed.stdout)}
    assert states["notes"]["state"] == "ready"
    assert states["notes"]["tools"] == 4
    assert states["gone"]["state"] == "down"
    assert states["gone"]["last_error"]
    assert run_cli("connectors", "check", "notes", "--config", str(config), env=env).returncode == 0
    assert run_cli("connectors", "check", "gone", "--config", str(config), env=env).returncode == 1
    assert run_cli("connectors", "check", "nope", "--config", str(config), env=env).returncode == 1


def test_a_deeply_nested_file_is_reported_by_doctor_and_skipped_by_every_command(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    deep = "bad = " + "[" * 5000 + "]" * 5000 + "\n"
    config = write_config(
        tmp_path / "config",
        notes_file=tmp_path / "notes.json",
        time_server=False,
        policy='[modes]\n"notes:*" = "allow"\n',
        extra_connectors={"deep": 'command = "npx"\n' + deep},
    )
    (config / "policies" / "deep.toml").write_text("# nests too deep\n" + deep)

    doctor = run_cli("doctor", "--config", str(config), env=env)
    assert doctor.returncode == 2
    assert f"{config / 'connectors' / 'deep.toml'}:2:" in doctor.stdout
    assert f"{config / 'policies' / 'deep.toml'}:2:" in doctor.stdout
    listed = run_cli("connectors", "list", "--json", "--config", str(config), env=env)
    assert listed.returncode == 0, listed.stderr
    assert [s["source_id"] for s in json.loads(listed.stdout)] == ["notes"]
    assert "deep.toml:2:" in listed.stderr
    for result in (doctor, listed):
        assert "Traceback" not in result.stdout + result.stderr
