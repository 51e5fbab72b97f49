"""A small server-sent events reader for tests: the events of a streaming httpx2 response, one dict each."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2


@dataclass(frozen=True)
class SseEvent:
    id: str | None
    event: str
    data: str

    @property
    def body(self) -> Any:
        return json.loads(self.data)


async def sse_events(response: httpx2.Response) -> AsyncIterator[SseEvent]:
    """Every event of the stream, comments (pings) skipped, until the stream ends."""
    fields: dict[str, list[str]] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "data" in fields:
                ids, name = fields.get("id"), fields.get("event", ["message"])[-1]
                yield SseEvent(ids[-1] if ids else None, name, "\n".join(fields["data"]))
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name, []).append(value.removeprefix(" "))
