"""`bastion invocations reconcile`, `invocations list --unresolved` and `bastion audit verify|export|prune` as people
run them: real processes on a real SQLite ledger."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from datetime import timedelta
from pathlib import Path

import anyio
import pytest

from bastion.models import utcnow
from bastion.sources.providers.evidence import tag_of
from bastion.sources.providers.github import marker
from tests.fake_apis import AGENT_TOKEN, FakeGitHub
from tests.processes import bastion_command, bastion_env
from tests.processes import run_cli as run_any_cli
from tests.providers import CANARY
from tests.test_api import serving
from tests.test_cli_approvals import ledger_path, make_config, make_invocation, open_ledger

pytestmark = pytest.mark.anyio


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A `bastion` command on the configuration in the environment's home (`HOME/config`)."""
    return run_any_cli(*args, "--config", str(Path(env["HOME"]) / "config"), env=env)


async def _record(config: Path, number: int, status: str, *, minutes_ago: float = 1) -> str:
    at = utcnow() - timedelta(minutes=minutes_ago)
    invocation = make_invocation(number, status=status, mode="allow", created_at=at, updated_at=at)
    kinds = {
        "unknown": ["planned", "approved", "executing", "unknown"],
        "executing": ["planned", "approved", "executing"],
        "completed": ["planned", "approved", "executing", "completed"],
    }[status]
    async with open_ledger(config) as ledger:
        await ledger.invocations.record(invocation, kinds)  # type: ignore[arg-type]
    return invocation.id


async def test_an_unknown_call_is_listed_unresolved_then_reconciled_by_hand(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    env = bastion_env(config.parent)
    unknown = await _record(config, 1, "unknown")
    stale = await _record(config, 2, "executing", minutes_ago=30)
    await _record(config, 3, "executing", minutes_ago=0)
    await _record(config, 4, "completed")

    listed = run_cli("invocations", "list", "--unresolved", "--stale-seconds", "600", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert sorted(i["id"] for i in json.loads(listed.stdout)) == sorted([unknown, stale])

    done = run_cli(
        "invocations", "reconcile", unknown, "--outcome", "completed", "--note", "found it", "--json", env=env
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    async with open_ledger(config) as ledger:
        events = await ledger.invocations.events(unknown)
    assert events[-1].kind == "reconciled"
    assert (events[-1].detail["outcome"], events[-1].detail["how"], events[-1].detail["note"]) == (
        "completed",
        "hand",
        "found it",
    )

    again = run_cli("invocations", "reconcile", unknown, "--outcome", "failed", "--json", env=env)
    assert again.returncode == 1
    assert json.loads(again.stdout)["error"]["class"] == "conflict"
    wrong = run_cli("invocations", "reconcile", stale, "--outcome", "maybe", env=env)
    assert wrong.returncode == 2


async def test_reconcile_by_check_asks_the_provider_and_says_when_it_cannot(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    env = bastion_env(config.parent, E2E_GITHUB_TOKEN=CANARY)
    issue = {"owner": "acme", "repo": "app", "title": "Crash on save"}
    github = {"source_id": "github", "mode": "allow", "expires_at": None}
    calls = [
        make_invocation(1, status="unknown", policy_key="github:create_issue", action_id="create_issue", args=issue),
        make_invocation(2, status="unknown", policy_key="github:close_issue", action_id="close_issue", args=issue),
        make_invocation(3, status="unknown", policy_key="github:create_issue", action_id="create_issue", args=issue),
        make_invocation(4, status="unknown", policy_key="github:create_issue", action_id="create_issue", args=issue),
    ]
    async with open_ledger(config) as ledger:
        for call in calls:
            call = call.model_copy(update=github | {"tool": call.policy_key.replace(":", "__")})
            await ledger.invocations.record(call, ["planned", "executing", "unknown"])
        keyed = marker("inv-0001", tag_of(ledger.marker_key, "inv-0001"))  # the ledger's key, as `serve` marks
    fake = FakeGitHub()
    fake.seed_issue("Crash on save", f"Made by Bastion.\n\n{keyed}")
    fake.seed_issue("Crash on save", "Made by the agent.\n\n<!-- bastion:invocation inv-0004 -->", by=AGENT_TOKEN)

    async def reconcile(*args: str) -> tuple[int, str, str]:
        """The command's exit status, its JSON report (stdout) and its log (stderr)."""
        command = bastion_command("invocations", "reconcile", *args, "--json", "--config", str(config))
        done = await anyio.run_process(command, env=env, check=False)
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    async with serving(fake.asgi()) as api_url:
        with (config / "bastion.toml").open("a") as toml:
            toml.write(f'\n[providers.github]\ntoken = "${{env:E2E_GITHUB_TOKEN}}"\nbase_url = "{api_url}"\n')
        both = await reconcile("inv-0001", "--check", "--outcome", "completed")
        no_look_up = await reconcile("inv-0002", "--check")
        found = await reconcile("inv-0001", "--check", "--note", "asked")
        not_found = await reconcile("inv-0003", "--check")
        forged = await reconcile("inv-0004", "--check")
    show = bastion_command("invocations", "show", "inv-0004", "--config", str(config))
    shown = await anyio.run_process(show, env=env, check=False)
    shown_json = await anyio.run_process([*show, "--json"], env=env, check=False)
    verify = bastion_command("audit", "verify", "--config", str(config))
    verified = await anyio.run_process(verify, env=env, check=False)

    assert both[0] == 2
    assert no_look_up[0] == 1, no_look_up
    assert json.loads(no_look_up[1])["error"]["class"] == "invalid_arguments"
    assert found[0] == 0, found
    report = json.loads(found[1])
    assert (report["invocation"]["status"], report["found"]["outcome"]) == ("completed", "completed")
    assert report["found"]["result"]["url"] == "https://github.com/acme/app/issues/1"
    assert not_found[0] == 1
    assert (json.loads(not_found[1])["found"], json.loads(not_found[1])["invocation"]["status"]) == (None, "unknown")
    assert forged[0] == 1, forged
    rejected = json.loads(forged[1])
    assert (rejected["invocation"]["status"], rejected["found"]["accepted"]) == ("unknown", False)
    assert (rejected["found"]["creator"], rejected["found"]["result"]["number"]) == ("agent", 2)
    assert "not keyed by this Bastion" in rejected["found"]["reason"]
    assert "not accepted" in forged[2], "the log says what was found and why it is not accepted"
    assert shown.returncode == 0 and " checked " in shown.stdout.decode()
    checked = json.loads(shown_json.stdout)["events"][-1]
    assert (checked["kind"], checked["detail"]["how"], checked["detail"]["found"]["creator"]) == (
        "checked",
        "check",
        "agent",
    )
    assert checked["detail"]["reason"] == rejected["found"]["reason"], "show has why it was refused"
    assert verified.returncode == 0, verified.stdout.decode() + verified.stderr.decode()
    async with open_ledger(config) as ledger:
        events = await ledger.invocations.events("inv-0001")
    assert (events[-1].kind, events[-1].detail["how"], events[-1].detail["note"]) == ("reconciled", "check", "asked")


async def test_audit_verify_passes_then_reports_the_row_edited_behind_its_back(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    env = bastion_env(config.parent)
    for number in range(1, 4):
        await _record(config, number, "completed")
    verified = run_cli("audit", "verify", "--json", env=env)
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["verified"] == 12

    db = sqlite3.connect(ledger_path(config), isolation_level=None)
    try:
        db.execute("DROP TRIGGER events_no_update")
        db.execute("UPDATE events SET kind = 'failed' WHERE id = 8")
    finally:
        db.close()
    broken = run_cli("audit", "verify", "--json", env=env)
    assert broken.returncode == 1
    report = json.loads(broken.stdout)
    assert (report["broken"]["event_id"], report["broken"]["reason"], report["verified"]) == (8, "hash", 7)


async def test_an_export_resumed_from_its_last_id_equals_the_whole_export(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    env = bastion_env(config.parent)
    for number in range(1, 4):
        await _record(config, number, "completed")
    whole = run_cli("audit", "export", "--format", "jsonl", env=env)
    assert whole.returncode == 0, whole.stderr
    lines = whole.stdout.splitlines()
    assert len(lines) == 12
    first = run_cli("audit", "export", "--since", "0", env=env).stdout.splitlines()[:5]
    cursor = json.loads(first[-1])["id"]
    rest = run_cli("audit", "export", "--since", str(cursor), env=env).stdout.splitlines()
    assert first + rest == lines
    record = json.loads(lines[0])
    assert record["invocation"]["id"] == record["invocation_id"]
    assert {"prev_hash", "hash", "position", "detail"} <= set(record)


async def test_a_prune_by_age_keeps_the_chain_verifiable(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    env = bastion_env(config.parent)
    await _record(config, 1, "completed", minutes_ago=3 * 24 * 60)
    await _record(config, 2, "completed", minutes_ago=2 * 24 * 60)
    await _record(config, 3, "completed", minutes_ago=1)
    pruned = run_cli("audit", "prune", "--older-than-days", "1", "--json", env=env)
    assert pruned.returncode == 0, pruned.stderr
    report = json.loads(pruned.stdout)
    assert (report["events"], report["invocations"], report["kept_by"]) == (8, 2, "inv-0003")
    verified = run_cli("audit", "verify", "--json", env=env)
    assert verified.returncode == 0
    assert json.loads(verified.stdout)["verified"] == 4


async def test_a_prune_without_an_age_uses_ledger_retention_days_and_a_flag_overrides_it(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    env = bastion_env(config.parent)
    bastion_toml = config / "bastion.toml"
    bastion_toml.write_text(bastion_toml.read_text() + "[ledger]\nretention_days = 2.5\n")
    await _record(config, 1, "completed", minutes_ago=3 * 24 * 60)
    await _record(config, 2, "completed", minutes_ago=2 * 24 * 60)
    await _record(config, 3, "completed", minutes_ago=1)

    by_config = run_cli("audit", "prune", "--json", env=env)
    assert by_config.returncode == 0, by_config.stderr
    report = json.loads(by_config.stdout)
    assert (report["invocations"], report["kept_by"]) == (1, "inv-0002")

    by_flag = run_cli("audit", "prune", "--older-than-days", "1", "--json", env=env)
    assert by_flag.returncode == 0, by_flag.stderr
    assert (json.loads(by_flag.stdout)["invocations"], json.loads(by_flag.stdout)["kept_by"]) == (1, "inv-0003")


def test_a_prune_without_an_age_or_a_valid_retention_days_is_a_usage_error_naming_the_line(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    env = bastion_env(config.parent)
    refused = run_cli("audit", "prune", "--json", env=env)
    assert refused.returncode == 2
    error = json.loads(refused.stdout)["error"]
    assert error["class"] == "usage_error"
    assert "--older-than-days" in error["message"] and "retention_days" in error["message"]

    bastion_toml = config / "bastion.toml"
    text = bastion_toml.read_text() + "[ledger]\nretention_days = 0\n"
    bastion_toml.write_text(text)
    line = text.splitlines().index("retention_days = 0") + 1
    refused = run_cli("audit", "prune", env=env)
    assert refused.returncode == 2
    assert f"{bastion_toml}:{line}:" in refused.stderr
    doctor = run_cli("doctor", env=env)
    assert doctor.returncode == 2
    assert f"{bastion_toml}:{line}:" in doctor.stdout + doctor.stderr


async def test_a_leaked_secret_is_scrubbed_and_verify_still_holds(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    env = bastion_env(config.parent)
    leaked = "corp-vpn-passphrase-0451"
    at = utcnow() - timedelta(minutes=1)
    invocation = make_invocation(1, status="completed", mode="allow", created_at=at, updated_at=at, args={"q": leaked})
    async with open_ledger(config) as ledger:
        await ledger.invocations.record(invocation, ["planned", "executing", "completed"], {"echo": leaked})

    refused = run_cli("audit", "scrub", "--secret-env", "LEAKED", env=env | {"LEAKED": "short"})
    assert refused.returncode == 2 and "at least 8 characters" in refused.stderr
    both = run_cli("audit", "scrub", "--secret-env", "LEAKED", "--secret-stdin", env=env)
    assert both.returncode == 2 and "exactly one of" in both.stderr

    scrubbed = run_cli("audit", "scrub", "--secret-env", "LEAKED", "--json", env=env | {"LEAKED": leaked})
    assert scrubbed.returncode == 0, scrubbed.stderr
    assert json.loads(scrubbed.stdout) == {"invocations": 1, "events": 1, "outbox": 0}
    verified = run_cli("audit", "verify", "--json", env=env)
    assert verified.returncode == 0, verified.stdout
    assert json.loads(verified.stdout)["scrubbed"] == 1
    exported = run_cli("audit", "export", env=env)
    assert leaked not in exported.stdout and "[scrubbed]" in exported.stdout
