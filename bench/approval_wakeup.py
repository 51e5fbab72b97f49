"""Approval wake-up: time from an approver's decision to the blocked call returning.

Two ways, over `--decisions` calls each: the decision made in the same process as the blocked call
(the REST API's case), and in another process writing the same ledger (the CLI's case). Each call is
a real MCP client call through Bastion's host server to the demo notes server (in-process), so the
figure includes running the approved action. Results go to bench/results/approval_wakeup.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client

from bastion.config import Config, ConnectorConfig, LimitSettings, PolicyConfig, Settings
from bastion.demo.notes import NoteStore, create_server
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.models import utcnow
from bastion.pipeline.gateway import Gateway
from bastion.server.mcp import HostServer
from bastion.sources.mcp import McpConnector

RESULTS = Path(__file__).resolve().parent / "results"


@asynccontextmanager
async def bastion(workdir: Path) -> AsyncIterator[tuple[Client, OpenLedger]]:
    notes = create_server(NoteStore(workdir / "notes.json"))
    connector = ConnectorConfig(id="notes", command="unused")
    config = Config(
        directory=None,
        settings=Settings(limits=LimitSettings(invocations_per_minute=1_000_000)),
        connectors=[connector],
        policy=PolicyConfig(),
        ledger_url=f"sqlite:///{workdir}/ledger.db",
    )
    async with await open_ledger(workdir / "ledger.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, [McpConnector(connector, target=lambda: notes)])
        async with gateway.running(), Client(HostServer(gateway).server, cache=None) as client:
            yield client, ledger


async def measure(
    client: Client, ledger: OpenLedger, decisions: int, decide: Callable[[str], Awaitable[float]]
) -> list[float]:
    """Milliseconds from `decide` (which returns the decision's commit time) to the call's return."""
    latencies: list[float] = []
    for i in range(decisions):
        returned: list[float] = []
        async with anyio.create_task_group() as tg:

            async def call(n: int = i, returned: list[float] = returned) -> None:
                result = await client.call_tool("notes__write_note", {"name": f"n{n}", "text": "x"})
                returned.append(time.time())
                assert not result.is_error, result

            tg.start_soon(call)
            with anyio.fail_after(10):
                while not (pending := await ledger.invocations.list(status="pending")):
                    with anyio.move_on_after(0.1):
                        await ledger.changes.next(ledger.changes.cursor)
            decided_at = await decide(pending[0].id)
        latencies.append((returned[0] - decided_at) * 1000)
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "n": len(ordered),
        "median_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[max(0, round(0.95 * len(ordered)) - 1)], 2),
        "max_ms": round(ordered[-1], 2),
    }


async def run(decisions: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bastion-bench-") as tmp:
        workdir = Path(tmp)
        async with bastion(workdir) as (client, ledger):

            async def same_process(invocation_id: str) -> float:
                await ledger.invocations.decide(invocation_id, approve=True, principal="bench", note=None, now=utcnow())
                return time.time()

            local = await measure(client, ledger, decisions, same_process)

            decider = await anyio.open_process(
                [sys.executable, str(Path(__file__).with_name("decider.py")), str(workdir / "ledger.db")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            async with decider:
                assert decider.stdin is not None and decider.stdout is not None
                replies = BufferedByteReceiveStream(decider.stdout)

                async def other_process(invocation_id: str) -> float:
                    assert decider.stdin is not None
                    await decider.stdin.send(f"{invocation_id}\n".encode())
                    return float((await replies.receive_until(b"\n", 100)).decode())

                remote = await measure(client, ledger, decisions, other_process)
                await decider.stdin.aclose()
    return {
        "benchmark": "approval_wakeup",
        "cores": os.cpu_count(),
        "same_process": summary(local),
        "other_process": summary(remote),
        "target": "a decision made in another process is noticed within 250 ms",
    }


def write(results: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "approval_wakeup.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = [
        "| decision made in | n | median | p95 | max |",
        "|---|---|---|---|---|",
    ]
    for key, label in (("same_process", "the same process"), ("other_process", "another process (CLI)")):
        r = results[key]
        rows.append(f"| {label} | {r['n']} | {r['median_ms']} ms | {r['p95_ms']} ms | {r['max_ms']} ms |")
    text = f"# Approval wake-up ({results['cores']} cores)\n\nDecision committed -> blocked call returned.\n\n"
    (RESULTS / "approval_wakeup.md").write_text(text + "\n".join(rows) + "\n")
    print(text + "\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--decisions", type=int, default=50)
    write(anyio.run(run, parser.parse_args().decisions))


if __name__ == "__main__":
    main()
