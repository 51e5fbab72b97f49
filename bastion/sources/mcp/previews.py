"""Previews of a connector's file writes, made through the same downstream without changing anything.

A tool's preview is declared in its connector file (`[tools.<name>.preview]`, see `bastion.config.ToolPreview`):
either the tool's own dry-run argument (the downstream answers what it would do), or a read tool of the downstream
and the arguments naming the file and its new content (the preview is the unified diff from what the read tool
returns to that content; a file the read tool does not find is new, all added). The official filesystem server
(`@modelcontextprotocol/server-filesystem`) has both built in: `write_file` by a diff against `read_text_file`,
`edit_file` by its own `dryRun`.
"""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Protocol

import mcp_types as types

from bastion.actions import PreviewFn
from bastion.config import ConnectorConfig, ToolPreview
from bastion.errors import InvalidArguments, UpstreamError
from bastion.models import Invocation, Preview

OFFICIAL_FILESYSTEM_SERVER: Final = "secure-filesystem-server"
"""The name `@modelcontextprotocol/server-filesystem` gives itself (its `serverInfo.name`)."""

READ_TIMEOUT: Final = 30.0
"""The longest a preview's read may take on the connector's side (the pipeline's preview bound is shorter)."""

_MISSING: Final = ("ENOENT", "no such file", "not found", "does not exist")
"""What a read tool's error says when the file is not there (the write then makes a new file)."""


class Call(Protocol):
    """The connector's own call (`McpConnector.call`)."""

    def __call__(
        self, action_id: str, arguments: dict[str, Any], *, correlation_id: str, timeout: float
    ) -> Awaitable[types.CallToolResult]: ...


def preview_settings(
    config: ConnectorConfig, tools: Sequence[types.Tool], server_name: str | None
) -> dict[str, ToolPreview]:
    """How each listed tool is previewed: its connector file's `preview`, else the built-in way of the official
    filesystem server; a tool set to `preview = false` is not."""
    names = {tool.name for tool in tools}
    settings: dict[str, ToolPreview] = {}
    if server_name == OFFICIAL_FILESYSTEM_SERVER:
        read = next((name for name in ("read_text_file", "read_file") if name in names), None)
        if read is not None and "write_file" in names:
            settings["write_file"] = ToolPreview(read=read)
        if "edit_file" in names:
            settings["edit_file"] = ToolPreview(dry_run="dryRun")
    for name, override in config.tools.items():
        if override.preview is False:
            settings.pop(name, None)
        elif override.preview is not None and name in names:
            settings[name] = override.preview
    return settings


def previews(source_id: str, call: Call, settings: Mapping[str, ToolPreview]) -> dict[str, PreviewFn]:
    """The preview of each tool that has a setting, made through `call`."""
    made: dict[str, PreviewFn] = {}
    for tool, setting in settings.items():
        how = _dry_run if setting.dry_run is not None else _diff
        made[tool] = partial(how, source_id, call, tool, setting)
    return made


async def _dry_run(
    source_id: str, call: Call, tool: str, setting: ToolPreview, invocation: Invocation, arguments: dict[str, Any]
) -> Preview:
    """The tool called with its dry-run argument set: what it answers is the preview."""
    assert setting.dry_run is not None
    rehearsal = {**arguments, setting.dry_run: True}
    result = await call(tool, rehearsal, correlation_id=f"{invocation.id}.preview", timeout=READ_TIMEOUT)
    text = _text(result)
    if result.is_error:
        raise UpstreamError(f"{source_id}:{tool}'s dry run failed: {_first_line(text)}")
    lines = [line for line in text.splitlines() if not line.startswith("```")]  # the diff's Markdown fence
    path = arguments.get(setting.path)
    where = f" {path}" if isinstance(path, str) else ""
    return Preview(kind="diff", summary=f"{tool}{where}: {_counted(lines)} (its own dry run)", text="\n".join(lines))


async def _diff(
    source_id: str, call: Call, tool: str, setting: ToolPreview, invocation: Invocation, arguments: dict[str, Any]
) -> Preview:
    """The unified diff from the file as the read tool returns it to the call's new content."""
    assert setting.read is not None
    path, content = arguments.get(setting.path), arguments.get(setting.content)
    if not isinstance(path, str) or not isinstance(content, str):
        raise InvalidArguments(f"the call has no text {setting.path!r} and {setting.content!r} to diff")
    result = await call(
        setting.read, {setting.path: path}, correlation_id=f"{invocation.id}.preview", timeout=READ_TIMEOUT
    )
    current: str | None = _read(result)
    if result.is_error:
        said = _text(result)
        if not any(word.lower() in said.lower() for word in _MISSING):
            raise UpstreamError(f"{path} cannot be read through {source_id}:{setting.read}: {_first_line(said)}")
        current = None
    before = [] if current is None else current.splitlines(keepends=True)
    lines = list(
        difflib.unified_diff(
            before,
            content.splitlines(keepends=True),
            fromfile="/dev/null" if current is None else path,
            tofile=path,
            lineterm="",
        )
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    if current is None:
        summary = f"{tool} {path}: a new file, {_counted(text.splitlines())}"
    elif not lines:
        summary = f"{tool} {path}: no change, the file already holds this content"
    else:
        summary = f"{tool} {path}: {_counted(text.splitlines())}"
    return Preview(kind="diff", summary=summary, text=text)


def _counted(lines: Sequence[str]) -> str:
    added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("---"))
    return f"{added} line(s) added, {removed} removed"


def _read(result: types.CallToolResult) -> str:
    """The file's text in a read tool's result: its structured `content`, else its text content."""
    structured = result.structured_content
    if isinstance(structured, dict) and isinstance(structured.get("content"), str):
        return str(structured["content"])
    return _text(result)


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or ["no message"])[0][:300]
