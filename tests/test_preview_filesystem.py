"""Previews of file writes, end to end: Bastion in front of the real npm filesystem server, a real MCP client calls
`write_file` on an existing file, and the held card in the inbox (in a real headless Chromium) shows the diff from the
current file, as the approver MCP does; the approval's signature covers the preview's digest, and verify holds.
A new file shows all added, and `edit_file` is previewed by the server's own dry run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from playwright.async_api import expect

from bastion.config import Config, ConnectorConfig, PolicyConfig, Settings
from bastion.errors import ChangesLost
from bastion.ledger import Redactor, open_ledger
from bastion.ledger.anchors import trusted_keys
from bastion.ledger.decisions import preview_digest
from bastion.ledger.verify import verify_signed
from bastion.models import Invocation
from bastion.pipeline.gateway import Gateway
from bastion.server.http import allowed_hosts_for, build_app
from bastion.server.mcp import HostServer
from bastion.sources.mcp import McpConnector
from tests.approvers import Bastion, structured
from tests.downstream import FixtureServer
from tests.test_api import WAIT, serving
from tests.test_inbox_browser import chromium, logged_in, photograph
from tests.tools import FILESYSTEM_PACKAGE, NODE_BIN, TOOLS, ensure_tools

pytestmark = pytest.mark.anyio

BEFORE = "line one\nline two\nline three\n"
AFTER = "line one\nline 2, rewritten\nline three\nline four\n"


@asynccontextmanager
async def filesystem_bastion(tmp_path: Path) -> AsyncIterator[tuple[Bastion, Path]]:
    """A Bastion over HTTP in front of the npm filesystem server (stdio) serving `served/`, which holds notes.txt;
    its writes and edits wait for an approver."""
    ensure_tools()
    served = tmp_path / "served"
    served.mkdir()
    (served / "notes.txt").write_text(BEFORE)
    directory = tmp_path / "config"
    directory.mkdir()
    script = TOOLS / "node_modules" / FILESYSTEM_PACKAGE / "dist" / "index.js"
    connector = ConnectorConfig(id="fs", command=str(NODE_BIN / "node"), args=[str(script), str(served)])
    modes = {"fs:write_file": "require_approval", "fs:edit_file": "require_approval", "fs:*": "allow"}
    config = Config(
        directory=directory,
        settings=Settings.model_validate({"limits": {"list_timeout_seconds": 30}}),
        connectors=[connector],
        policy=PolicyConfig.model_validate({"modes": modes}),
        ledger_url=f"sqlite:///{directory}/ledger.db",
    )
    async with await open_ledger(directory / "ledger.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, [McpConnector(connector, list_timeout=30)])
        app = build_app(HostServer(gateway), allowed_hosts=allowed_hosts_for("127.0.0.1"))
        async with gateway.running(), serving(app) as url:
            yield Bastion(url, ledger, gateway, FixtureServer(), directory), served


async def held(bastion: Bastion, count: int) -> list[Invocation]:
    """Wait (bounded by the caller) until `count` calls are pending; they, oldest first."""
    while len(found := await bastion.ledger.invocations.list(status="pending")) < count:
        with anyio.move_on_after(0.2):
            with suppress(ChangesLost):
                await bastion.ledger.changes.next(bastion.ledger.changes.cursor)
    return sorted(found, key=lambda invocation: invocation.created_at)


@asynccontextmanager
async def calling(bastion: Bastion, tool: str, arguments: dict[str, Any]) -> AsyncIterator[list[types.CallToolResult]]:
    """A real MCP host (an agent token) calling `tool` in the background; its result lands in the list."""
    agent = await bastion.token(f"agent-{tool}", "agent")
    answered: list[types.CallToolResult] = []
    async with bastion.client(agent) as host, anyio.create_task_group() as tg:

        async def call() -> None:
            answered.append(await host.call_tool(tool, arguments))

        tg.start_soon(call)
        yield answered


async def test_a_held_write_shows_its_diff_in_the_inbox_and_the_approval_signs_it(tmp_path: Path) -> None:
    async with filesystem_bastion(tmp_path) as (bastion, served), chromium() as browser:
        target = served / "notes.txt"
        page = await logged_in(browser, bastion)
        with anyio.fail_after(WAIT * 2):
            async with calling(bastion, "fs__write_file", {"path": str(target), "content": AFTER}) as answered:
                (call,) = await held(bastion, 1)
                card = page.locator(f'[data-invocation="{call.id}"]')
                preview = card.locator(".preview")
                await expect(preview.locator(".preview-summary")).to_contain_text(
                    f"write_file {target}: 2 line(s) added, 1 removed"
                )
                await expect(preview.locator(".del")).to_have_text(["-line two"])
                await expect(preview.locator(".add")).to_have_text(["+line 2, rewritten", "+line four"])
                await photograph(page, "preview-diff")
                assert target.read_text() == BEFORE, "nothing is written before the approval"
                await card.locator("button.approve").click()
        (result,) = answered
        assert not result.is_error, result.content
        assert target.read_text() == AFTER

    async with await open_ledger(tmp_path / "config" / "ledger.db", redactor=Redactor()) as ledger:
        events = await ledger.invocations.events(call.id)
        pending = next(e for e in events if e.kind == "pending")
        approved = next(e for e in events if e.kind == "approved")
        assert pending.detail["preview"]["kind"] == "diff"
        assert approved.detail["preview"] == preview_digest(pending.detail)
        report = await verify_signed(ledger.audit, [], trusted_keys(ledger.key_path, []))
        assert report.broken is None, report.broken
        assert report.decisions == 1


async def test_the_approver_mcp_shows_a_new_file_all_added_and_an_edit_by_its_own_dry_run(tmp_path: Path) -> None:
    async with filesystem_bastion(tmp_path) as (bastion, served):
        admin = await bastion.token("alice", "admin")
        new = served / "new.txt"
        edit = {"path": str(served / "notes.txt"), "edits": [{"oldText": "line two", "newText": "line TWO"}]}
        with anyio.fail_after(WAIT * 2):
            async with (
                calling(bastion, "fs__write_file", {"path": str(new), "content": "fresh\nfile\n"}),
                calling(bastion, "fs__edit_file", edit),
                bastion.client(admin, "/approver/mcp") as approver,
            ):
                await held(bastion, 2)
                listed = structured(await approver.call_tool("list_pending", {}))["approvals"]
                previews = {row["action_id"]: row["preview"] for row in listed}
                write, edited = previews["write_file"], previews["edit_file"]
                assert write["summary"] == f"write_file {new}: a new file, 2 line(s) added, 0 removed"
                assert write["text"].splitlines()[:2] == ["--- /dev/null", f"+++ {new}"]
                assert "+fresh" in write["text"].splitlines()
                assert "(its own dry run)" in edited["summary"]
                assert "-line two" in edited["text"].splitlines() and "+line TWO" in edited["text"].splitlines()
                assert (served / "notes.txt").read_text() == BEFORE, "the dry run changed nothing"
                shown = structured(await approver.call_tool("show_invocation", {"invocation_id": listed[0]["id"]}))
                assert shown["preview"] == listed[0]["preview"]
                for row in listed:
                    await approver.call_tool("deny", {"invocation_id": row["id"], "reason": "not now"})
        assert not new.exists()
