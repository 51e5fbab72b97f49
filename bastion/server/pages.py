"""Paginated listings: the catalog served to hosts in pages (`tools/list`, `resources/list`, ...).

One page holds at most `PAGE_SIZE` items, so a catalog of thousands of tools never becomes one
multi-megabyte response (2025-era SDK clients refuse an SSE event over 1 MiB; every host pays the
serialisation of the whole catalog at once). Small catalogs stay one page without a cursor.

A cursor names the snapshot it was cut from: a host paging through while the catalog changes still
gets one consistent listing (the change reaches it as `list_changed`, and it lists again). The last
`KEPT_SNAPSHOTS` snapshots are kept; an older, unknown or malformed cursor is refused with
INVALID_PARAMS, as the specification asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Generic, TypeVar

import mcp_types as types
from mcp.shared.exceptions import MCPError

PAGE_SIZE: Final = 500
"""Items per page: 500 typical tools are ~300 KB of JSON."""

KEPT_SNAPSHOTS: Final = 8

_T = TypeVar("_T")


def page_cursor(params: types.PaginatedRequestParams | None) -> str | None:
    """The cursor of a list request (None: the first page)."""
    return params.cursor if params is not None else None


class Pager(Generic[_T]):
    """Cuts one kind of listing into pages (one `Pager` per kind and host server)."""

    def __init__(self, kind: str, *, size: int = PAGE_SIZE) -> None:
        if size < 1:
            raise ValueError(f"a page holds at least one item, got size={size}")
        self.kind = kind
        self.size = size
        self._snapshots: dict[int, Sequence[_T]] = {}
        self._next_id = 0

    def page(self, items: Sequence[_T], cursor: str | None) -> tuple[list[_T], str | None]:
        """The page of `items` that `cursor` points at (None: the first page), and the next page's cursor
        (None: this page is the last). A cursor reads the snapshot it was cut from, not `items`."""
        if cursor is None:
            if len(items) <= self.size:
                return list(items), None
            snapshot_id, start = self._remember(items), 0
        else:
            snapshot_id, start = self._parse(cursor)
            items = self._snapshots[snapshot_id]
        end = start + self.size
        return list(items[start:end]), (f"{snapshot_id}.{end}" if end < len(items) else None)

    def _remember(self, items: Sequence[_T]) -> int:
        """The id of `items` (a listing is replaced, never changed in place), remembering it if new."""
        for snapshot_id, known in self._snapshots.items():
            if known is items:
                return snapshot_id
        snapshot_id, self._next_id = self._next_id, self._next_id + 1
        self._snapshots[snapshot_id] = items
        while len(self._snapshots) > KEPT_SNAPSHOTS:
            del self._snapshots[min(self._snapshots)]
        return snapshot_id

    def _parse(self, cursor: str) -> tuple[int, int]:
        snapshot, _, offset = cursor.partition(".")
        try:
            snapshot_id, start = int(snapshot), int(offset)
        except ValueError:
            snapshot_id, start = -1, -1
        items = self._snapshots.get(snapshot_id)
        if items is None or not 0 < start < len(items) or start % self.size:
            raise MCPError(
                types.INVALID_PARAMS,
                f"invalid {self.kind} cursor {cursor[:64]!r}: not issued by this Bastion or too old "
                "(the catalog changed since); list again without a cursor",
            )
        return snapshot_id, start
