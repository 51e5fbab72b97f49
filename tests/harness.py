"""An in-process Bastion for pipeline tests: a real SDK client, host server, gateway and SQLite ledger,
with an in-process downstream MCP server (tests/downstream.py) behind a real McpConnector."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.client.session import ElicitationFnT, LoggingFnT, MessageHandlerFnT, SamplingFnT
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
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.models import Invocation
from bastion.pipeline.gateway import Gateway
from bastion.server.mcp import HostServer
from bastion.sources.mcp import McpConnector
from tests.downstream import FixtureServer, StreamTarget


@dataclass
class Harness:
    client: Client
    fixture: FixtureServer
    ledger: OpenLedger
    gateway: Gateway
    target: Any
    """How Bastion reaches the fixture: `StreamTarget` (kill, revive) for the "streams" downstreams."""

    async def call(
        self, name: str, arguments: dict[str, Any] | None = None, *, progress: ProgressFnT | None = None
    ) -> types.CallToolResult:
        return await self.client.call_tool(name, arguments or {}, progress_callback=progress)

    async def only_invocation(self) -> Invocation:
        (invocation,) = await self.ledger.invocations.list()
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
    principal: str | None = None,
    elicitation: ElicitationFnT | None = None,
    sampling: SamplingFnT | None = None,
    logging: LoggingFnT | None = None,
    log_level: types.LoggingLevel | None = None,
    messages: MessageHandlerFnT | None = None,
    downstream: str = "direct",
    namespace: str | None = None,
    drift_listing: str | None = None,
) -> AsyncIterator[Harness]:
    """`mode="legacy"` runs the client over JSON-RPC streams; "auto" uses the SDK's direct in-process
    path, which carries no progress token in the request (so Bastion sends no heartbeats there).

    `downstream` is how Bastion reaches the fixture: "direct" (in-process, 2026-07-28), "streams"
    (memory streams, 2026-07-28) or "legacy-streams" (memory streams, 2025-11-25 handshake).
    `sampling`, `logging`, `log_level` and `messages` are the host client's own callbacks."""
    fixture = fixture or FixtureServer()
    fx: dict[str, Any] = {"id": "fx", "command": "unused", "tools": overrides or {}, "pin_new_tools": pin_new_tools}
    if namespace is not None:
        fx["namespace"] = namespace
    if drift_listing is not None:
        fx["drift_listing"] = drift_listing  # the connector file's override
    connectors = [
        ConnectorConfig.model_validate(fx),
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
    target: Any = (
        (lambda: served.server)
        if downstream == "direct"
        else StreamTarget(served.server, legacy_only=downstream == "legacy-streams")
    )
    # "off" is configured but never reachable: a source only for tests that disable it.
    sources = [McpConnector(connectors[0], target=target)]
    if "off" in (disabled or []):
        sources.append(McpConnector(connectors[1]))
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, sources)
        async with gateway.running():
            front = HostServer(gateway, profile=profile, principal=principal)
            client = Client(
                front.server,
                cache=None,
                mode=mode,
                elicitation_callback=elicitation,
                sampling_callback=sampling,
                logging_callback=logging,
                log_level=log_level,
                message_handler=messages,
            )
            async with client:
                yield Harness(client, fixture, ledger, gateway, target)
