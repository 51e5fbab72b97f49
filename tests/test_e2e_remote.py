"""End to end over HTTP with tokens: an agent's call blocks, a remote approver releases it with the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.processes import bastion_command, bastion_env, bastion_http, run_cli, write_config
from tests.test_e2e_approvals import one, reaches, watching
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio


def create_token(config: Path, env: dict[str, str], name: str, role: str) -> str:
    made = run_cli("tokens", "create", name, "--role", role, "--json", "--config", str(config), env=env)
    assert made.returncode == 0, made.stderr
    secret: str = json.loads(made.stdout)["token"]
    return secret


async def approvals(env: dict[str, str], *args: str) -> tuple[int, str]:
    done = await anyio.run_process(bastion_command("approvals", *args), env=env, check=False)
    return done.returncode, (done.stdout + done.stderr).decode()


async def test_a_remote_approver_releases_an_agents_blocked_call_and_both_principals_are_recorded(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes.json"
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False)
    env = bastion_env(tmp_path / "home")
    agent = create_token(config, env, "agent-1", "agent")
    admin = create_token(config, env, "alice", "admin")

    outcome: list[types.CallToolResult] = []
    async with bastion_http(["--config", str(config)], env=env) as bastion, watching(config) as ledger:
        async with httpx2.AsyncClient() as http:
            anonymous = await http.post(bastion.mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert anonymous.status_code == 401

        headers = {"Authorization": f"Bearer {agent}"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as agent_http:
            client = Client(streamable_http_client(bastion.mcp_url, http_client=agent_http), cache=None)
            async with client, anyio.create_task_group() as tg:

                async def call() -> None:
                    outcome.append(await client.call_tool("notes__write_note", {"name": "plan", "text": "ship it"}))

                tg.start_soon(call)
                pending = await one(ledger, "pending")
                assert pending.principal == "agent-1"

                remote = ["--url", bastion.base_url]
                code, output = await approvals(env, "approve", pending.id, *remote, "--token", agent)
                assert code == 1
                assert "forbidden" in output
                code, output = await approvals(env, "list", "--json", *remote, "--token", admin)
                assert code == 0, output
                assert [row["id"] for row in json.loads(output)] == [pending.id]
                code, output = await approvals(env, "approve", pending.id, *remote, "--token", admin, "--note", "ok")
                assert code == 0, output
                assert "alice" in output
        (result,) = outcome
        assert not result.is_error
        done = await reaches(ledger, pending.id, "completed")
        assert done.principal == "agent-1"
        approved = [e for e in await ledger.invocations.events(pending.id) if e.kind == "approved"]
        assert approved[0].detail["by"] == "alice"
    assert json.loads(notes.read_text())["plan"] == "ship it"

    code, output = await approvals(env, "approve", pending.id, "--url", bastion.base_url, "--token", admin)
    assert code == 2  # that Bastion is gone: a usage problem, named
    assert "cannot reach" in output


async def test_an_agent_token_with_a_profile_binds_its_sessions_to_that_profile(tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"a": "b"}))
    policy = '[profiles.nightly.modes]\n"notes:read_note" = "deny"\n'
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False, policy=policy)
    env = bastion_env(tmp_path / "home")
    made = run_cli(
        "tokens", "create", "night-agent", "--role", "agent", "--profile", "nightly", "--json",
        "--config", str(config), env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    secret = json.loads(made.stdout)["token"]
    async with bastion_http(["--config", str(config)], env=env) as bastion, watching(config) as ledger:
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx2.AsyncClient(headers=headers) as http:
            client = Client(streamable_http_client(bastion.mcp_url, http_client=http), cache=None)
            async with client:
                result = await client.call_tool("notes__read_note", {"name": "a"})
        assert result.is_error
        assert error_of(result)["class"] == "policy_denied"
        denied = await one(ledger, "denied")
        assert (denied.profile, denied.mode_source, denied.principal) == ("nightly", "profile", "night-agent")
