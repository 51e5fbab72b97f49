"""Listings in pages: the pager's cursors, and a host paging through a catalog larger than one page."""

from __future__ import annotations

from pathlib import Path

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from bastion.server.pages import KEPT_SNAPSHOTS, PAGE_SIZE, Pager
from tests.downstream import FixtureServer
from tests.harness import harness


def read_all(pager: Pager[int], items: list[int]) -> list[list[int]]:
    pages = []
    cursor: str | None = None
    while True:
        page, cursor = pager.page(items, cursor)
        pages.append(page)
        if cursor is None:
            return pages


def test_a_listing_that_fits_is_one_page_without_a_cursor() -> None:
    assert Pager[int]("things", size=3).page([1, 2, 3], None) == ([1, 2, 3], None)
    assert Pager[int]("things", size=3).page([], None) == ([], None)


def test_following_the_cursors_yields_every_item_once_in_order() -> None:
    assert read_all(Pager[int]("things", size=3), list(range(7))) == [[0, 1, 2], [3, 4, 5], [6]]
    assert read_all(Pager[int]("things", size=3), list(range(6))) == [[0, 1, 2], [3, 4, 5]]


def test_a_cursor_reads_the_listing_it_was_cut_from_even_after_the_catalog_changed() -> None:
    pager = Pager[int]("things", size=2)
    before = [1, 2, 3, 4, 5]
    first, cursor = pager.page(before, None)
    after = [9, 8, 7, 6, 5, 4]
    assert pager.page(after, None)[0] == [9, 8]  # a new listing starts from the new catalog
    rest: list[int] = []
    while cursor is not None:
        page, cursor = pager.page(after, cursor)
        rest += page
    assert first + rest == before


@pytest.mark.parametrize("cursor", ["", "garbage", "0", "0.1", "0.5", "0.-2", "7.2", "0.2.1"])
def test_a_cursor_this_pager_did_not_issue_is_invalid_params(cursor: str) -> None:
    pager = Pager[int]("things", size=2)
    pager.page([1, 2, 3, 4], None)  # snapshot 0, whose cursors are "0.2"
    with pytest.raises(MCPError) as raised:
        pager.page([1, 2, 3, 4], cursor)
    assert raised.value.error.code == types.INVALID_PARAMS
    assert "invalid things cursor" in raised.value.error.message
    assert "list again without a cursor" in raised.value.error.message


def test_only_the_last_snapshots_are_kept() -> None:
    pager = Pager[int]("things", size=1)
    _, oldest = pager.page([0, 1], None)
    for version in range(KEPT_SNAPSHOTS):
        _, kept = pager.page([version, 1], None)
    assert oldest is not None and kept is not None
    assert pager.page([], kept) == ([1], None)
    with pytest.raises(MCPError, match="too old"):
        pager.page([], oldest)


@pytest.mark.anyio
async def test_a_host_pages_through_a_catalog_larger_than_one_page(tmp_path: Path) -> None:
    fixture = FixtureServer()
    fixture.tools = [
        types.Tool(name=f"tool_{number:04d}", input_schema={"type": "object"}) for number in range(PAGE_SIZE * 2 + 10)
    ]
    async with harness(tmp_path, fixture=fixture) as h:
        first = await h.client.list_tools()
        assert len(first.tools) == PAGE_SIZE
        assert first.next_cursor is not None
        names = [tool.name for tool in first.tools]
        cursor: str | None = first.next_cursor
        while cursor is not None:
            page = await h.client.list_tools(cursor=cursor)
            names += [tool.name for tool in page.tools]
            cursor = page.next_cursor
        assert names == [f"fx__tool_{number:04d}" for number in range(PAGE_SIZE * 2 + 10)] + ["bastion__invocation"]

        with pytest.raises(MCPError) as raised:
            await h.client.list_tools(cursor="not-a-cursor")
        assert raised.value.error.code == types.INVALID_PARAMS
