"""The interop matrix: MCP servers people run (tests/interop/servers.py) behind Bastion, hosts of every transport
and protocol version in front (tests/interop/cells.py), with the express lane on and off.

One test per downstream (so test workers share them out): it starts the downstream once, calls it directly for what
each cell must equal, then, for each lane setting, one Bastion over HTTP that every HTTP and SSE cell shares, and a
Bastion over stdio per stdio cell (a stdio host starts its own). Each cell's outcome is written to
`.interop/<downstream>.json`; `python -m tests.interop.table` prints them all as one table.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from bastion.ledger import Redactor, open_ledger
from tests.interop.cells import (
    HOST_TRANSPORTS,
    HOST_VERSIONS,
    Bastions,
    Cell,
    CellResult,
    Ear,
    Expected,
    answer_of,
    resolved,
)
from tests.interop.servers import DOWNSTREAMS, Downstream, Started
from tests.interop.table import RESULTS, table
from tests.processes import bastion_command, bastion_env, bastion_http
from tests.tools import ensure_tools

pytestmark = pytest.mark.anyio


def _config(directory: Path, downstream: Downstream, started: Started, *, express: bool) -> Path:
    (directory / "connectors").mkdir(parents=True)
    (directory / "policies").mkdir()
    (directory / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///state/ledger.db"\nstartup_wait_seconds = 30\n'
        f"express_lane = {json.dumps(express)}\n"
        "[limits]\ninvocations_per_minute = 100000\nlist_timeout_seconds = 30\ncall_timeout_seconds = 90\n"
        # Each cell's held call is a new one: the same arguments sent by the cell before (an anonymous caller of the
        # same client name) would otherwise get that call's outcome (`retry_window_seconds`), not be held again.
        "[approvals]\nmax_pending_per_session = 100\nretry_window_seconds = 0\n"
    )
    (directory / "connectors" / f"{downstream.id}.toml").write_text(started.connector)
    (directory / "policies" / "default.toml").write_text(downstream.policy_file())
    return directory


async def _expected(downstream: Downstream, started: Started, folder: Path) -> Expected:
    """The downstream called directly, as a host without Bastion would (one that answers questions, as Bastion's
    connectors do: some servers list tools only to such hosts)."""
    ear = Ear()
    with anyio.fail_after(60):
        async with Client(
            started.direct, cache=None, sampling_callback=ear.sample, elicitation_callback=ear.elicit
        ) as direct:
            tools = (await direct.list_tools()).tools
            name, arguments = resolved(downstream.allowed, folder, "direct")
            answer = answer_of(await direct.call_tool(name, arguments))
    return Expected({tool.name for tool in tools}, {tool.name: tool.output_schema for tool in tools}, answer)


@pytest.mark.parametrize("downstream_id", list(DOWNSTREAMS))
async def test_every_cell_of_a_downstream_passes_or_is_not_offered(tmp_path: Path, downstream_id: str) -> None:
    ensure_tools()
    downstream = DOWNSTREAMS[downstream_id]
    folder = tmp_path / "downstream"
    folder.mkdir()
    results: list[CellResult] = []
    async with downstream.start(folder) as started:
        expected = await _expected(downstream, started, folder)
        for express in (True, False):
            config = _config(tmp_path / f"express-{express}", downstream, started, express=express)
            env = bastion_env(tmp_path / "home")
            async with (
                bastion_http(["--config", str(config)], env=env) as http,
                await open_ledger(config / "state" / "ledger.db", redactor=Redactor()) as ledger,
                anyio.create_task_group() as tg,
            ):
                await tg.start(ledger.changes.run)  # the approver's view: it notices what the Bastions commit
                bastions = Bastions(bastion_command("serve", "--config", str(config)), env, http.base_url, ledger)
                for transport in HOST_TRANSPORTS:
                    for version in HOST_VERSIONS:
                        name = f"{'x' if express else 's'}-{transport}-{version}"
                        cell = Cell(downstream, expected, bastions, transport, version, folder, name)
                        results.append(await cell.run(express))
                tg.cancel_scope.cancel()
    RESULTS.mkdir(exist_ok=True)
    rows = [result.__dict__ for result in results]
    (RESULTS / f"{downstream_id}.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n" + table(results))
    failed = {f"{r.transport} {r.version} express={r.express}": r.failures for r in results if r.failures}
    assert not failed, json.dumps(failed, indent=1)
