"""Provider sources driven over `httpx2.MockTransport`: a scripted API that records every request it gets.

`ScriptedApi` answers each request with the next of its answers (a response, or an exception raised as the
transport would); `running(source)` runs a provider source as the gateway does (its `run()` in a task group)
and yields it once ready. Tokens here are canaries: plain text no redaction pattern knows, so finding one
anywhere proves a leak rather than a redaction.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio
import httpx2
import mcp_types as types

from bastion.actions import Found
from bastion.config import ProviderConfig
from bastion.models import Invocation, utcnow
from bastion.sources.providers import ProviderSource, provider_source

CANARY = "canary-4f1d2c9e7b"
"""A provider token that no redaction pattern matches."""

MARKER_KEY = bytes.fromhex("6d61726b6572206b6579206f66207468652074657374732c2033322062797465")
"""The marker key the providers of these tests mark what their calls make with (a gateway's is its ledger's)."""

Answer = httpx2.Response | Exception | Callable[[httpx2.Request], Awaitable[httpx2.Response]]


async def never(request: httpx2.Request) -> httpx2.Response:
    """An answer that does not come (the call's own deadline ends the wait)."""
    await anyio.Event().wait()  # nothing ever sets it
    raise AssertionError("unreachable")


def ok(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.Response(status, json=data, headers=headers)


@dataclass
class ScriptedApi:
    """A fake HTTP API: the answers in order (the last one repeats), and every request it got."""

    answers: list[Answer]
    requests: list[httpx2.Request] = field(default_factory=list)

    async def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx2.Response):
            return answer
        return await answer(request)

    @property
    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handle)

    @property
    def last(self) -> httpx2.Request:
        return self.requests[-1]


def body_of(request: httpx2.Request) -> Any:
    return json.loads(request.content)


def query_of(request: httpx2.Request) -> dict[str, str]:
    return dict(request.url.params)


def source(
    provider_id: str, api: ScriptedApi, *, token: str | None = CANARY, call_timeout: float = 30.0, **settings: Any
) -> ProviderSource:
    config = ProviderConfig.model_validate({"token": token, **settings})
    return provider_source(
        provider_id, config, call_timeout=call_timeout, marker_key=MARKER_KEY, transport=api.transport
    )


@asynccontextmanager
async def running(provider: ProviderSource) -> AsyncIterator[ProviderSource]:
    """The provider running as the gateway runs it, once it has announced its actions (or that it cannot)."""
    announced = anyio.Event()

    async def on_change(source_id: str) -> None:
        announced.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(provider.run, on_change)
        with anyio.fail_after(5):
            await announced.wait()
        yield provider
        tg.cancel_scope.cancel()


async def call(
    provider: ProviderSource,
    action: str,
    arguments: dict[str, Any],
    *,
    correlation_id: str = "inv-1",
    timeout: float = 5,
) -> types.CallToolResult:
    return await provider.call(action, arguments, correlation_id=correlation_id, timeout=timeout)


async def looked_up(
    provider: ProviderSource, action: str, arguments: dict[str, Any], *, invocation_id: str = "inv-1"
) -> Found | None:
    """What the provider's look-up finds of a call of `action` with `arguments`, made a minute ago."""
    at = utcnow() - timedelta(minutes=1)
    invocation = Invocation(
        id=invocation_id,
        status="unknown",
        policy_key=f"{provider.source_id}:{action}",
        tool=f"{provider.namespace}__{action}",
        source_id=provider.source_id,
        action_id=action,
        risk="write",
        mode="allow",
        mode_source="policy",
        session_id="s",
        args=arguments,
        created_at=at,
        updated_at=at,
    )
    return await provider.look_up(action, invocation)


def dumped(*values: Any) -> str:
    """Everything given, as one text to search for a leak."""
    return " ".join(
        json.dumps(v.model_dump(mode="json") if hasattr(v, "model_dump") else v, default=str) for v in values
    )
