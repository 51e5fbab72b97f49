"""Providers in the pipeline: what a host and the ledger see when a provider's API limits, fails or is unbound.

The provider runs in a real gateway behind the real host server, with a real MCP client and a real SQLite ledger;
only its HTTP API is scripted (`httpx2.MockTransport`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
from mcp import Client

from bastion.config import Config, PolicyConfig, ProviderConfig, Settings
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.pipeline.gateway import Gateway
from bastion.server.mcp import HostServer
from bastion.sources.providers import ProviderSource, provider_source
from tests.providers import CANARY, ScriptedApi, ok
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

LIST = ("github__list_issues", {"owner": "acme", "repo": "app"})


@asynccontextmanager
async def bastion(
    tmp_path: Path, *providers: ProviderSource, modes: dict[str, str] | None = None
) -> AsyncIterator[tuple[Client, OpenLedger]]:
    config = Config(
        directory=None,
        settings=Settings(),
        connectors=[],
        policy=PolicyConfig(modes=modes or {}),
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    async with await open_ledger(tmp_path / "l.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, list(providers))
        async with gateway.running(), Client(HostServer(gateway).server, cache=None) as client:
            yield client, ledger


def github(api: ScriptedApi, token: str | None = CANARY) -> ProviderSource:
    return provider_source("github", ProviderConfig.model_validate({"token": token}), transport=api.transport)


async def test_an_api_rate_limit_reaches_the_host_as_rate_limited_and_the_call_is_failed_not_unknown(
    tmp_path: Path,
) -> None:
    api = ScriptedApi([ok({"message": "slow down"}, 429, headers={"retry-after": "30"})])
    async with bastion(tmp_path, github(api)) as (client, ledger):
        result = await client.call_tool(*LIST)
        (invocation,) = await ledger.invocations.list()
    error = error_of(result)
    assert (error["class"], error["retriable"], error["retry_after"]) == ("rate_limited", True, 30)
    assert "30 s" in error["message"]
    assert (invocation.status, invocation.error_class) == ("failed", "rate_limited")


async def test_a_server_error_is_upstream_error_and_the_call_failed(tmp_path: Path) -> None:
    api = ScriptedApi([ok({"message": "boom"}, 502)])
    async with bastion(tmp_path, github(api)) as (client, ledger):
        result = await client.call_tool(*LIST)
        (invocation,) = await ledger.invocations.list()
    assert error_of(result)["class"] == "upstream_error"
    assert (invocation.status, invocation.error_class) == ("failed", "upstream_error")
    assert (invocation.risk, invocation.risk_source) == ("read", "declared")


async def test_a_write_whose_connection_drops_after_sending_is_unknown_outcome_and_recorded_unknown(
    tmp_path: Path,
) -> None:
    async def drop(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.RemoteProtocolError("peer closed", request=request)

    api = ScriptedApi([drop])
    async with bastion(tmp_path, github(api), modes={"github:close_issue": "allow"}) as (client, ledger):
        result = await client.call_tool("github__close_issue", {"owner": "acme", "repo": "app", "number": 1})
        (invocation,) = await ledger.invocations.list()
    assert error_of(result)["class"] == "unknown_outcome"
    assert (invocation.status, invocation.error_class) == ("unknown", "unknown_outcome")
    assert api.last.headers["idempotency-key"] == invocation.id


async def test_an_unbound_provider_s_tool_is_refused_with_binding_required_and_nothing_is_recorded(
    tmp_path: Path,
) -> None:
    api = ScriptedApi([ok([])])
    async with bastion(tmp_path, github(api, token=None)) as (client, ledger):
        tools = {tool.name for tool in (await client.list_tools()).tools}
        result = await client.call_tool(*LIST)
        recorded = await ledger.invocations.list()
    assert not any(name.startswith("github__") for name in tools)
    error = error_of(result)
    assert (error["class"], error["retriable"]) == ("binding_required", False)
    assert recorded == [] and api.requests == []
