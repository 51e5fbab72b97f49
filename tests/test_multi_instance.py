"""Several Bastion instances on one PostgreSQL ledger, as real `bastion serve` processes: a call blocked on one is
released by an approval sent to the other, the rate limit is one budget across both, and when one is killed the
other recovers its work (the call it was running becomes unknown, the one approved for it runs there, once)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from bastion.ledger import OpenLedger, Redactor, open_ledger
from tests.postgres import PostgresServer
from tests.processes import Running, bastion_env, bastion_http, run_cli, write_config
from tests.test_e2e_approvals import ROOT, one, reaches, until
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

SLOW = f'command = "{sys.executable}"\nargs = ["-m", "tests.slow_server"]\ncwd = "{ROOT}"\n'


@dataclass
class Deployment:
    """One PostgreSQL ledger and the configuration every instance of the test runs with."""

    config: Path
    env: dict[str, str]
    url: str
    notes: Path
    agent: str
    admin: str


def deploy(tmp_path: Path, postgres: PostgresServer, *, per_minute: int = 60) -> Deployment:
    """A configuration on a new database (the notes demo and a slow server behind it), with an agent's and an
    approver's token created through the CLI."""
    url = postgres.create_database()
    notes = tmp_path / "notes.json"
    config = write_config(
        tmp_path / "config",
        notes_file=notes,
        time_server=False,
        policy='[modes]\n"slow:wait" = "allow"\n',
        extra_connectors={"slow": SLOW},
    )
    (config / "bastion.toml").write_text(
        f'[server]\nledger = "{url}"\n[limits]\nlist_timeout_seconds = 20\ninvocations_per_minute = {per_minute}\n'
    )
    env = bastion_env(tmp_path / "home")
    tokens = []
    for name, role in (("agent-1", "agent"), ("alice", "admin")):
        made = run_cli("tokens", "create", name, "--role", role, "--json", "--config", str(config), env=env)
        assert made.returncode == 0, made.stderr
        tokens.append(json.loads(made.stdout)["token"])
    return Deployment(config, env, url, notes, *tokens)


@asynccontextmanager
async def watching(deployment: Deployment) -> AsyncIterator[OpenLedger]:
    """The shared ledger, opened by the test too, woken by the instances' commits."""
    key = deployment.config / "state" / "ledger.key"
    ledger = await open_ledger(deployment.url, redactor=Redactor(), key_path=key)
    async with ledger, anyio.create_task_group() as group:
        await group.start(ledger.changes.run)
        yield ledger
        group.cancel_scope.cancel()


@asynccontextmanager
async def host(instance: Running, token: str) -> AsyncIterator[Client]:
    """An agent's MCP client (2026-07-28) connected to one instance."""
    headers = {"Authorization": f"Bearer {token}"}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
    async with http, Client(streamable_http_client(instance.mcp_url, http_client=http), cache=None) as client:
        yield client


async def approve(instance: Running, token: str, invocation_id: str) -> httpx2.Response:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        return await http.post(f"{instance.base_url}/api/approvals/{invocation_id}/approve", json={"note": "ok"})


async def test_a_call_blocked_on_one_instance_is_released_by_an_approval_sent_to_the_other(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    deployment = deploy(tmp_path, postgres)
    args = ["--config", str(deployment.config)]
    outcome: list[types.CallToolResult] = []
    async with (
        bastion_http(args, env=deployment.env) as first,
        bastion_http(args, env=deployment.env) as second,
        watching(deployment) as ledger,
        host(first, deployment.agent) as client,
        anyio.create_task_group() as group,
    ):

        async def call() -> None:
            outcome.append(await client.call_tool("notes__write_note", {"name": "plan", "text": "ship it"}))

        group.start_soon(call)
        pending = await one(ledger, "pending")
        response = await approve(second, deployment.admin, pending.id)
        assert response.status_code == 200, response.text
        done = await reaches(ledger, pending.id, "completed")
        assert done.owner == pending.owner, "it ran where it was held"
    (result,) = outcome
    assert not result.is_error
    assert json.loads(deployment.notes.read_text()) == {"plan": "ship it"}


async def test_the_rate_limit_is_one_budget_across_instances(tmp_path: Path, postgres: PostgresServer) -> None:
    deployment = deploy(tmp_path, postgres, per_minute=3)
    args = ["--config", str(deployment.config)]
    async with (
        bastion_http(args, env=deployment.env) as first,
        bastion_http(args, env=deployment.env) as second,
        host(first, deployment.agent) as on_first,
        host(second, deployment.agent) as on_second,
    ):
        for client in (on_first, on_second, on_first):
            assert not (await client.call_tool("notes__list_notes", {})).is_error
        for client in (on_second, on_first):
            refused = await client.call_tool("notes__list_notes", {})
            assert error_of(refused)["class"] == "rate_limited"


async def test_when_an_instance_is_killed_the_other_recovers_its_work_with_nothing_lost_or_run_twice(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    deployment = deploy(tmp_path, postgres)
    args = ["--config", str(deployment.config)]
    async with (
        bastion_http(args, env=deployment.env) as doomed,
        bastion_http(args, env=deployment.env) as survivor,
        watching(deployment) as ledger,
    ):
        async with anyio.create_task_group() as group:
            group.start_soon(call_until_killed, doomed, deployment.agent, "slow__wait", {})
            running = await one(ledger, "executing")
            note = {"name": "plan", "text": "ship it"}
            group.start_soon(call_until_killed, doomed, deployment.agent, "notes__write_note", note)
            pending = await one(ledger, "pending")
            os.kill(doomed.pid, signal.SIGKILL)
            await doomed.process.wait()
        response = await approve(survivor, deployment.admin, pending.id)
        assert response.status_code == 200, response.text
        interrupted = await reaches(ledger, running.id, "unknown")
        finished = await reaches(ledger, pending.id, "completed")
        assert interrupted.error_class == "unknown_outcome"
        assert running.owner == pending.owner != finished.owner
        kinds = [event.kind for event in await ledger.invocations.events(pending.id)]
        assert kinds == ["planned", "pending", "approved", "executing", "completed"]

        async def settled() -> bool | None:
            return True if not await ledger.invocations.list(status="executing") else None

        await until(ledger, settled)
    assert json.loads(deployment.notes.read_text()) == {"plan": "ship it"}


async def call_until_killed(instance: Running, token: str, tool: str, arguments: dict[str, str]) -> None:
    """Call a tool on an instance the test kills under the call: the host's client ends with a transport error."""
    returned = False
    try:
        async with host(instance, token) as client:
            await client.call_tool(tool, arguments)
            returned = True
    except* (httpx2.HTTPError, MCPError):
        pass
    assert not returned, f"{tool} returned although its instance was killed"
