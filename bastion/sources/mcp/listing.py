"""Listing a downstream: every page of its tools, resources, resource templates and prompts.

Tools are the connector's reason to exist: a failure to list them fails the connection. Resources
and prompts are listed only when the downstream advertises them, and a downstream that fails to
list them (other than by closing the connection) is treated as offering none, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import mcp_types as types
from mcp import Client, MCPError
from mcp_types import CONNECTION_CLOSED
from pydantic import ValidationError

from bastion.errors import UpstreamError

__all__ = ["Kind", "Listing", "list_prompts", "list_resources", "list_tools"]

logger = logging.getLogger(__name__)

Kind = Literal["tools", "resources", "prompts"]
"""What a `*/list_changed` notification asks to re-list (templates go with resources)."""

_Page = TypeVar("_Page")
_Item = TypeVar("_Item")


@dataclass(frozen=True, slots=True)
class Listing:
    """Everything a downstream offers, exactly as it sent it."""

    tools: list[types.Tool] = field(default_factory=list)
    resources: list[types.Resource] = field(default_factory=list)
    templates: list[types.ResourceTemplate] = field(default_factory=list)
    prompts: list[types.Prompt] = field(default_factory=list)
    _tools_by_name: dict[str, types.Tool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tools_by_name", {tool.name: tool for tool in self.tools})

    def tool(self, name: str) -> types.Tool | None:
        """The listed tool called `name`."""
        return self._tools_by_name.get(name)


async def _every_page(
    source_id: str,
    what: str,
    fetch: Callable[[str | None], Awaitable[_Page]],
    items: Callable[[_Page], list[_Item]],
    next_cursor: Callable[[_Page], str | None],
) -> list[_Item]:
    found: list[_Item] = []
    cursor: str | None = None
    seen: set[str] = set()
    while True:
        page = await fetch(cursor)
        found.extend(items(page))
        cursor = next_cursor(page)
        if cursor is None:
            return found
        if cursor in seen:
            raise UpstreamError(f"connector {source_id} repeated the {what} cursor {cursor!r}")
        seen.add(cursor)


async def list_tools(client: Client, source_id: str) -> list[types.Tool]:
    """Every page of the downstream's tool listing."""

    async def fetch(cursor: str | None) -> types.ListToolsResult:
        return await client.list_tools(cursor=cursor)

    return await _every_page(source_id, "tools/list", fetch, lambda p: p.tools, lambda p: p.next_cursor)


async def list_resources(client: Client, source_id: str) -> tuple[list[types.Resource], list[types.ResourceTemplate]]:
    """The downstream's resources and resource templates; none when it does not offer resources."""
    if client.server_capabilities.resources is None:
        return [], []

    async def fetch(cursor: str | None) -> types.ListResourcesResult:
        return await client.list_resources(cursor=cursor)

    async def fetch_templates(cursor: str | None) -> types.ListResourceTemplatesResult:
        return await client.list_resource_templates(cursor=cursor)

    resources = await _optional(
        source_id,
        "resources/list",
        _every_page(source_id, "resources/list", fetch, lambda p: p.resources, lambda p: p.next_cursor),
    )
    templates = await _optional(
        source_id,
        "resources/templates/list",
        _every_page(
            source_id,
            "resources/templates/list",
            fetch_templates,
            lambda p: p.resource_templates,
            lambda p: p.next_cursor,
        ),
    )
    return resources, templates


async def list_prompts(client: Client, source_id: str) -> list[types.Prompt]:
    """The downstream's prompts; none when it does not offer prompts."""
    if client.server_capabilities.prompts is None:
        return []

    async def fetch(cursor: str | None) -> types.ListPromptsResult:
        return await client.list_prompts(cursor=cursor)

    return await _optional(
        source_id,
        "prompts/list",
        _every_page(source_id, "prompts/list", fetch, lambda p: p.prompts, lambda p: p.next_cursor),
    )


async def _optional(source_id: str, what: str, listing: Awaitable[list[_Item]]) -> list[_Item]:
    """A listing whose failure costs only that listing (a closed connection still fails the caller)."""
    try:
        return await listing
    except MCPError as exc:
        if exc.code == CONNECTION_CLOSED:
            raise
        logger.warning("connector %s: %s failed (%s); offering none", source_id, what, exc.message)
    except UpstreamError as exc:
        logger.warning("connector %s: %s", source_id, exc.message)
    except ValidationError as exc:
        logger.warning("connector %s: %s answered something unusable (%s); offering none", source_id, what, exc)
    return []
