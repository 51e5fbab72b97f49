"""Approval wake-up across instances: two `bastion serve` processes on one ledger; an
agent's call blocks on the first, an approver approves through the second's REST API, and the time from that
decision (committed when the API answers) to the blocked call returning is measured. Target: under 50 ms.

On PostgreSQL the first instance learns of the decision through LISTEN/NOTIFY; on SQLite (two processes on one
file) by polling the file's data_version every 50 ms, for comparison. The PostgreSQL server is the benchmark's
own (tests/postgres.py), with PostgreSQL's default durability (fsync and synchronous commit on). Results go to
bench/results/instances_wakeup.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bench.report import RESULTS, distribution
from tests.postgres import PostgresServer, find_binaries, start_server
from tests.processes import Running, bastion_command, bastion_env, served, write_config


def configure(workdir: Path, ledger: str) -> tuple[Path, dict[str, str], str, str]:
    """A configuration on `ledger` with the notes demo, and an agent's and an approver's token."""
    config = write_config(workdir / "config", notes_file=workdir / "notes.json", time_server=False)
    (config / "bastion.toml").write_text(
        f'[server]\nledger = "{ledger}"\n[limits]\ninvocations_per_minute = 100000000\nlist_timeout_seconds = 60\n'
    )
    env = bastion_env(workdir / "home")
    tokens = []
    for name, role in (("agent", "agent"), ("approver", "admin")):
        made = _cli(env, "tokens", "create", name, "--role", role, "--json", "--config", str(config))
        tokens.append(json.loads(made)["token"])
    return config, env, tokens[0], tokens[1]


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(bastion_command(*args), env=env, capture_output=True, text=True, check=True, timeout=120)
    return done.stdout


@asynccontextmanager
async def two_instances(config: Path, env: dict[str, str]) -> AsyncIterator[tuple[Running, Running]]:
    argv = bastion_command("serve", "--transport", "http", "--port", "0", "--config", str(config))
    async with served(argv, env=env) as first, served(argv, env=env) as second:
        yield first, second


async def measure(first: Running, second: Running, agent: str, approver: str, decisions: int) -> dict[str, Any]:
    """Seconds from the decision's commit (the second instance's API answered) to the call's return on the first,
    and from sending the approval to the return."""
    committed: list[float] = []
    sent: list[float] = []
    agent_http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {agent}"}, timeout=httpx2.Timeout(30, read=120))
    approver_http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {approver}"}, timeout=30)
    async with (
        agent_http,
        approver_http,
        Client(streamable_http_client(first.mcp_url, http_client=agent_http), cache=None) as client,
    ):
        for number in range(decisions + 3):  # the first three warm both instances up
            returned: list[float] = []
            async with anyio.create_task_group() as group:

                async def call(n: int = number, returned: list[float] = returned) -> None:
                    result = await client.call_tool("notes__write_note", {"name": f"n{n}", "text": "x"})
                    returned.append(time.perf_counter())
                    assert not result.is_error, result

                group.start_soon(call)
                invocation_id = await _pending(approver_http, second)
                before = time.perf_counter()
                answer = await approver_http.post(f"{second.base_url}/api/approvals/{invocation_id}/approve", json={})
                after = time.perf_counter()
                answer.raise_for_status()
            if number >= 3:
                committed.append(returned[0] - after)
                sent.append(returned[0] - before)
    return {"decision_committed": distribution(committed), "approval_sent": distribution(sent)}


async def _pending(http: httpx2.AsyncClient, instance: Running) -> str:
    """The id of the one pending invocation, once the second instance lists it."""
    with anyio.fail_after(30):
        while True:
            listed = (await http.get(f"{instance.base_url}/api/approvals")).json()
            rows = listed["approvals"]
            if rows:
                return str(rows[0]["id"])
            await anyio.sleep(0.005)


async def run(decisions: int) -> dict[str, Any]:
    results: dict[str, Any] = {"benchmark": "instances_wakeup", "cores": os.cpu_count(), "decisions": decisions}
    binaries = find_binaries()
    server: PostgresServer | None = start_server(binaries, durable=True) if binaries is not None else None
    try:
        ledgers = {"sqlite": "sqlite:///state/ledger.db"}
        if server is not None:
            ledgers["postgresql"] = server.create_database()
        else:
            results["postgresql"] = "skipped: PostgreSQL is not installed (apt-get install postgresql)"
        for name, url in ledgers.items():
            with tempfile.TemporaryDirectory(prefix="bastion-bench-") as tmp:
                config, env, agent, approver = configure(Path(tmp), url)
                async with two_instances(config, env) as (first, second):
                    results[name] = await measure(first, second, agent, approver, decisions)
    finally:
        if server is not None:
            server.stop()
    results["target"] = "a decision sent to another instance wakes the blocked call within 50 ms"
    return results


def write(results: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "instances_wakeup.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = ["| ledger | measured from | n | median | p95 | max |", "|---|---|---|---|---|---|"]
    for name, label in (("postgresql", "PostgreSQL (LISTEN/NOTIFY)"), ("sqlite", "SQLite file (polled)")):
        found = results.get(name)
        if not isinstance(found, dict):
            rows.append(f"| {label} | {found} | | | | |")
            continue
        for key, start in (("decision_committed", "decision committed"), ("approval_sent", "approval sent")):
            d = found[key]
            rows.append(f"| {label} | {start} | {d['n']} | {d['p50_ms']} ms | {d['p95_ms']} ms | {d['max_ms']} ms |")
    text = (
        f"# Approval wake-up across instances ({results['cores']} cores)\n\n"
        "Two `bastion serve` processes on one ledger: the call blocks on the first, the approval goes to the second's "
        "REST API; until the blocked call returned (running the approved note write included).\n\n"
    )
    (RESULTS / "instances_wakeup.md").write_text(text + "\n".join(rows) + "\n\nTarget: under 50 ms.\n")
    print(text + "\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--decisions", type=int, default=50)
    write(anyio.run(run, parser.parse_args().decisions))


if __name__ == "__main__":
    main()
