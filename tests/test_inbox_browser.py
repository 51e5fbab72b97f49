"""The inbox in a real headless Chromium (Debian's package, driven by Playwright): a card read at a glance and the
pages laid out within a 390 px phone screen, the keyboard shortcuts and their help, the filters and a bulk deny, live
updates that add and remove one card without reloading, the favicon, errors shown as messages, and the grants
listed and revoked. Each state is photographed into tests/artifacts/ (ignored by git)."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import pytest
from playwright.async_api import Browser, Page, Request, Response, ViewportSize, async_playwright, expect

from bastion.models import APPROVERS, Principal, utcnow
from bastion.pipeline.authority import decide
from tests.approvers import Bastion, live
from tests.test_api import WAIT, invocation, seed
from tests.test_inbox import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS

pytestmark = pytest.mark.anyio

PHONE: Final = ViewportSize(width=390, height=844)
LONG_WORD: Final = "x" * 400
LONG_ARGS: Final = {
    "path": "/srv/" + "/".join(["a-rather-long-directory-name"] * 12) + "/notes.txt",
    "content": LONG_WORD,
    "nested": {"deeper": {"list": list(range(60)), "key_" + "k" * 80: LONG_WORD}},
    "mode": "overwrite",
    "count": 3,
    "sixth": "shown under Details only",
}
"""Arguments no phone screen holds on a line: a long path, a long unbroken word, nested JSON, more than a card shows."""

WIDER_THAN_THE_SCREEN: Final = """() => {
    const width = window.innerWidth;
    const wide = [...document.querySelectorAll("body *")]
        .filter((el) => el.getBoundingClientRect().right > width)
        .map((el) => `${el.tagName.toLowerCase()}.${el.className} (${el.getBoundingClientRect().right})`);
    const scroll = document.documentElement.scrollWidth;
    return scroll > width ? [...wide, `the page scrolls sideways: ${scroll} > ${width}`] : wide;
}"""


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        if os.environ.get("BASTION_REQUIRE_CHROMIUM") == "1":
            pytest.fail("BASTION_REQUIRE_CHROMIUM=1 and /usr/bin/chromium is missing: apt-get install -y chromium")
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            await browser.close()


async def logged_in(browser: Browser, bastion: Bastion, name: str = "alice") -> Page:
    """A new page at a phone's size, logged in to the inbox with a new admin token of `name`."""
    admin = await bastion.token(name, "admin")
    page = await browser.new_page(viewport=PHONE)
    page.set_default_timeout(WAIT * 1000)
    await page.goto(f"{bastion.url}/inbox/login")
    await page.fill("#token", admin["Authorization"].removeprefix("Bearer "))
    await page.click("button[type=submit]")
    await expect(page).to_have_url(f"{bastion.url}/inbox")
    return page


async def fits_the_screen(page: Page) -> None:
    wide: list[str] = await page.evaluate(WIDER_THAN_THE_SCREEN)
    assert wide == [], f"wider than the {PHONE['width']} px screen: {wide}"


async def photograph(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"inbox-{name}.png"), full_page=True)


async def status_of(bastion: Bastion, invocation_id: str) -> str:
    found = await bastion.ledger.invocations.get(invocation_id)
    assert found is not None
    return found.status


async def test_a_card_reads_at_a_glance_and_every_page_fits_a_390_px_screen(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, chromium() as browser:
        page = await logged_in(browser, bastion)
        await expect(page.locator("#live")).to_contain_text("Live")
        await expect(page.locator("#empty")).to_be_visible()
        await fits_the_screen(page)
        await photograph(page, "empty")

        long_id = "inv-" + "0123456789abcdef" * 6
        await seed(
            bastion.ledger,
            invocation(1, id=long_id, args=LONG_ARGS, session_id="session-" + "s" * 200, principal="deploy-bot"),
        )
        card = page.locator(f'[data-invocation="{long_id}"]')
        await expect(card.locator("h2")).to_have_text("write on fx write")
        await expect(card.locator(".asks")).to_contain_text("deploy-bot asks")
        await expect(card.locator(".why")).to_have_text(
            "Held for approval: it changes data (risk: write) and no rule allows it."
        )
        key_args = card.locator("dl.key-args")
        await expect(key_args).to_contain_text("overwrite")
        await expect(key_args).to_contain_text("…")  # a long value is cut
        await expect(key_args).not_to_contain_text("shown under Details only")
        for folded in (".technical", "pre.args", "dl.meta"):
            await expect(card.locator(folded)).to_be_hidden()
        await fits_the_screen(page)
        await photograph(page, "pending-card")

        await card.locator("summary").click()
        await expect(card.locator(".technical")).to_contain_text("no policy names it")
        await expect(card.locator("dl.meta")).to_contain_text(long_id)
        await expect(card.locator("pre.args")).to_contain_text("shown under Details only")
        await fits_the_screen(page)
        await photograph(page, "card-expanded")

        for other in ("/inbox/history", f"/inbox/invocations/{long_id}", "/inbox/grants"):
            await page.goto(f"{bastion.url}{other}")
            await fits_the_screen(page)


async def test_keyboard_shortcuts_select_approve_and_deny_and_never_fire_while_typing(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, chromium() as browser:
        await seed(bastion.ledger, invocation(1), invocation(2), invocation(3))  # shown newest first
        page = await logged_in(browser, bastion)
        selected = page.locator(".card.selected")
        await expect(selected).to_have_count(0)

        await page.keyboard.press("j")
        await expect(selected).to_have_attribute("data-invocation", "inv-0003")
        await page.keyboard.press("j")
        await page.keyboard.press("j")
        await page.keyboard.press("j")  # stays on the last
        await expect(selected).to_have_attribute("data-invocation", "inv-0001")
        await page.keyboard.press("k")
        await expect(selected).to_have_attribute("data-invocation", "inv-0002")

        reason = selected.locator("input[name=reason]")
        await reason.click()
        await page.keyboard.type("just a dry run")  # holds j, k, a, d: none fires in a field
        await expect(reason).to_have_value("just a dry run")
        await expect(selected).to_have_attribute("data-invocation", "inv-0002")
        assert await status_of(bastion, "inv-0002") == "pending"

        await page.locator("h1").click()  # out of the field
        await page.keyboard.press("?")
        await expect(page.locator("#help")).to_be_visible()
        await expect(page.locator("#help")).to_contain_text("deny the selected call")
        await photograph(page, "help-overlay")
        await page.keyboard.press("Escape")
        await expect(page.locator("#help")).to_be_hidden()

        await page.keyboard.press("d")  # the selected card, with the reason typed in its form
        await expect(page.locator(".flash")).to_contain_text("fx__write denied")
        assert await status_of(bastion, "inv-0002") == "denied"
        denied = await bastion.ledger.invocations.get("inv-0002")
        assert denied is not None and denied.error_message == "denied by alice: just a dry run"

        await expect(page.locator("#count")).to_have_text("2")
        await expect(selected).to_have_attribute("data-invocation", "inv-0001")  # the place is kept
        await page.keyboard.press("a")
        await expect(page.locator(".flash")).to_contain_text("fx__write approved")
        assert await status_of(bastion, "inv-0001") != "pending"
        assert await status_of(bastion, "inv-0003") == "pending"


async def test_filters_narrow_the_cards_and_a_bulk_deny_denies_the_picked_ones_with_one_reason(tmp_path: Path) -> None:
    github = {"source_id": "gh", "action_id": "merge", "policy_key": "gh:merge", "tool": "gh__merge"}
    async with live(tmp_path) as bastion, chromium() as browser:
        await seed(
            bastion.ledger,
            invocation(1),
            invocation(2, principal="night-agent"),
            invocation(3, **github, args={"pull": "owner/repo#42"}),
            invocation(4, principal="night-agent", args={"name": "shopping"}),
        )
        page = await logged_in(browser, bastion)
        shown = page.locator("#cards .card:visible")
        await expect(shown).to_have_count(4)

        await page.select_option("select[name=agent]", "night-agent")
        await expect(shown).to_have_count(2)
        await page.select_option("select[name=action]", "fx:write")
        await expect(shown).to_have_count(2)
        await page.fill("#filters input[name=text]", "shopping")
        await expect(shown).to_have_count(1)
        await expect(shown).to_have_attribute("data-invocation", "inv-0004")
        await page.fill("#filters input[name=text]", "")
        await page.select_option("select[name=agent]", "")
        await page.select_option("select[name=action]", "gh:merge")
        await expect(shown).to_have_count(1)
        await expect(shown).to_have_attribute("data-invocation", "inv-0003")
        await page.select_option("select[name=action]", "")
        await page.locator("h1").click()  # out of the list, where letters choose an option
        await page.keyboard.press("/")  # the text filter, from the keyboard
        await page.keyboard.type("night-agent")
        await expect(shown).to_have_count(2)
        await page.fill("#filters input[name=text]", "")
        await expect(shown).to_have_count(4)

        await expect(page.locator("#bulk")).to_be_hidden()
        await page.locator('[data-invocation="inv-0004"] input[type=checkbox]').check()
        await page.locator('[data-invocation="inv-0001"] .why').click()  # selected, then picked from the keyboard
        await page.keyboard.press("x")
        await expect(page.locator("#picked")).to_have_text("2 selected")
        await page.fill("#bulk input[name=reason]", "not tonight")
        await fits_the_screen(page)
        await page.click("#bulk button[type=submit]")

        await expect(page.locator(".flash")).to_contain_text("2 denied")
        await expect(page.locator("#count")).to_have_text("2")
        for invocation_id in ("inv-0001", "inv-0004"):
            found = await bastion.ledger.invocations.get(invocation_id)
            assert found is not None and found.error_message == "denied by alice: not tonight"
        assert [await status_of(bastion, i) for i in ("inv-0002", "inv-0003")] == ["pending", "pending"]


async def test_live_updates_add_and_remove_one_card_without_reloading_the_page(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, chromium() as browser:
        await seed(bastion.ledger, invocation(1))
        page = await logged_in(browser, bastion)
        await expect(page.locator("#live")).to_contain_text("Live")
        loads: list[str] = []
        fetched: list[str] = []

        def seen(request: Request) -> None:
            if request.resource_type == "document":
                loads.append(request.url)
            elif "/card" in request.url:
                fetched.append(request.url)

        page.on("request", seen)
        first = page.locator('[data-invocation="inv-0001"]')
        await first.evaluate("card => { card.dataset.mark = 'the same node'; window.mark = 'the same page'; }")
        await first.locator("input[name=reason]").fill("half typed")

        await seed(bastion.ledger, invocation(2, principal="late-agent"))
        second = page.locator('[data-invocation="inv-0002"]')
        await expect(second).to_be_visible()
        await expect(page.locator("#count")).to_have_text("2")
        await expect(page.locator("#cards .card").first).to_have_attribute("data-invocation", "inv-0002")
        await expect(page.locator("select[name=agent] option[value=late-agent]")).to_have_count(1)

        await bastion.ledger.invocations.decide("inv-0001", approve=False, principal="bob", note=None, now=utcnow())
        await expect(first).to_have_count(0)
        await expect(page.locator("#count")).to_have_text("1")
        await expect(page.locator("#live")).to_contain_text("fx__write denied")

        assert await second.evaluate("() => window.mark") == "the same page"
        assert loads == [], "the page was never reloaded"
        assert fetched == [f"{bastion.url}/inbox/approvals/inv-0002/card"], "one card fetched, the new one"

        await bastion.ledger.invocations.decide("inv-0002", approve=False, principal="bob", note=None, now=utcnow())
        await expect(page.locator("#empty")).to_be_visible()
        await expect(page.locator("#count")).to_have_text("0")


async def test_a_first_of_two_approvals_updates_its_card_in_place(tmp_path: Path) -> None:
    """A call that needs two approvers: the first approval (by bob, elsewhere) refetches that one card, which then
    says where the call stands, without reloading the page or losing the selection."""
    async with live(tmp_path) as bastion, chromium() as browser:
        await bastion.ledger.invocations.record(invocation(1), ("planned", "pending"), {APPROVERS: 2})
        page = await logged_in(browser, bastion)
        await expect(page.locator("#live")).to_contain_text("Live")
        card = page.locator('[data-invocation="inv-0001"]')
        await card.click()
        await expect(card).not_to_contain_text("1 of 2 approvals")
        loads: list[str] = []
        page.on("request", lambda request: loads.append(request.url) if request.resource_type == "document" else None)

        bob = Principal(name="bob", role="admin")
        await decide(bastion.ledger, "inv-0001", approve=True, principal=bob, note=None, now=utcnow())
        await expect(card).to_contain_text("1 of 2 approvals, by bob")
        await expect(page.locator("#live")).to_contain_text("approval of fx__write was recorded")
        await expect(page.locator("#count")).to_have_text("1")
        await expect(card).to_have_class(re.compile(r"\bselected\b"))
        assert loads == [], "the page was never reloaded"
        await photograph(page, "inbox-two-person")


async def test_the_favicon_loads_without_credentials_and_no_page_request_is_refused(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, chromium() as browser:
        refused: list[str] = []

        def answered(response: Response) -> None:
            if response.status >= 400:
                refused.append(f"{response.status} {response.url}")

        admin = await bastion.token("alice", "admin")
        page = await browser.new_page(viewport=PHONE)
        page.on("response", answered)
        await page.goto(f"{bastion.url}/inbox/login")
        icon = await page.locator("link[rel=icon]").get_attribute("href")
        assert icon is not None
        probe = """async (url) => { const r = await fetch(url, {credentials: "omit"});
            return [r.status, r.headers.get("content-type")]; }"""
        for url in (icon, "/favicon.ico"):
            status, kind = await page.evaluate(probe, url)
            assert (status, kind.split(";")[0]) == (200, "image/svg+xml"), url
        await page.fill("#token", admin["Authorization"].removeprefix("Bearer "))
        await page.click("button[type=submit]")
        await expect(page.locator("#live")).to_contain_text("Live")
        assert refused == []


async def test_errors_reach_the_approver_as_messages_never_as_json(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, chromium() as browser:
        await seed(bastion.ledger, invocation(1), invocation(2))
        page = await logged_in(browser, bastion)
        await page.route("**/inbox/events*", lambda route: route.abort())  # no live update: the card stays
        await page.reload()
        await bastion.ledger.invocations.decide("inv-0001", approve=False, principal="bob", note=None, now=utcnow())

        await page.locator('[data-invocation="inv-0001"] button.deny').click()
        error = page.locator(".flash.error")
        await expect(error).to_have_attribute("data-error-class", "conflict")
        await expect(error).to_contain_text("Already decided")
        assert '{"error"' not in await page.content()
        await fits_the_screen(page)
        await photograph(page, "error-message")

        await bastion.ledger.tokens.revoke_token("alice", now=utcnow())
        await page.locator('[data-invocation="inv-0002"] button.approve').click()
        await expect(page).to_have_url(re.compile(r"/inbox/login\?ended=1$"))
        await expect(error).to_have_attribute("data-error-class", "unauthenticated")
        await expect(error).to_contain_text("Your session ended")
        assert '{"error"' not in await page.content()
        await fits_the_screen(page)
        await photograph(page, "session-ended")
        assert await status_of(bastion, "inv-0002") == "pending"


async def test_grants_are_listed_and_revoked_in_the_inbox(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, chromium() as browser:
        await seed(bastion.ledger, invocation(1, args={"name": "groceries"}))
        page = await logged_in(browser, bastion)
        card = page.locator('[data-invocation="inv-0001"]')
        await card.locator("select[name=scope]").select_option("always")
        await card.locator("input[name=when]").fill("args.name == 'groceries'")
        await card.locator("button.approve").click()
        await expect(page.locator(".flash")).to_contain_text("approved (always: see Grants)")

        (grant,) = await bastion.ledger.grants.grants()
        await page.click("header a[href='/inbox/grants']")
        row = page.locator(f'[data-grant="{grant.id}"]')
        await expect(row).to_contain_text("fx:write")
        await expect(row).to_contain_text("args.name == 'groceries'")
        await expect(row.locator("td[data-label=scope]")).to_have_text("always")
        await fits_the_screen(page)
        await photograph(page, "grants")

        await row.locator("button.deny").click()
        await expect(page.locator(".flash")).to_contain_text(f"Grant {grant.id} on fx:write revoked.")
        await expect(row).to_have_count(0)
        (ended,) = await bastion.ledger.grants.grants()
        assert ended.revoked_by == "alice"


async def test_the_layout_probe_sees_an_element_wider_than_the_screen() -> None:
    """The probe the 390 px checks rely on, on a page that overflows: it cannot pass by seeing nothing."""
    async with chromium() as browser:
        page = await browser.new_page(viewport=PHONE)
        await page.set_content("<body><div class=wide style='width: 500px'>too wide</div><p>fits</p></body>")
        wide: list[str] = await page.evaluate(WIDER_THAN_THE_SCREEN)
    assert wide[0].startswith("div.wide") and wide[-1].startswith("the page scrolls sideways")
