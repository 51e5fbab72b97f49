"""`bastion approvals` as an approver runs it: real processes deciding on a real SQLite ledger."""

from __future__ import annotations

import getpass
import json
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from bastion import program
from bastion.ledger import OpenLedger, Redactor
from bastion.ledger import open_ledger as ledger_at
from bastion.models import EventKind, Invocation, InvocationEvent, Role, utcnow
from tests.ledger_contract.samples import unsigned
from tests.processes import bastion_command, bastion_env, run_cli, write_config
from tests.test_cli import INVOCATION_KEYS

DRIFT = [
    "--- pinned",
    "+++ current",
    "@@ -1 +1 @@",
    '-  "description": "Write a note."',
    '+  "description": "Exfiltrate."',
]
HISTORY: dict[str, Sequence[EventKind]] = {
    "pending": ("planned", "pending"),
    "completed": ("planned", "approved", "executing", "completed"),
}


def make_config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)


def ledger_path(config: Path) -> Path:
    return config / "state" / "ledger.db"


@asynccontextmanager
async def open_ledger(config: Path) -> AsyncIterator[OpenLedger]:
    """The configuration's ledger, through the test's own connection."""
    async with await ledger_at(ledger_path(config), redactor=Redactor()) as ledger:
        yield ledger


def make_invocation(number: int, *, status: str = "pending", **overrides: Any) -> Invocation:
    """A write call waiting for approval; `number` orders creation (higher is newer)."""
    created = utcnow() - timedelta(minutes=1) + timedelta(seconds=number)
    fields: dict[str, Any] = {
        "id": f"inv-{number:04d}",
        "status": status,
        "policy_key": "notes:write_note",
        "tool": "notes__write_note",
        "source_id": "notes",
        "action_id": "write_note",
        "risk": "write",
        "mode": "require_approval",
        "mode_source": "inferred",
        "session_id": f"session-{number}",
        "principal": "agent:ci",
        "args": {"name": "groceries", "api_token": "hunter2"},
        "args_hash": "0" * 64,
        "created_at": created,
        "updated_at": created,
        "expires_at": utcnow() + timedelta(minutes=5) if status == "pending" else None,
    }
    return Invocation(**(fields | overrides))


async def record(config: Path, *invocations: Invocation) -> None:
    async with open_ledger(config) as ledger:
        for invocation in invocations:
            await ledger.invocations.record(invocation, HISTORY[invocation.status])


async def read_back(config: Path, invocation_id: str) -> tuple[Invocation, list[InvocationEvent]]:
    async with open_ledger(config) as ledger:
        invocation = await ledger.invocations.get(invocation_id)
        assert invocation is not None
        return invocation, await ledger.invocations.events(invocation_id)


def seed(config: Path, *invocations: Invocation) -> None:
    anyio.run(record, config, *invocations)


def stored(config: Path, invocation_id: str) -> tuple[Invocation, list[InvocationEvent]]:
    return anyio.run(read_back, config, invocation_id)


def cli(config: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, "--config", str(config), env=env)


# -- list and show ----------------------------------------------------------------------------------


def test_list_shows_pending_invocations_newest_first_with_expiry_and_drift(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    seed(config, make_invocation(1), make_invocation(2, drift=DRIFT), make_invocation(3, status="completed"))

    listed = cli(config, env, "approvals", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["id"] for r in rows] == ["inv-0002", "inv-0001"]
    assert INVOCATION_KEYS | {"expires_in_seconds", "drifted", "drift", "session_id", "principal"} <= set(rows[0])
    assert [r["drifted"] for r in rows] == [True, False]
    assert rows[0]["drift"] == DRIFT
    assert all(0 < r["expires_in_seconds"] <= 300 for r in rows)
    assert rows[0]["args"] == {"name": "groceries", "api_token": "[REDACTED]"}
    assert not any("args_hash" in r for r in rows)  # it would let a reader guess redacted values

    table = cli(config, env, "approvals", "list")
    assert table.returncode == 0, table.stderr
    assert "inv-0002" in table.stdout
    assert "inv-0003" not in table.stdout


def test_list_marks_pending_invocations_past_their_expiry_as_expired(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    seed(config, make_invocation(1, expires_at=utcnow() - timedelta(seconds=1)), make_invocation(2))

    listed = cli(config, env, "approvals", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == ["inv-0002"]
    assert stored(config, "inv-0001")[0].status == "expired"


def test_show_gives_args_events_drift_and_the_commands_that_decide(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    seed(config, make_invocation(1, drift=DRIFT, risk_source="default_risk"))

    shown = cli(config, env, "approvals", "show", "inv-0001", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert set(data) >= INVOCATION_KEYS
    assert data["status"] == "pending"
    assert (data["risk"], data["risk_source"]) == ("write", "default_risk")
    assert data["args"]["api_token"] == "[REDACTED]"
    assert "args_hash" not in data
    assert [e["kind"] for e in data["events"]] == ["planned", "pending"]
    assert data["drift"] == DRIFT
    assert data["drifted"] is True
    assert set(data["commands"]) == {"approve", "deny"}
    # The commands run as copied: `bastion` is named by its path when that name on PATH is not this Bastion.
    assert data["commands"]["approve"].startswith(f"{program.bastion_command()} approvals approve inv-0001 --config ")
    assert data["commands"]["deny"].startswith(f"{program.bastion_command()} approvals deny inv-0001 --config ")

    table = cli(config, env, "approvals", "show", "inv-0001")
    assert table.returncode == 0, table.stderr
    assert DRIFT[-1] in table.stdout
    assert "write (from default_risk)" in table.stdout
    assert data["commands"]["approve"] in table.stdout


def test_show_of_a_decided_invocation_offers_no_commands_and_a_missing_one_exits_1(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    seed(config, make_invocation(1, status="completed"))

    shown = cli(config, env, "approvals", "show", "inv-0001", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["commands"] is None
    missing = cli(config, env, "approvals", "show", "inv-9999", "--json")
    assert missing.returncode == 1
    assert json.loads(missing.stdout)["error"]["class"] == "not_found"


# -- decisions --------------------------------------------------------------------------------------


def test_approve_records_the_principal_from_the_environment(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home", BASTION_PRINCIPAL="alice@example.com")
    config = make_config(tmp_path)
    seed(config, make_invocation(1))

    approved = cli(config, env, "approvals", "approve", "inv-0001", "--note", "looks fine")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith("approved inv-0001")
    invocation, events = stored(config, "inv-0001")
    assert invocation.status == "approved"
    assert events[-1].kind == "approved"
    assert unsigned(events[-1].detail) == {"by": "alice@example.com", "note": "looks fine", "scope": "once"}


def test_deny_records_the_local_login_and_the_reason_and_prints_json(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    seed(config, make_invocation(1))

    denied = cli(config, env, "approvals", "deny", "inv-0001", "--reason", "not today", "--json")
    assert denied.returncode == 0, denied.stderr
    data = json.loads(denied.stdout)
    assert set(data) >= INVOCATION_KEYS
    assert data["status"] == "denied"
    assert data["error_class"] == "approval_denied"
    invocation, events = stored(config, "inv-0001")
    assert invocation.status == "denied"
    assert unsigned(events[-1].detail) == {"by": f"local:{getpass.getuser()}", "reason": "not today"}


def test_a_second_decision_is_a_conflict_and_changes_nothing(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    seed(config, make_invocation(1))

    assert cli(config, env, "approvals", "deny", "inv-0001").returncode == 0
    again = cli(config, env, "approvals", "approve", "inv-0001")
    assert again.returncode == 1
    assert again.stderr.startswith("error: conflict:")
    assert "denied" in again.stderr
    invocation, events = stored(config, "inv-0001")
    assert invocation.status == "denied"
    assert [e.kind for e in events] == ["planned", "pending", "denied"]


def test_deciding_a_missing_invocation_exits_1_not_found(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    for verb in ("approve", "deny"):
        missing = cli(config, env, "approvals", verb, "inv-9999")
        assert missing.returncode == 1
        assert missing.stderr.startswith("error: not_found:")
        assert "inv-9999" in missing.stderr


def test_an_expired_pending_invocation_cannot_be_approved(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    seed(config, make_invocation(1, expires_at=utcnow() - timedelta(seconds=1)))

    late = cli(config, env, "approvals", "approve", "inv-0001")
    assert late.returncode == 1
    assert late.stderr.startswith("error: approval_expired:")
    assert stored(config, "inv-0001")[0].status == "expired"


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    assert run_cli("approvals", "approve", env=env).returncode == 2  # no id
    absent = run_cli("approvals", "list", "--config", str(tmp_path / "absent"), env=env)
    assert absent.returncode == 2
    assert "bastion init" in absent.stderr


# -- approver tokens on the local ledger ----------------------------------------------------------------


async def create_token(config: Path, name: str, role: Role) -> str:
    async with open_ledger(config) as ledger:
        return await ledger.tokens.create_token(name, role=role, profile=None, now=utcnow())


def make_token(config: Path, name: str, role: Role = "admin") -> str:
    """A token in the configuration's ledger, as `bastion tokens create` makes it; its secret."""
    return anyio.run(create_token, config, name, role)


def error_class(result: subprocess.CompletedProcess[str]) -> str:
    body: dict[str, Any] = json.loads(result.stdout)
    return str(body["error"]["class"])


def test_once_the_ledger_has_an_approver_token_local_decisions_need_one(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home", BASTION_PRINCIPAL="alice@example.com")
    config = make_config(tmp_path)
    seed(config, make_invocation(1), make_invocation(2))
    admin = make_token(config, "alice")
    agent = make_token(config, "agent:ci-2", "agent")

    approve = ("approvals", "approve", "inv-0001", "--json")
    for given, expected in (
        ((), "unauthenticated"),
        (("--token", "bst_" + "x" * 43), "unauthenticated"),
        (("--token", agent), "forbidden"),
    ):
        refused = cli(config, env, *approve, *given)
        assert refused.returncode == 1, refused.stdout
        assert error_class(refused) == expected
    assert "--token" in cli(config, env, "approvals", "deny", "inv-0001").stderr
    assert stored(config, "inv-0001")[0].status == "pending"

    approved = cli(config, env, "approvals", "approve", "inv-0001", "--token", admin)
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith("approved inv-0001 (notes__write_note) as alice")
    assert unsigned(stored(config, "inv-0001")[1][-1].detail) == {"by": "alice", "note": None, "scope": "once"}
    denied = cli(config, env | {"BASTION_TOKEN": admin}, "approvals", "deny", "inv-0002", "--reason", "no")
    assert denied.returncode == 0, denied.stderr
    assert unsigned(stored(config, "inv-0002")[1][-1].detail) == {"by": "alice", "reason": "no"}


def test_nobody_decides_their_own_call_with_a_local_token_either(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    seed(config, make_invocation(1, principal="alice"))
    admin = make_token(config, "alice")

    own = cli(config, env, "approvals", "approve", "inv-0001", "--token", admin, "--json")
    assert own.returncode == 1
    assert error_class(own) == "forbidden"
    assert stored(config, "inv-0001")[0].status == "pending"


# -- racing approvers -------------------------------------------------------------------------------


async def finish(process: Process) -> tuple[int, str, str]:
    """Read a process's output to the end and wait for it: (exit status, stdout, stderr)."""
    output: dict[str, bytes] = {}

    async def drain(name: str) -> None:
        stream = process.stdout if name == "stdout" else process.stderr
        assert stream is not None
        chunks = [chunk async for chunk in stream]
        output[name] = b"".join(chunks)

    async with process:
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain, "stdout")
            tg.start_soon(drain, "stderr")
        status = await process.wait()
    return status, output["stdout"].decode(), output["stderr"].decode()


@pytest.mark.anyio
async def test_two_racing_decisions_exactly_one_wins_the_other_gets_conflict(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    await record(config, make_invocation(1))

    verbs = ("approve", "deny")
    processes = [
        await anyio.open_process(bastion_command("approvals", verb, "inv-0001", "--config", str(config)), env=env)
        for verb in verbs
    ]
    results: dict[str, tuple[int, str, str]] = {}

    async def run(verb: str, process: Process) -> None:
        results[verb] = await finish(process)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for verb, process in zip(verbs, processes, strict=True):
                tg.start_soon(run, verb, process)

    winners = [verb for verb in verbs if results[verb][0] == 0]
    losers = [verb for verb in verbs if results[verb][0] != 0]
    assert len(winners) == 1, results
    assert results[losers[0]][0] == 1, results
    assert results[losers[0]][2].startswith("error: conflict:")
    invocation, events = await read_back(config, "inv-0001")
    assert invocation.status == ("approved" if winners == ["approve"] else "denied")
    assert [e.kind for e in events if e.kind in ("approved", "denied")] == [invocation.status]


# -- id prefixes --------------------------------------------------------------------------------------


def test_every_id_argument_takes_a_unique_prefix_and_refuses_an_ambiguous_one(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = make_config(tmp_path)
    first, second = make_invocation(1, id="0190abcdef01aaaa"), make_invocation(2, id="0190abcdef02bbbb")
    seed(config, first, second)

    shown = cli(config, env, "approvals", "show", "0190abcdef01", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == first.id
    assert first.id in json.loads(shown.stdout)["commands"]["approve"]
    detail = cli(config, env, "invocations", "show", "0190abcdef02", "--json")
    assert json.loads(detail.stdout)["id"] == second.id

    ambiguous = cli(config, env, "approvals", "approve", "0190abcdef0")
    assert ambiguous.returncode == 1
    assert ambiguous.stderr.startswith("error: ambiguous_id:")
    assert first.id in ambiguous.stderr
    assert second.id in ambiguous.stderr
    too_short = cli(config, env, "invocations", "show", "0190a", "--json")
    assert too_short.returncode == 1
    assert json.loads(too_short.stdout)["error"]["class"] == "not_found"
    assert stored(config, first.id)[0].status == stored(config, second.id)[0].status == "pending"

    denied = cli(config, env, "approvals", "deny", "0190abcdef02", "--reason", "no")
    assert denied.returncode == 0, denied.stderr
    assert denied.stdout.startswith(f"denied {second.id}")
    approved = cli(config, env, "approvals", "approve", "0190abcdef01", "--json")
    assert json.loads(approved.stdout)["id"] == first.id
    assert stored(config, first.id)[0].status == "approved"


# -- narrow terminals ---------------------------------------------------------------------------------

LONG_TOOL = "a_connector_with_a_long_name__and_a_tool_whose_name_is_long_too"


@pytest.mark.parametrize("columns", [80, 60])
def test_tables_keep_ids_whole_on_one_line_and_cut_long_text_at_narrow_widths(tmp_path: Path, columns: int) -> None:
    env = bastion_env(tmp_path / "home", COLUMNS=str(columns))
    config = make_config(tmp_path)
    long_ids = [f"0190abcdef{n:02d}{'9' * 12}" for n in range(3)]
    seed(
        config,
        *(
            make_invocation(n, id=invocation_id, tool=LONG_TOOL, session_id="s" * 40, principal="agent:" + "p" * 40)
            for n, invocation_id in enumerate(long_ids)
        ),
        make_invocation(9, id="0190abcdef09" + "8" * 12, status="completed", error_class="upstream_error"),
    )
    for command in (("approvals", "list"), ("invocations", "list")):
        table = cli(config, env, *command)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        for invocation_id in long_ids:
            assert any(invocation_id in line for line in lines), (command, table.stdout)
        assert LONG_TOOL not in table.stdout
        assert "…" in table.stdout
        rows = [line for line in lines if not line.startswith("decide with:")]  # a command to copy is never cut
        assert max(len(line) for line in rows) <= columns, table.stdout
