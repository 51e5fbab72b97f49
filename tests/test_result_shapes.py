"""A tool result reaches its host in the shape of the host's protocol version, whatever era its downstream speaks
(`bastion.actions.shaped_result`); one the host cannot receive is withheld, said and recorded, never sent broken.

The common pairing: the official TypeScript filesystem server from npm (2025-11-25, stdio) behind Bastion, and the
SDK's client in front of it in its default mode (2026-07-28), over stdio and streamable HTTP, express lane on.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import Client, StdioServerParameters
from mcp_types import methods
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from bastion.actions import Unshapeable, WireResult, shaped_result
from tests.processes import bastion_command, bastion_env, bastion_http
from tests.test_express import Host, stdio_bastion
from tests.tools import FILESYSTEM_PACKAGE, NODE_BIN, TOOLS, ensure_tools

pytestmark = pytest.mark.anyio

LEGACY_VERSIONS = [version for version in KNOWN_PROTOCOL_VERSIONS if version not in MODERN_PROTOCOL_VERSIONS]
TEXT = {"type": "text", "text": "hello"}


# -- the shaping function


@pytest.mark.parametrize("version", KNOWN_PROTOCOL_VERSIONS)
@pytest.mark.parametrize("resulted", [None, "complete"], ids=["2025-era result", "2026-07-28 result"])
def test_a_result_of_either_era_is_shaped_for_every_protocol_version(version: str, resulted: str | None) -> None:
    result: dict[str, Any] = {"content": [TEXT], "structuredContent": {"content": "hello"}, "isError": False}
    if resulted is not None:
        result["resultType"] = resulted
    shaped = shaped_result(result, version)
    methods.validate_server_result("tools/call", version, shaped)
    assert shaped.get("resultType") == ("complete" if version in MODERN_PROTOCOL_VERSIONS else None)
    assert (shaped["content"], shaped["structuredContent"]) == ([TEXT], {"content": "hello"})


@given(
    structured=st.one_of(
        st.lists(st.integers(), max_size=3),
        st.text(max_size=5),
        st.integers(),
        st.booleans(),
        st.floats(allow_nan=False, allow_infinity=False),
    )
)
def test_structured_content_that_is_no_object_cannot_reach_a_2025_era_host(structured: Any) -> None:
    result = {"content": [TEXT], "structuredContent": structured, "resultType": "complete"}
    assert shaped_result(result, "2026-07-28")["structuredContent"] == structured
    for version in LEGACY_VERSIONS:
        with pytest.raises(Unshapeable, match="structuredContent"):
            shaped_result(result, version)


@pytest.mark.parametrize(
    "result",
    [
        {"content": [{"type": "no-such-content"}]},
        {"content": "hello"},
        {"resultType": "input_required", "inputRequests": {}},
        {},
    ],
)
def test_what_is_no_tool_result_is_never_passed_off_as_one(result: dict[str, Any]) -> None:
    for version in KNOWN_PROTOCOL_VERSIONS:
        with pytest.raises(Unshapeable):
            shaped_result(result, version)


def test_a_result_checked_at_the_hosts_version_is_not_shaped_again() -> None:
    checked = WireResult({"content": [TEXT], "resultType": "complete"}, checked_at="2026-07-28")
    assert checked.for_host("2026-07-28") is checked
    assert checked.for_host("2025-11-25") == WireResult({"content": [TEXT]}, checked_at="2025-11-25")


# -- a TypeScript server from npm behind Bastion, a 2026-07-28 host in front


def _filesystem_connector(served: Path) -> str:
    script = TOOLS / "node_modules" / FILESYSTEM_PACKAGE / "dist" / "index.js"
    node = json.dumps(str(NODE_BIN / "node"))
    return f"command = {node}\nargs = [{json.dumps(str(script))}, {json.dumps(str(served))}]\n"


def _config(tmp_path: Path, *, express: bool) -> Path:
    directory = tmp_path / "config"
    (directory / "connectors").mkdir(parents=True)
    (directory / "policies").mkdir()
    (directory / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///state/ledger.db"\nstartup_wait_seconds = 30\n'
        f"express_lane = {json.dumps(express)}\n[limits]\nlist_timeout_seconds = 30\n"
    )
    (directory / "connectors" / "fs.toml").write_text(_filesystem_connector(tmp_path / "served"))
    (directory / "policies" / "default.toml").write_text('[modes]\n"fs:*" = "allow"\n')
    return directory


@asynccontextmanager
async def _bastion_client(tmp_path: Path, transport: str, *, express: bool) -> AsyncIterator[Client]:
    """An SDK client in its default mode, connected to a Bastion process in front of the filesystem server."""
    config = _config(tmp_path, express=express)
    env = bastion_env(tmp_path / "home")
    if transport == "stdio":
        argv = bastion_command("serve", "--config", str(config))
        async with Client(StdioServerParameters(command=argv[0], args=argv[1:], env=env), cache=None) as client:
            yield client
        return
    async with bastion_http(["--config", str(config)], env=env) as bastion, Client(bastion.mcp_url, cache=None) as c:
        yield c


def _direct() -> Client:
    script = TOOLS / "node_modules" / FILESYSTEM_PACKAGE / "dist" / "index.js"
    return Client(StdioServerParameters(command=str(NODE_BIN / "node"), args=[str(script), "served"]), cache=None)


def _answer(result: types.CallToolResult) -> dict[str, Any]:
    """What a host reads of a result: its content and structured content (`_meta` aside)."""
    return result.model_dump(by_alias=True, mode="json", exclude_none=True, include={"content", "structured_content"})


@pytest.mark.parametrize("express", [True, False], ids=["express", "sdk"])
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_2026_host_gets_the_typescript_filesystem_servers_results_as_a_direct_call_does(
    tmp_path: Path, transport: str, express: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_tools()
    served = tmp_path / "served"
    served.mkdir()
    (served / "a.txt").write_text("hello from the filesystem server")
    monkeypatch.chdir(tmp_path)  # the direct server serves `served`, relative to here
    calls = [("read_text_file", {"path": str(served / "a.txt")}), ("list_directory", {"path": str(served)})]
    with anyio.fail_after(90):
        async with _direct() as direct:
            expected = [_answer(await direct.call_tool(name, arguments)) for name, arguments in calls]
        async with _bastion_client(tmp_path, transport, express=express) as client:
            assert client.protocol_version == "2026-07-28"
            got = [_answer(await client.call_tool(f"fs__{name}", arguments)) for name, arguments in calls]
    assert got == expected
    assert "hello from the filesystem server" in json.dumps(got[0])
    with sqlite3.connect(tmp_path / "config" / "state" / "ledger.db") as db:
        statuses = [row[0] for row in db.execute("SELECT status FROM invocations")]
    assert statuses == ["completed", "completed"]


# -- a result the host cannot receive: withheld, said and recorded


@pytest.mark.parametrize("express", [True, False], ids=["express", "sdk"])
async def test_a_result_a_2025_host_cannot_receive_is_refused_saying_the_downstream_acted_and_recorded_failed(
    tmp_path: Path, express: bool
) -> None:
    """The wire fixture (2026-07-28) answers `listed` with an array as structured content, which 2025-era hosts
    cannot receive: the host gets `upstream_error` saying why, never a bare JSON-RPC error, and the ledger says
    `failed` with the same reason, never `completed`."""
    async with stdio_bastion(tmp_path, express=express, mode="legacy", host=Host(), answers=False) as run:
        with anyio.fail_after(30):
            result = await run.client.call_tool("fx__listed", {})
        (invocation,) = await run.ledger.invocations.list(limit=10)
    assert result.is_error
    assert isinstance(result.structured_content, dict)
    error = result.structured_content["error"]
    assert error["class"] == "upstream_error"
    assert "the downstream acted" in error["message"] and "structuredContent" in error["message"]
    assert (invocation.status, invocation.error_class) == ("failed", "upstream_error")
    assert invocation.error_message == error["message"]
    assert invocation.result is not None and invocation.result["structuredContent"] == [1, 2, 3]
