"""Bastion serves hosts at once while its connectors start.

A host that connects early is answered `initialize` at once. During the start-up wait
(`[server] startup_wait_seconds` after Bastion starts) its listings wait for the sources still starting,
so hosts that list only once still see the connectors that start quickly; after it, a listing answers with
what is ready, and a source that comes up later is announced with `tools/list_changed` in both eras. A
connector that never answers holds nothing up for longer than the start-up wait.

In process: a source of Bastion's own kind that starts when the test opens its gate. End to end: `bastion
serve` over stdio and HTTP beside a connector that never answers, and one that comes up when the test
opens a named pipe.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp import Client, StdioServerParameters

from bastion.assembly import freeze_startup_heap
from bastion.config import Config, PolicyConfig, ServerSettings, Settings
from bastion.ledger import Redactor, open_ledger
from bastion.pipeline.gateway import Gateway
from bastion.server.mcp import HostServer
from bastion.sources.seam import ChangeFn
from tests.processes import bastion_command, bastion_env, served, write_config
from tests.test_e2e import ERAS, NOTES_TOOLS, host_client
from tests.test_gateway import error_of
from tests.test_sources import Counter
from tests.tools import ROOT

pytestmark = pytest.mark.anyio

LIST_TIMEOUT = 60
"""Each connector's listing timeout in the end-to-end tests: far above every wait of theirs, so nothing they see
comes from a connector given up on."""

BOUND = 30
"""The bound on each end-to-end test's waits: half the listing timeout, so a Bastion that waited for the stuck
connector before serving fails it."""

COUNTER_TOOLS = {"counter__read", "counter__add", "counter__reset"}

STUCK = f'command = {json.dumps(sys.executable)}\nargs = ["-c", "import sys; sys.stdin.buffer.read()"]\n'
"""A connector that reads its input and never answers (not even `initialize`), until its input ends."""


class GatedCounter(Counter):
    """The counter source, starting only when `gate` is set: until then it is `starting`, with no actions."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()

    async def run(self, on_change: ChangeFn) -> None:
        await self.gate.wait()
        await super().run(on_change)


@asynccontextmanager
async def early_bastion(tmp_path: Path, counter: Counter, *, startup_wait: float) -> AsyncIterator[Gateway]:
    """A gateway running as `bastion serve` runs it: yielded at once, while `counter` starts."""
    config = Config(
        directory=None,
        settings=Settings(server=ServerSettings(startup_wait_seconds=startup_wait)),
        connectors=[],
        policy=PolicyConfig.model_validate({"modes": {"counter:*": "allow"}}),
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    async with await open_ledger(tmp_path / "l.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, [counter])
        async with gateway.running(wait_for_sources=False):
            yield gateway


async def names(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


async def test_a_listing_during_the_start_up_wait_waits_for_a_source_still_starting(tmp_path: Path) -> None:
    counter = GatedCounter()
    async with early_bastion(tmp_path, counter, startup_wait=BOUND) as gateway:
        assert counter.status.state == "starting"  # the gateway did not wait for it
        async with Client(HostServer(gateway).server, cache=None) as client:
            listed: set[str] = set()

            async def list_tools() -> None:
                listed.update(await names(client))

            with anyio.fail_after(BOUND):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(list_tools)
                    await anyio.wait_all_tasks_blocked()
                    counter.gate.set()

            assert listed >= COUNTER_TOOLS


@pytest.mark.parametrize("mode", ERAS)
async def test_after_the_start_up_wait_a_host_gets_what_is_ready_and_hears_list_changed_when_a_source_comes(
    tmp_path: Path, mode: str
) -> None:
    counter = GatedCounter()
    async with (
        early_bastion(tmp_path, counter, startup_wait=0) as gateway,
        host_client(HostServer(gateway).server, mode) as (client, changes),
    ):
        with anyio.fail_after(BOUND):
            assert await names(client) == {"bastion__invocation"}
            early = await client.call_tool("counter__read", {})
            assert error_of(early)["class"] == "connector_unavailable"
            assert error_of(early)["retriable"] is True

            counter.gate.set()
            await changes.receive()
            assert await names(client) >= COUNTER_TOOLS
            assert not (await client.call_tool("counter__read", {})).is_error


async def test_serving_freezes_the_start_up_heap_and_again_once_every_source_has_started(tmp_path: Path) -> None:
    # `bastion serve` takes what start-up built out of the garbage collector's sight (otherwise each
    # collection of the oldest generation walks it all, ~50-100 ms under load); what a late source builds too.
    counter = GatedCounter()
    try:
        async with early_bastion(tmp_path, counter, startup_wait=0) as gateway:
            gc.unfreeze()
            freeze_startup_heap(gateway)
            at_start = gc.get_freeze_count()
            assert at_start > 0
            rebuilt = anyio.Event()

            async def catalog_changed() -> None:  # told after the freeze's own listener
                rebuilt.set()

            gateway.on_catalog_changed(catalog_changed)
            built_since: list[list[int]] = [[] for _ in range(100)]  # tracked objects made after the first freeze
            counter.gate.set()
            with anyio.fail_after(BOUND):
                await rebuilt.wait()
            assert counter.status.state == "ready"
            assert gc.get_freeze_count() >= at_start + len(built_since)
    finally:
        gc.unfreeze()


# -- end to end ------------------------------------------------------------------------------------------


async def wait_for(client: Client, changes: MemoryObjectReceiveStream[None], wanted: set[str]) -> None:
    """List until `wanted` is in the catalog, waiting for a list_changed between tries."""
    while not wanted <= await names(client):
        await changes.receive()


async def test_over_stdio_a_host_is_served_at_once_beside_a_connector_that_never_answers(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "config",
        notes_file=tmp_path / "notes.json",
        time_server=False,
        extra_connectors={"stuck": STUCK},
        list_timeout=LIST_TIMEOUT,
        startup_wait=None,
    )
    argv = bastion_command("serve", "--config", str(config))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=bastion_env(tmp_path / "home"))
    with anyio.fail_after(BOUND):
        async with host_client(params, "legacy") as (client, changes):
            await wait_for(client, changes, NOTES_TOOLS)
            assert not (await client.call_tool("notes__list_notes", {})).is_error


async def test_over_http_bastion_serves_at_once_beside_a_connector_that_never_answers(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "config",
        notes_file=tmp_path / "notes.json",
        time_server=False,
        extra_connectors={"stuck": STUCK},
        list_timeout=LIST_TIMEOUT,
        startup_wait=None,
    )
    argv = bastion_command("serve", "--transport", "http", "--port", "0", "--config", str(config))
    async with served(argv, env=bastion_env(tmp_path / "home"), timeout=BOUND) as bastion:
        banner = bastion.stderr[: next(i for i, line in enumerate(bastion.stderr) if "listening on" in line)]
        assert any("stuck" in line for line in banner)  # named as still starting
        async with httpx2.AsyncClient() as http:
            health = (await http.get(f"{bastion.base_url}/healthz")).json()
        assert health["status"] == "degraded"
        assert {s["id"]: s["state"] for s in health["sources"]}["stuck"] == "starting"
        with anyio.fail_after(BOUND):
            async with host_client(bastion.mcp_url, "auto") as (client, changes):
                await wait_for(client, changes, NOTES_TOOLS)


@pytest.mark.parametrize("mode", ERAS)
async def test_a_connector_that_comes_up_later_is_announced_to_a_connected_host(tmp_path: Path, mode: str) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    late = (
        f'command = {json.dumps(sys.executable)}\nargs = ["-m", "tests.gated_server", {json.dumps(str(gate))}]\n'
        f"cwd = {json.dumps(str(ROOT))}\n"
        f"env = {{ BASTION_NOTES_FILE = {json.dumps(str(tmp_path / 'late.json'))} }}\n"
    )
    config = write_config(
        tmp_path / "config",
        notes_file=tmp_path / "notes.json",
        time_server=False,
        extra_connectors={"late": late},
        list_timeout=LIST_TIMEOUT,
        startup_wait=0,
    )
    late_tools = {name.replace("notes__", "late__") for name in NOTES_TOOLS}
    argv = bastion_command("serve", "--config", str(config))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=bastion_env(tmp_path / "home"))
    with anyio.fail_after(BOUND):
        async with host_client(params, mode) as (client, changes):
            assert not late_tools & await names(client)
            # Both ends at once: never blocks, and the connector's open for reading returns from now on.
            opened = os.open(gate, os.O_RDWR)
            try:
                await wait_for(client, changes, late_tools)
            finally:
                os.close(opened)
            assert not (await client.call_tool("late__list_notes", {})).is_error
