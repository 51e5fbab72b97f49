"""The bundled demo notes server, run as a real stdio subprocess and driven by the SDK client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

REPO_ROOT = Path(__file__).resolve().parent.parent


def demo(notes: Path, *, mode: str = "auto") -> Client:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "bastion.demo.notes"],
        env={"BASTION_NOTES_FILE": str(notes)},
        cwd=REPO_ROOT,
    )
    return Client(params, mode=mode, cache=None)


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_lists_four_titled_tools_with_their_annotations(tmp_path: Path, mode: str) -> None:
    async with demo(tmp_path / "notes.json", mode=mode) as client:
        listing = await client.list_tools()
    tools = {tool.name: tool for tool in listing.tools}
    assert set(tools) == {"list_notes", "read_note", "write_note", "delete_note"}
    for tool in tools.values():
        assert tool.title
        assert tool.description
        assert tool.annotations is not None
    hints: dict[str, Any] = {
        name: (tool.annotations.read_only_hint, tool.annotations.destructive_hint)
        for name, tool in tools.items()
        if tool.annotations is not None
    }
    assert hints["list_notes"][0] is True
    assert hints["read_note"][0] is True
    assert hints["write_note"] == (False, False)
    assert hints["delete_note"][1] is True
    assert tools["write_note"].input_schema["required"] == ["name", "text"]
    assert tools["read_note"].output_schema is not None


@pytest.mark.anyio
async def test_write_read_and_delete_persist_in_the_notes_file(tmp_path: Path) -> None:
    notes = tmp_path / "state" / "notes.json"
    async with demo(notes) as client:
        written = await client.call_tool("write_note", {"name": "todo", "text": "buy milk"})
        assert not written.is_error
        assert written.structured_content == {"name": "todo", "created": True, "characters": 8}
        assert json.loads(notes.read_text()) == {"todo": "buy milk"}

        read = await client.call_tool("read_note", {"name": "todo"})
        assert text(read) == "buy milk"
        assert read.structured_content == {"name": "todo", "text": "buy milk"}

        listed = await client.call_tool("list_notes", {})
        assert listed.structured_content == {"notes": [{"name": "todo", "characters": 8}]}

        deleted = await client.call_tool("delete_note", {"name": "todo"})
        assert not deleted.is_error
        assert json.loads(notes.read_text()) == {}

        missing = await client.call_tool("read_note", {"name": "todo"})
        assert missing.is_error
        not_deleted = await client.call_tool("delete_note", {"name": "todo"})
        assert not_deleted.is_error
    # Atomic replacement leaves no temporary file behind.
    assert [p.name for p in notes.parent.iterdir()] == ["notes.json"]


@pytest.mark.anyio
async def test_notes_survive_a_restart_of_the_server(tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    async with demo(notes) as client:
        await client.call_tool("write_note", {"name": "kept", "text": "still here"})
    async with demo(notes) as client:
        read = await client.call_tool("read_note", {"name": "kept"})
    assert text(read) == "still here"


def test_http_mode_refuses_a_non_loopback_address() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bastion.demo.notes", "--transport", "http", "--host", "0.0.0.0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2
    assert "loopback" in completed.stderr
