"""A live Bastion for the approver surfaces' tests (inbox, approver MCP, events): a real gateway over an in-process
downstream (`fx`), a real SQLite ledger, a configuration directory on disk, served over real HTTP on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.config import Config, ConnectorConfig, PolicyConfig, Settings
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.models import Invocation, Role, utcnow
from bastion.pipeline.gateway import Gateway
from bastion.server.http import allowed_hosts_for, build_app
from bastion.server.mcp import HostServer
from bastion.sources.mcp import McpConnector
from tests.downstream import FixtureServer
from tests.test_api import WAIT, serving

OPERATOR_POLICY = """\
# The operator's own policy: Bastion never writes this file.
[modes]
"fx:echo" = "require_approval"  # even reads wait for a look
"""


@dataclass
class Bastion:
    url: str
    ledger: OpenLedger
    gateway: Gateway
    fixture: FixtureServer
    directory: Path

    async def token(self, name: str, role: Role) -> dict[str, str]:
        secret = await self.ledger.tokens.create_token(name, role=role, profile=None, now=utcnow())
        return {"Authorization": f"Bearer {secret}"}

    @asynccontextmanager
    async def client(
        self, headers: dict[str, str], path: str = "/mcp", *, era: Literal["legacy", "2026-07-28"] = "legacy"
    ) -> AsyncIterator[Client]:
        """An MCP client of `path`: a 2025-era host with a session (`legacy`), or a 2026-07-28 one, which has none."""
        async with (
            httpx2.AsyncClient(headers=headers, timeout=WAIT) as http,
            Client(streamable_http_client(f"{self.url}{path}", http_client=http), mode=era, cache=None) as c,
        ):
            yield c

    async def pending(self, count: int) -> list[Invocation]:
        """Wait until `count` calls are pending; they, oldest first."""
        with anyio.fail_after(WAIT):
            while True:
                cursor = self.ledger.changes.cursor
                found = await self.ledger.invocations.list(status="pending")
                if len(found) >= count:
                    return sorted(found, key=lambda i: i.created_at)
                await self.ledger.changes.next(cursor)

    async def wait_until(self, done: Callable[[], Awaitable[bool]]) -> None:
        """Wait, re-checking on every change of the ledger or the catalog, until `done()`."""
        changed = anyio.Event()

        async def on_change() -> None:
            changed.set()

        self.gateway.on_catalog_changed(on_change)
        with anyio.fail_after(WAIT):
            while not await done():
                with anyio.move_on_after(0.5):
                    await changed.wait()
                changed = anyio.Event()


def config_for(
    directory: Path | None,
    modes: dict[str, str],
    rules: list[dict[str, str]] | None = None,
    approvers: dict[str, int] | None = None,
    settings: Settings | None = None,
) -> Config:
    """`directory` None: the embedded default's way, a configuration of no directory (its ledger in `tmp_path`)."""
    return Config(
        directory=directory,
        settings=settings or Settings(),
        connectors=[ConnectorConfig(id="fx", command="unused")],
        policy=PolicyConfig.model_validate({"modes": modes, "rules": rules or [], "approvers": approvers or {}}),
        ledger_url=f"sqlite:///{directory}/ledger.db",
    )


@asynccontextmanager
async def live(
    tmp_path: Path,
    modes: dict[str, str] | None = None,
    *,
    rules: list[dict[str, str]] | None = None,
    embedded: bool = False,
    approvers: dict[str, int] | None = None,
    settings: Settings | None = None,
) -> AsyncIterator[Bastion]:
    """A running Bastion whose configuration directory holds the operator's policy file. Two of them on one
    `tmp_path` share the directory and the ledger (two instances). `embedded`: it runs as on the embedded default,
    with no configuration directory (where approvals are not offered "always")."""
    directory = tmp_path / "config"
    (directory / "policies").mkdir(parents=True, exist_ok=True)
    (directory / "policies" / "default.toml").write_text(OPERATOR_POLICY)
    fixture = FixtureServer()
    config = config_for(
        None if embedded else directory,
        {"fx:echo": "require_approval"} if modes is None else modes,
        rules,
        approvers,
        settings,
    )
    async with await open_ledger(directory / "ledger.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, [McpConnector(config.connectors[0], target=lambda: fixture.server)])
        app = build_app(HostServer(gateway), allowed_hosts=allowed_hosts_for("127.0.0.1"))
        async with gateway.running(), serving(app) as url:
            yield Bastion(url, ledger, gateway, fixture, directory)


def structured(result: types.CallToolResult) -> Any:
    assert result.structured_content is not None, result.content
    return result.structured_content
