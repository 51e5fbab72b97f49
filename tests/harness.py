"""An in-process Bastion for pipeline tests: a real SDK client, front door, gateway and SQLite ledger,
with an in-process downstream MCP server (tests/downstream.py) behind a real McpConnector."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.shared.dispatcher import ProgressFnT

from bastion.config import (
    ApprovalSettings,
    Config,
    ConnectorConfig,
    LimitSettings,
    PolicyConfig,
    Profile,
    Settings,
    ToolOverride,
)
from bastion.connectors import McpConnector
from bastion.gateway import Gateway
from bastion.ledger import Redactor, SqliteLedger
from bastion.models import Invocation
from bastion.server.mcp import FrontDoor
from tests.downstream import FixtureServer


@dataclass
class Harness:
    client: Client
    fixture: FixtureServer
    ledger: SqliteLedger
    gateway: Gateway

    async def call(
        self, name: str, arguments: dict[str, Any] | None = None, *, progress: ProgressFnT | None = None
    ) -> types.CallToolResult:
        return await self.client.call_tool(name, arguments or {}, progress_callback=progress)

    async def only_invocation(self) -> Invocation:
        (invocation,) = await self.ledger.list()
        return invocation


@asynccontextmanager
async def harness(
    tmp_path: Path,
    *,
    modes: dict[str, str] | None = None,
    profiles: dict[str, Profile] | None = None,
    profile: str | None = None,
    disabled: list[str] | None = None,
    overrides: dict[str, ToolOverride] | None = None,
    call_timeout: float = 30,
    approvals: ApprovalSettings | None = None,
    per_minute: int = 60,
    pin_new_tools: str = "trust",
    fixture: FixtureServer | None = None,
    mode: str = "auto",
) -> AsyncIterator[Harness]:
    """`mode="legacy"` runs the client over JSON-RPC streams; "auto" uses the SDK's direct in-process
    path, which carries no progress token in the request (so Bastion sends no heartbeats there)."""
    fixture = fixture or FixtureServer()
    connectors = [
        ConnectorConfig.model_validate(
            {"id": "fx", "command": "unused", "tools": overrides or {}, "pin_new_tools": pin_new_tools}
        ),
        ConnectorConfig(id="off", command="unused"),
    ]
    config = Config(
        directory=None,
        settings=Settings(
            limits=LimitSettings(call_timeout_seconds=call_timeout, invocations_per_minute=per_minute),
            approvals=approvals or ApprovalSettings(),
        ),
        connectors=connectors,
        policy=PolicyConfig.model_validate(
            {"modes": modes or {}, "profiles": profiles or {}, "sources": {"disabled": disabled or []}}
        ),
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
    )
    served = fixture
    sources = [McpConnector(connectors[0], target=lambda: served.server)]
    async with await SqliteLedger.open(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, sources)
        async with gateway.running():
            front = FrontDoor(gateway, profile=profile)
            async with Client(front.server, cache=None, mode=mode) as client:
                yield Harness(client, fixture, ledger, gateway)
