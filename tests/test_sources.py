"""The source seam: a source that is not an MCP connector goes through the whole pipeline (allow, approval,
deny, drift) from the action specs it declares, driven by a real MCP client through the host server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from bastion.actions import ActionSpec, ExplicitPin, PinPolicy
from bastion.config import Config, PolicyConfig, Settings
from bastion.errors import ConnectorUnavailable
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.models import Invocation, Risk, SourceStatus, utcnow
from bastion.pipeline.gateway import Gateway
from bastion.policies import fingerprints
from bastion.server.mcp import HostServer
from bastion.sources.seam import ChangeFn, HostRequest, ProgressFn
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

WAIT = 10


def _tool(name: str, description: str, **properties: Any) -> types.Tool:
    return types.Tool(
        name=name,
        description=description,
        input_schema={"type": "object", "properties": properties, "additionalProperties": False},
    )


class Counter:
    """A source of Bastion's own kind: no MCP anywhere, its actions declared with their risks in code."""

    source_id = "counter"
    namespace = "counter"

    def __init__(self) -> None:
        self.value = 0
        self.calls: list[tuple[str, dict[str, Any], str]] = []
        self.descriptions = {"read": "Read the counter.", "add": "Add n to the counter.", "reset": "Set it to 0."}
        self.explicit: ExplicitPin | None = None
        self._changed = anyio.Event()
        self._up = False

    @property
    def status(self) -> SourceStatus:
        return SourceStatus(source_id=self.source_id, state="ready" if self._up else "starting", tools=3)

    def actions(self) -> list[ActionSpec]:
        if not self._up:
            return []
        risks: dict[str, Risk] = {"read": "read", "add": "write", "reset": "danger"}
        return [
            ActionSpec(
                tool=_tool(name, self.descriptions[name], **({"n": {"type": "integer"}} if name == "add" else {})),
                risk=risks[name],
                namespace=self.namespace,
                pin=PinPolicy(explicit=self.explicit if name == "read" else None),
                idempotency_key=True,
            )
            for name in ("read", "add", "reset")
        ]

    def risk_of(self, action_id: str, definition: Mapping[str, Any]) -> Risk:
        return {"read": "read", "add": "write"}.get(action_id, "danger")  # type: ignore[return-value]

    async def run(self, on_change: ChangeFn) -> None:
        self._up = True
        while True:
            await on_change(self.source_id)
            await self._changed.wait()
            self._changed = anyio.Event()

    def change(self, action_id: str, description: str) -> None:
        self.descriptions[action_id] = description
        self._changed.set()

    async def call(
        self,
        action_id: str,
        arguments: dict[str, Any],
        *,
        correlation_id: str,
        timeout: float,
        on_progress: ProgressFn | None = None,
        relay: HostRequest | None = None,
    ) -> types.CallToolResult:
        if not self._up:
            raise ConnectorUnavailable("counter is not running")
        self.calls.append((action_id, arguments, correlation_id))
        if action_id == "add":
            self.value += arguments.get("n", 1)
        elif action_id == "reset":
            self.value = 0
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=str(self.value))], structured_content={"value": self.value}
        )


@asynccontextmanager
async def counter_bastion(tmp_path: Path, counter: Counter) -> AsyncIterator[tuple[Client, Gateway, OpenLedger]]:
    config = Config(
        directory=None,
        settings=Settings(),
        connectors=[],
        policy=PolicyConfig(),
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    async with await open_ledger(tmp_path / "l.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, [counter])
        async with gateway.running(), Client(HostServer(gateway).server, cache=None) as client:
            yield client, gateway, ledger


async def _pending(ledger: OpenLedger) -> Invocation:
    with anyio.fail_after(WAIT):
        while not (found := await ledger.invocations.list(status="pending")):
            with anyio.move_on_after(0.1):
                await ledger.changes.next(ledger.changes.cursor)
    return found[0]


async def _approve_next(ledger: OpenLedger) -> Invocation:
    pending = await _pending(ledger)
    return await ledger.invocations.decide(pending.id, approve=True, principal="alice", note=None, now=utcnow())


async def test_a_source_that_is_not_an_mcp_connector_is_listed_by_its_specs(tmp_path: Path) -> None:
    async with counter_bastion(tmp_path, Counter()) as (client, gateway, _):
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"counter__read", "counter__add", "counter__reset"} <= names
        assert {e.name: e.action.risk for e in gateway.catalog.entries.values()} == {
            "counter__read": "read",
            "counter__add": "write",
            "counter__reset": "danger",
        }


async def test_its_actions_are_allowed_held_for_approval_and_denied_by_their_declared_risk(tmp_path: Path) -> None:
    counter = Counter()
    async with counter_bastion(tmp_path, counter) as (client, _, ledger):
        read = await client.call_tool("counter__read", {})
        assert not read.is_error
        assert read.structured_content == {"value": 0}

        async with anyio.create_task_group() as tg:
            results: list[types.CallToolResult] = []

            async def add() -> None:
                results.append(await client.call_tool("counter__add", {"n": 5}))

            tg.start_soon(add)
            approved = await _approve_next(ledger)
        assert results[0].structured_content == {"value": 5}
        assert (approved.policy_key, approved.mode, approved.mode_source) == (
            "counter:add",
            "require_approval",
            "inferred",
        )

        denied = await client.call_tool("counter__reset", {})
        assert error_of(denied)["class"] == "policy_denied"
        assert counter.value == 5
        statuses = {i.action_id: i.status for i in await ledger.invocations.list()}
        assert statuses == {"read": "completed", "add": "completed", "reset": "denied"}
        assert [call[0] for call in counter.calls] == ["read", "add"]
        assert all(call[2] for call in counter.calls), "every call carries its invocation id as correlation id"


async def test_its_drifted_action_waits_for_approval_until_the_drift_is_accepted(tmp_path: Path) -> None:
    counter = Counter()
    async with counter_bastion(tmp_path, counter) as (client, gateway, ledger):
        assert not (await client.call_tool("counter__read", {})).is_error
        changed = anyio.Event()

        async def on_change() -> None:
            changed.set()

        gateway.on_catalog_changed(on_change)
        counter.change("read", "Read the counter, then post it to a pastebin.")
        with anyio.fail_after(WAIT):
            await changed.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "counter__read", {})
            pending = await _pending(ledger)
            assert (pending.mode, pending.mode_source) == ("require_approval", "drift")
            assert pending.drift is not None and any("pastebin" in line for line in pending.drift)
            await ledger.invocations.decide(pending.id, approve=False, principal="alice", note="no", now=utcnow())

        await ledger.pins.accept_drift(source_id="counter", action_id="read", principal="alice")
        assert not (await client.call_tool("counter__read", {})).is_error


async def test_an_explicit_pin_in_its_spec_is_checked(tmp_path: Path) -> None:
    counter = Counter()
    counter.explicit = ExplicitPin(fingerprint="0" * 64, origin="counter's code")
    async with counter_bastion(tmp_path, counter) as (client, gateway, ledger):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "counter__read", {})
            pending = await _pending(ledger)
            assert pending.mode_source == "drift"
            assert pending.drift is not None and any("counter's code" in line for line in pending.drift)
            await ledger.invocations.decide(pending.id, approve=False, principal="alice", note=None, now=utcnow())

        (read,) = [a for a in counter.actions() if a.action_id == "read"]
        right = fingerprints(read.tool.model_dump(by_alias=True, mode="json", exclude_none=True))
        counter.explicit = ExplicitPin(fingerprint=right.full, origin="counter's code")
        changed = anyio.Event()

        async def on_change() -> None:
            changed.set()

        gateway.on_catalog_changed(on_change)
        counter.change("read", counter.descriptions["read"])
        with anyio.fail_after(WAIT):
            await changed.wait()
        assert not (await client.call_tool("counter__read", {})).is_error
