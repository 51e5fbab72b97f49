"""Scale: Bastion with 100 connectors x 50 tools; start-up, `tools/list` latency and memory.

One Bastion configuration registers `--connectors` stdio connectors, each a generated downstream
(bench/generated_server.py) exposing 50 tools with realistic schemas. Measured: the time from
starting `bastion serve --transport http` to its `listening on` line and to a `tools/list` that
returns the full catalog; then `tools/list` latency (every page) over `--lists` calls from an SDK
client, in both protocol eras, with the CPU each list costs Bastion and the client, and whether an
SDK client with default settings can receive the catalog at all; Bastion's own resident memory
(VmRSS, and its peak VmHWM) and, separately, the total resident memory of its connector processes.
Every wait is bounded by `--start-timeout`; a catalog still incomplete then is reported as such.
Run: `python -m bench.scale`. Results go to bench/results/scale.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from bench import report
from bench.configs import toml_string
from bench.processes import cpu_seconds, descendants, memory_kib
from tests.processes import served

TOOLS_PER_CONNECTOR = 50


def connector_id(index: int) -> str:
    return f"svc{index:03d}"


def generated_config(directory: Path, connectors: int, start_timeout: float) -> None:
    (directory / "connectors").mkdir(parents=True)
    (directory / "policies").mkdir()
    (directory / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///ledger.db"\n'
        f"[limits]\ninvocations_per_minute = 100000000\nlist_timeout_seconds = {start_timeout}\n"
    )
    server = toml_string(str(Path(__file__).with_name("generated_server.py")))
    for index in range(connectors):
        (directory / "connectors" / f"{connector_id(index)}.toml").write_text(
            f'command = "python"\nargs = [{server}, "{index}"]\n'
        )
    (directory / "policies" / "default.toml").write_text("")


def unlimited(url: str, mode: str = "auto") -> Client:
    """An SDK client over streamable HTTP without the SDK's default 1 MiB cap on one SSE event.

    One unpaginated `tools/list` of 5,000 tools is larger than that, so a client with the default
    cap fails on it; `default_client_check` reports whether it does.
    """
    return Client(streamable_http_client(url, max_sse_event_size=None), cache=None, mode=mode)


async def list_all(client: Client) -> tuple[list[str], int, int]:
    """Every tool name, following cursors; the number of pages; the JSON size of all pages."""
    names: list[str] = []
    cursor: str | None = None
    pages = size = 0
    while True:
        page = await client.list_tools(cursor=cursor)
        pages += 1
        size += len(page.model_dump_json(by_alias=True, exclude_none=True))
        names.extend(tool.name for tool in page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return names, pages, size


def generated(names: list[str]) -> int:
    return sum(1 for name in names if name.startswith("svc") and "__" in name)


async def list_latency(url: str, pid: int, mode: str, lists: int) -> dict[str, Any]:
    """`lists` full listings; with the CPU each took in Bastion (`pid`) and in this client."""
    async with unlimited(url, mode) as client:
        await list_all(client)
        samples = []
        bastion_before, client_before = cpu_seconds([pid]), time.process_time()
        for _ in range(lists):
            started = time.perf_counter()
            names, pages, size = await list_all(client)
            samples.append(time.perf_counter() - started)
        bastion_cpu, client_cpu = cpu_seconds([pid]) - bastion_before, time.process_time() - client_before
        return {
            "protocol_version": client.protocol_version,
            "tools": len(names),
            "pages": pages,
            "json_bytes": size,
            **report.distribution(samples),
            "cpu_ms_per_list": {
                "bastion": round(bastion_cpu / lists * 1000, 1),
                "client": round(client_cpu / lists * 1000, 1),
            },
        }


async def default_client_check(url: str, mode: str) -> str:
    """Whether an SDK client with default settings can list the catalog: "ok" or the error it got."""
    try:
        async with Client(url, cache=None, mode=mode) as client:
            names, _, _ = await list_all(client)
    except (MCPError, ExceptionGroup) as exc:
        # A transport failure leaves the client's task group wrapped in an exception group.
        failure = first_leaf(exc)
        if not isinstance(failure, MCPError):
            raise
        return f"error: {failure}"
    return f"ok ({len(names)} tools)"


def first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def memory(pid: int) -> dict[str, Any]:
    children = descendants(pid)
    return {
        "bastion_rss_mib": round(memory_kib(pid) / 1024, 1),
        "bastion_peak_rss_mib": round(memory_kib(pid, "VmHWM") / 1024, 1),
        "connector_processes": len(children),
        "connectors_rss_mib_total": round(sum(memory_kib(c) for c in children) / 1024, 1),
    }


async def run(connectors: int, lists: int, start_timeout: float) -> dict[str, Any]:
    expected = connectors * TOOLS_PER_CONNECTOR
    with tempfile.TemporaryDirectory(prefix="bastion-bench-scale-") as tmp:
        config = Path(tmp) / "config"
        generated_config(config, connectors, start_timeout)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BASTION_")}
        env |= {"HOME": tmp, "XDG_STATE_HOME": str(Path(tmp) / "state")}
        argv = [sys.executable, "-m", "bastion", "serve", "--config", str(config), "--transport", "http", "--port", "0"]
        async with served(argv, env=env, timeout=start_timeout) as gateway:
            url = gateway.mcp_url
            seen = 0
            full_at: float | None = None
            with anyio.move_on_after(max(1.0, start_timeout - (gateway.ready_at - gateway.started_at))):
                async with unlimited(url) as client:
                    while True:
                        seen = generated((await list_all(client))[0])
                        if seen >= expected:
                            full_at = time.perf_counter()
                            break
                        await anyio.sleep(0.25)
            startup_cpu = cpu_seconds([gateway.pid])
            at_full = memory(gateway.pid)
            latency = {mode: await list_latency(url, gateway.pid, mode, lists) for mode in ("auto", "legacy")}
            default_client = {mode: await default_client_check(url, mode) for mode in ("auto", "legacy")}
            after = memory(gateway.pid)
    return {
        "benchmark": "scale",
        "machine": report.machine(),
        "settings": {
            "connectors": connectors,
            "tools_per_connector": TOOLS_PER_CONNECTOR,
            "lists": lists,
            "start_timeout_s": start_timeout,
        },
        "startup": {
            "to_listening_s": round(gateway.ready_at - gateway.started_at, 2),
            "to_full_catalog_s": None if full_at is None else round(full_at - gateway.started_at, 2),
            "generated_tools_seen": seen,
            "generated_tools_expected": expected,
            "bastion_cpu_s_to_full_catalog": round(startup_cpu, 2),
        },
        "tools_list": latency,
        "tools_list_with_default_sdk_client": default_client,
        "memory_at_full_catalog": at_full,
        "memory_after_lists": after,
    }


def markdown(results: dict[str, Any]) -> str:
    settings, startup = results["settings"], results["startup"]
    full = startup["to_full_catalog_s"]
    lists = report.table(
        [
            "era",
            "tools",
            "pages",
            "JSON bytes",
            "p50 ms",
            "p95 ms",
            "mean ms",
            "CPU ms/list: Bastion / client",
            "SDK client, default settings",
        ],
        [
            [
                r["protocol_version"],
                r["tools"],
                r["pages"],
                r["json_bytes"],
                r["p50_ms"],
                r["p95_ms"],
                r["mean_ms"],
                f"{r['cpu_ms_per_list']['bastion']} / {r['cpu_ms_per_list']['client']}",
                results["tools_list_with_default_sdk_client"][mode],
            ]
            for mode, r in results["tools_list"].items()
        ],
    )
    mem = results["memory_after_lists"]
    figures = report.table(
        ["figure", "value"],
        [
            ["start to `listening on`", f"{startup['to_listening_s']} s"],
            [
                "start to a full catalog",
                f"{full} s" if full is not None else f"not reached ({startup['generated_tools_seen']} tools)",
            ],
            ["Bastion CPU time until then", f"{startup['bastion_cpu_s_to_full_catalog']} s"],
            ["Bastion RSS at full catalog", f"{results['memory_at_full_catalog']['bastion_rss_mib']} MiB"],
            ["Bastion RSS after the lists (peak)", f"{mem['bastion_rss_mib']} MiB ({mem['bastion_peak_rss_mib']} MiB)"],
            [f"{mem['connector_processes']} connector processes, RSS total", f"{mem['connectors_rss_mib_total']} MiB"],
        ],
    )
    return "\n".join(
        [
            f"# Scale: {settings['connectors']} connectors x {settings['tools_per_connector']} tools "
            f"({report.machine_line(results['machine'])})",
            "",
            figures,
            "",
            f"`tools/list` over streamable HTTP, every page, {settings['lists']} calls per era, from an SDK client "
            "without the default 1 MiB limit on one SSE event; the last column is one list with the defaults:",
            "",
            lists,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--connectors", type=int, default=100, help="generated connectors (default 100)")
    parser.add_argument("--lists", type=int, default=50, help="timed tools/list calls per era (default 50)")
    parser.add_argument("--start-timeout", type=float, default=300, help="bound on start-up, seconds (default 300)")
    args = parser.parse_args()
    results = anyio.run(run, args.connectors, args.lists, args.start_timeout)
    report.write("scale", results, markdown(results))


if __name__ == "__main__":
    main()
