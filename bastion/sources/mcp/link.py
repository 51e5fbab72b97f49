"""One connection attempt of a downstream MCP connector: its client, and the signals its watchers raise."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from bastion.sources.mcp.listing import Kind

logger = logging.getLogger(__name__)

_CHANGED: Final[dict[type[types.ServerNotification], Kind]] = {
    types.ToolListChangedNotification: "tools",
    types.ResourceListChangedNotification: "resources",
    types.PromptListChangedNotification: "prompts",
}


class Link:
    """One connection attempt: its client and the signals its watchers raise."""

    client: Client
    """Set right after construction: the client needs `on_message` first."""

    def __init__(self, on_resource_updated: Callable[[str], None]) -> None:
        self.ready = False
        self.lost = anyio.Event()
        self.reason: str | None = None
        self.relist: set[Kind] = set()
        self.relist_wanted = anyio.Event()
        self._on_resource_updated = on_resource_updated

    @property
    def modern(self) -> bool:
        return self.client.protocol_version in MODERN_PROTOCOL_VERSIONS

    def lose(self, reason: str) -> None:
        """Mark the connection dead; the first reason wins."""
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()

    async def on_message(self, message: IncomingMessage) -> None:
        """The one place that reacts to change notifications (legacy delivery and the modern `listen()` tee)."""
        if isinstance(message, Exception):
            logger.warning("transport error from downstream: %r", message)
            return
        kind = _CHANGED.get(type(message))
        if kind is not None:
            self.relist.add(kind)
            self.relist_wanted.set()
        elif isinstance(message, types.ResourceUpdatedNotification):
            self._on_resource_updated(message.params.uri)
