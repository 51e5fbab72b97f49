"""Relay end to end: a real Bastion process (streamable HTTP) in front of a real downstream subprocess
(`python -m tests.downstream`, a ContentFixture over stdio), driven by the SDK client in both eras and
by a raw 2025-era host that shows which stream each message arrives on."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client

from tests.processes import bastion_env, bastion_http, write_config
from tests.test_relay import HOSTS, README, WAIT, Logs, Model, User, text_of

pytestmark = pytest.mark.anyio

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def relay_config(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Bastion's configuration with `python -m tests.downstream` (a ContentFixture over stdio) as `fx`."""
    notes = tmp_path / "notes.json"
    notes.write_text("{}")
    fx = (
        f"command = {json.dumps(sys.executable)}\n"
        'args = ["-m", "tests.downstream"]\n'
        f"cwd = {json.dumps(str(REPO_ROOT))}\n"
    )
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False, extra_connectors={"fx": fx})
    return config, bastion_env(tmp_path / "home")


@pytest.mark.parametrize("mode", HOSTS)
async def test_a_bastion_process_relays_a_downstream_process_over_http(
    relay_config: tuple[Path, dict[str, str]], mode: str
) -> None:
    config, env = relay_config
    model, user, logs = Model(), User(), Logs()
    async with bastion_http(["--config", str(config)], env=env) as bastion:
        client = Client(
            bastion.mcp_url,
            mode=mode,
            cache=None,
            sampling_callback=model,
            elicitation_callback=user,
            logging_callback=logs,
            log_level="info" if mode == "auto" else None,
        )
        async with client:
            assert README in {r.uri for r in (await client.list_resources()).resources}
            (contents,) = (await client.read_resource(README)).contents
            assert isinstance(contents, types.TextResourceContents) and contents.text == "read me"
            got = await client.get_prompt("fx__greet", {"who": "bob"})
            assert isinstance(got.messages[0].content, types.TextContent)
            assert "bob" in got.messages[0].content.text
            names = await client.complete(types.PromptReference(name="fx__greet"), {"name": "who", "value": "b"})
            assert names.completion.values == ["bob"]
            assert text_of(await client.call_tool("fx__chatty", {})) == "chatted"
            assert logs.levels == ["info", "warning"]
            assert text_of(await client.call_tool("fx__sample", {"prompt": "a poem, please"})) == "sampled: a poem"
            assert model.prompts == ["a poem, please"]
            assert text_of(await client.call_tool("fx__ask", {})).startswith("elicited: accept")


async def test_sampling_and_log_messages_travel_inside_the_originating_http_request(
    relay_config: tuple[Path, dict[str, str]],
) -> None:
    """A 2025-era host over streamable HTTP: what the downstream asks and logs during a call arrives on
    that call's own response stream (not the standalone one), before its result."""
    config, env = relay_config
    async with bastion_http(["--config", str(config)], env=env) as bastion, httpx2.AsyncClient(timeout=30) as http:
        wire = RawHost(http, bastion.mcp_url)
        await wire.initialize()
        await wire.request("logging/setLevel", {"level": "info"})
        seen = await wire.request("tools/call", {"name": "fx__chatty", "arguments": {}})
        assert [m["params"]["level"] for m in seen if m.get("method") == "notifications/message"] == ["info", "warning"]
        seen = await wire.request("tools/call", {"name": "fx__sample", "arguments": {"prompt": "hi"}})
        (asked,) = [m for m in seen if m.get("method") == "sampling/createMessage"]
        assert asked["params"]["messages"][0]["content"]["text"] == "hi"
        assert seen[-1]["result"]["content"][0]["text"] == "sampled: raw"


class RawHost:
    """A 2025-11-25 host speaking raw streamable HTTP, which shows on which stream each message comes."""

    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        self.next_id = 0

    async def initialize(self) -> None:
        params = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"sampling": {}},
            "clientInfo": {"name": "raw", "version": "1"},
        }
        await self.request("initialize", params)
        reply = await self.http.post(
            self.url, headers=self.headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
        )
        assert reply.status_code == 202

    async def request(self, method: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Send one request; answer the sampling requests that arrive on its stream; return every message
        of that stream, its result last."""
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        seen: list[dict[str, Any]] = []
        with anyio.fail_after(WAIT * 3):
            async with self.http.stream("POST", self.url, headers=self.headers, json=body) as response:
                assert response.status_code == 200, await response.aread()
                if "mcp-session-id" in response.headers:
                    self.headers |= {
                        "mcp-session-id": response.headers["mcp-session-id"],
                        "mcp-protocol-version": "2025-11-25",
                    }
                async for line in response.aiter_lines():
                    if not line.startswith("data:") or not line[5:].strip():
                        continue
                    message = json.loads(line[5:])
                    seen.append(message)
                    if message.get("method") == "sampling/createMessage":
                        await self._answer_sampling(message["id"])
                    if message.get("id") == self.next_id and ("result" in message or "error" in message):
                        return seen
        raise AssertionError(f"the stream of {method} ended without its result: {seen}")

    async def _answer_sampling(self, request_id: Any) -> None:
        result = {"role": "assistant", "content": {"type": "text", "text": "raw"}, "model": "raw-model"}
        answer = {"jsonrpc": "2.0", "id": request_id, "result": result}
        reply = await self.http.post(self.url, headers=self.headers, json=answer)
        assert reply.status_code == 202
