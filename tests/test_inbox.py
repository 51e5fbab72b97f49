"""`/inbox`: login into an HTTP-only session cookie, CSRF on every form, agents refused, an "always"
approval through the form leaving a grant the grants page shows and revokes, the history's filters; and a real headless
Chromium (Debian's package) driven by Playwright that logs in, sees the pending calls with redacted args, why they
wait and the drift diff, denies one with a reason and approves another, while the blocked MCP calls return
accordingly. The browser test writes a screenshot of the inbox to tests/artifacts/inbox.png (ignored by git)."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import anyio
import httpx2
import mcp_types as types
import pytest
from playwright.async_api import Route, async_playwright, expect

from bastion.models import utcnow
from bastion.pipeline.gateway import Gateway
from bastion.server.inbox_pages import login_body
from tests.approvers import OPERATOR_POLICY, Bastion, live, structured
from tests.test_api import WAIT, invocation, seed

pytestmark = pytest.mark.anyio

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).parent / "artifacts"
SECRET_ARG = "ghp_" + "Q" * 36
EARLIER_APPROVALS = """\
# Written by Bastion: actions an approver approved "always".
[modes]
"fx:echo" = "allow"  # approved by alice for invocation 0193 at 2026-10-01T10:00:00+00:00
"fx:other" = "allow"  # kept on purpose
"fx:*" = "allow"  # not one action: never imported
"""
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@asynccontextmanager
async def browserless(bastion: Bastion) -> AsyncIterator[httpx2.AsyncClient]:
    """An HTTP client that keeps cookies, as a browser would (without following redirects)."""
    async with httpx2.AsyncClient(base_url=bastion.url, timeout=WAIT, follow_redirects=False) as http:
        yield http


def _csrf(html: str) -> str:
    found = re.search(r'name=csrf value="([^"]+)"', html)
    assert found is not None, html
    return found.group(1)


async def _log_in(http: httpx2.AsyncClient, secret: str) -> httpx2.Response:
    form = await http.get("/inbox/login")
    return await http.post("/inbox/login", data={"csrf": _csrf(form.text), "token": secret})


async def test_login_sets_an_http_only_strict_session_cookie_and_every_form_needs_its_csrf_token(
    tmp_path: Path,
) -> None:
    async with live(tmp_path) as bastion, browserless(bastion) as http:
        admin = await bastion.token("alice", "admin")
        assert (await http.get("/inbox")).headers["location"] == "/inbox/login"

        form = await http.get("/inbox/login")
        refused = await http.post("/inbox/login", data={"token": admin["Authorization"].removeprefix("Bearer ")})
        assert refused.status_code == 403
        assert refused.json()["error"]["class"] == "csrf_refused"

        logged_in = await http.post(
            "/inbox/login", data={"csrf": _csrf(form.text), "token": admin["Authorization"].removeprefix("Bearer ")}
        )
        assert logged_in.status_code == 303
        (cookie,) = [c for c in logged_in.headers.get_list("set-cookie") if c.startswith("bastion_inbox=")]
        flags = {part.strip().lower() for part in cookie.split(";")}
        assert {"httponly", "samesite=strict", "path=/inbox"} <= flags
        assert "secure" not in flags  # plain HTTP on loopback; Secure is set when served over HTTPS
        assert admin["Authorization"].removeprefix("Bearer ") not in cookie
        assert logged_in.headers["location"] == "/inbox"

        page = await http.get("/inbox")
        assert page.status_code == 200
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for missing_or_wrong in ({}, {"csrf": "forged"}):
            response = await http.post("/inbox/approvals/anything/deny", data=missing_or_wrong)
            assert response.status_code == 403
            assert response.json()["error"]["class"] == "csrf_refused"
        assert (await http.post("/inbox/logout", data={"csrf": "forged"})).status_code == 403
        assert (await http.post("/inbox/logout", data={"csrf": _csrf(page.text)})).status_code == 303
        assert (await http.get("/inbox")).status_code == 303


async def test_an_agent_token_is_refused_on_the_inbox(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, browserless(bastion) as http:
        agent = await bastion.token("ci-agent", "agent")
        refused = await _log_in(http, agent["Authorization"].removeprefix("Bearer "))
        assert refused.status_code == 403
        assert "bastion_inbox=" not in refused.headers.get("set-cookie", "")
        assert (await http.get("/inbox", headers=agent)).status_code == 403
        assert (await http.get("/inbox/events", headers=agent)).status_code == 403
        assert (await _log_in(http, "not-a-token")).status_code == 401


async def test_a_revoked_token_ends_its_inbox_session(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, browserless(bastion) as http:
        admin = await bastion.token("alice", "admin")
        assert (await _log_in(http, admin["Authorization"].removeprefix("Bearer "))).status_code == 303
        assert (await http.get("/inbox")).status_code == 200
        await bastion.ledger.tokens.revoke_token("alice", now=utcnow())
        assert (await http.get("/inbox")).status_code == 303


STREAM_ENDS: Final = 2.0
"""An open stream looks at its authority every second: it ends within this of a revocation or a logout."""


async def _until_the_stream_ends(response: httpx2.Response) -> None:
    with anyio.fail_after(STREAM_ENDS):
        async for _ in response.aiter_bytes():
            pass  # pings, until the server ends the stream


@pytest.mark.parametrize("ended_by", ["logout", "revocation"])
async def test_an_open_inbox_stream_ends_within_a_second_of_a_logout_or_a_revocation(
    tmp_path: Path, ended_by: str
) -> None:
    async with live(tmp_path) as bastion, browserless(bastion) as http:
        admin = await bastion.token("alice", "admin")
        assert (await _log_in(http, admin["Authorization"].removeprefix("Bearer "))).status_code == 303
        page = await http.get("/inbox")
        async with http.stream("GET", "/inbox/events") as events:
            assert events.status_code == 200
            if ended_by == "logout":
                assert (await http.post("/inbox/logout", data={"csrf": _csrf(page.text)})).status_code == 303
            else:
                await bastion.ledger.tokens.revoke_token("alice", now=utcnow())
            await _until_the_stream_ends(events)


async def test_an_open_api_event_stream_ends_within_a_second_of_its_tokens_revocation(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, browserless(bastion) as http:
        admin = await bastion.token("alice", "admin")
        await bastion.token("bob", "admin")  # an approver token is left: only alice's stream ends
        async with http.stream("GET", "/api/events", headers=admin) as events:
            assert events.status_code == 200
            await bastion.ledger.tokens.revoke_token("alice", now=utcnow())
            await _until_the_stream_ends(events)


async def test_an_always_approval_in_the_inbox_form_leaves_a_grant_the_grants_page_shows_and_revokes(
    tmp_path: Path,
) -> None:
    async with live(tmp_path) as bastion, browserless(bastion) as http:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        assert (await _log_in(http, admin["Authorization"].removeprefix("Bearer "))).status_code == 303
        results: list[types.CallToolResult] = []

        async def agent_calls(text: str) -> None:
            async with bastion.client(agent) as client:
                results.append(await client.call_tool("fx__echo", {"text": text}))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(agent_calls, "first")
                (waiting,) = await bastion.pending(1)
                page = (await http.get("/inbox")).text
                offered = re.findall(r'<option value="(\w+)">', page)
                assert offered == ["once", "session", "hour", "always"]
                csrf = _csrf(page)
                approve = f"/inbox/approvals/{waiting.id}/approve"

                unknown = await http.post(approve, data={"csrf": csrf, "scope": "forever"})
                assert unknown.status_code == 422
                assert unknown.json()["error"]["class"] == "invalid_arguments"
                bad = await http.post(approve, data={"csrf": csrf, "scope": "always", "when": "args.text.("})
                assert bad.status_code == 303
                assert "not a valid CEL expression" in (await http.get("/inbox")).text
                still = await bastion.ledger.invocations.get(waiting.id)
                assert still is not None and still.status == "pending", "nothing was decided"

                form = {"csrf": csrf, "scope": "always", "note": "fine", "when": "args.text != 'forbidden'"}
                assert (await http.post(approve, data=form)).status_code == 303
        assert not results[0].is_error
        assert (tmp_path / "config" / "policies" / "default.toml").read_text() == OPERATOR_POLICY

        (grant,) = await bastion.ledger.grants.grants()
        grants_page = (await http.get("/inbox/grants")).text
        assert f'data-grant="{grant.id}"' in grants_page and "args.text != &#x27;forbidden&#x27;" in grants_page
        await agent_calls("second")
        assert not results[1].is_error
        (latest, *_) = await bastion.ledger.invocations.list()
        assert (latest.status, latest.mode, latest.mode_source) == ("completed", "allow", f"grant:{grant.id}")

        revoke = await http.post(f"/inbox/grants/{grant.id}/revoke", data={"csrf": _csrf(grants_page)})
        assert revoke.status_code == 303 and revoke.headers["location"] == "/inbox/grants"
        after = (await http.get("/inbox/grants")).text
        assert f"Grant {grant.id} on fx:echo revoked." in after and f'data-grant="{grant.id}"' not in after
        (ended,) = await bastion.ledger.grants.grants()
        assert ended.revoked_by == "alice"
        forged = await http.post(f"/inbox/grants/{grant.id}/revoke", data={"csrf": "wrong"})
        assert forged.status_code == 403


async def test_the_always_approvals_an_earlier_bastion_wrote_to_its_own_policy_file_become_grants_at_start(
    tmp_path: Path,
) -> None:
    policies = tmp_path / "config" / "policies"
    policies.mkdir(parents=True)
    (policies / "bastion-approved.toml").write_text(EARLIER_APPROVALS)
    async with live(tmp_path) as bastion:
        grants = await bastion.ledger.grants.grants()
        assert sorted((g.policy_key, g.scope, g.grantor) for g in grants) == [
            ("fx:echo", "always", "policies/bastion-approved.toml"),
            ("fx:other", "always", "policies/bastion-approved.toml"),
        ]
        assert not (policies / "bastion-approved.toml").exists()
        assert (policies / "bastion-approved.toml.imported").read_text() == EARLIER_APPROVALS
        agent = await bastion.token("ci-agent", "agent")
        async with bastion.client(agent) as client:
            assert not (await client.call_tool("fx__echo", {"text": "approved long ago"})).is_error
    async with live(tmp_path) as bastion:  # read once: a restart imports nothing more
        assert len(await bastion.ledger.grants.grants()) == 2


async def test_history_filters_by_status_and_source_and_refuses_an_unknown_status(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, browserless(bastion) as http:
        admin = await bastion.token("alice", "admin")
        assert (await _log_in(http, admin["Authorization"].removeprefix("Bearer "))).status_code == 303
        other_source = {"source_id": "gh", "action_id": "write", "policy_key": "gh:write", "tool": "gh__write"}
        await seed(bastion.ledger, invocation(1), invocation(2, **other_source))
        await bastion.ledger.invocations.decide("inv-0001", approve=False, principal="alice", note=None, now=utcnow())

        async def listed(query: str) -> list[str]:
            page = await http.get(f"/inbox/history{query}")
            assert page.status_code == 200, page.text
            return re.findall(r'href="/inbox/invocations/([^"]+)"', page.text)

        assert await listed("") == await listed("?status=&source=") == ["inv-0002", "inv-0001"]
        assert await listed("?status=denied") == ["inv-0001"]
        assert await listed("?source=gh") == ["inv-0002"]
        assert await listed("?status=pending&source=gh") == ["inv-0002"]
        assert await listed("?status=pending&source=fx") == []

        unknown = await http.get("/inbox/history?status=finished")
        assert unknown.status_code == 422
        assert unknown.json()["error"]["class"] == "invalid_arguments"


async def _drift_echo(gateway: Gateway, bastion: Bastion) -> None:
    """Change the downstream's `echo` so that it drifts from its pin."""
    changed = types.Tool(
        name="echo",
        title="Echo",
        description="Return the arguments it was given, and keep a copy.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    )
    await bastion.fixture.set_tools([changed])

    async def drifted() -> bool:
        return gateway.pins.drift("fx", "echo") is not None

    await bastion.wait_until(drifted)


async def test_an_approver_denies_one_call_and_approves_another_in_a_real_browser(tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        if os.environ.get("BASTION_REQUIRE_CHROMIUM") == "1":
            pytest.fail("BASTION_REQUIRE_CHROMIUM=1 and /usr/bin/chromium is missing: apt-get install -y chromium")
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        await _drift_echo(bastion.gateway, bastion)
        results: dict[str, types.CallToolResult] = {}

        async def agent_calls(text: str) -> None:
            async with bastion.client(agent) as client:
                results[text] = await client.call_tool("fx__echo", {"text": text})

        with anyio.fail_after(WAIT * 3):
            async with anyio.create_task_group() as tg:
                tg.start_soon(agent_calls, f"first {SECRET_ARG}")
                await bastion.pending(1)
                tg.start_soon(agent_calls, "second")
                first, second = await bastion.pending(2)

                async with async_playwright() as playwright:
                    browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
                    try:
                        page = await browser.new_page(viewport={"width": 1200, "height": 1400})
                        await page.goto(f"{bastion.url}/inbox")
                        await expect(page).to_have_url(re.compile(r"/inbox/login$"))
                        await page.fill("#token", admin["Authorization"].removeprefix("Bearer "))
                        await page.click("button[type=submit]")
                        await expect(page.locator("h1")).to_have_text("Pending calls (2)")

                        first_card = page.locator(f'[data-invocation="{first.id}"]')
                        await expect(first_card.locator("pre.args")).to_contain_text("[REDACTED]")
                        await expect(first_card.locator("pre.diff")).to_contain_text("keep a copy")
                        await expect(first_card).to_contain_text("ci-agent")
                        why = first_card.locator(".why")
                        await expect(why).to_have_text(
                            "Held for approval: the organisation's policy asks an approver for every fx:echo call."
                        )
                        technical = first_card.locator(".technical")
                        await expect(technical).to_be_hidden()  # folded away under the card's details
                        await expect(technical).to_contain_text("the organisation policy asks for approval of fx:echo")
                        await expect(technical).to_contain_text("its risk (read) comes from the tool's readOnlyHint")
                        await expect(first_card.locator("dl.meta")).to_contain_text("read (from readOnlyHint)")
                        await expect(first_card.locator(".countdown")).to_contain_text("left")
                        assert SECRET_ARG not in await page.content()
                        await expect(page.locator("#live")).to_contain_text("Live")
                        ARTIFACTS.mkdir(exist_ok=True)
                        await page.screenshot(path=str(ARTIFACTS / "inbox.png"), full_page=True)

                        await first_card.locator("input[name=reason]").fill("not with a token in it")
                        await first_card.locator("button.deny").click()
                        await expect(page.locator(".flash")).to_contain_text("denied")
                        await expect(page.locator("h1")).to_have_text("Pending calls (1)")

                        second_card = page.locator(f'[data-invocation="{second.id}"]')
                        await second_card.locator("button.approve").click()
                        await expect(page.locator(".flash")).to_contain_text("approved")
                        await expect(page.locator("h1")).to_have_text("Pending calls (0)")

                        await page.goto(f"{bastion.url}/inbox/invocations/{first.id}")
                        await expect(page.locator("table")).to_contain_text("denied")
                    finally:
                        await browser.close()

        denied = results[f"first {SECRET_ARG}"]
        assert denied.is_error
        assert structured(denied)["error"]["class"] == "approval_denied"
        assert "not with a token in it" in structured(denied)["error"]["message"]
        approved = results["second"]
        assert not approved.is_error


async def test_a_call_that_goes_pending_while_the_pages_stream_connects_is_shown(tmp_path: Path) -> None:
    """The page's live stream resumes after the ledger event the page was rendered at: a call that goes pending
    between the render and the stream's connection (held here until the call is pending) is still announced, and
    the page shows it; so after a decision, whose page is rendered anew. The stream used to start "from now", and
    such a call expired unseen."""
    if not CHROMIUM.exists():
        if os.environ.get("BASTION_REQUIRE_CHROMIUM") == "1":
            pytest.fail("BASTION_REQUIRE_CHROMIUM=1 and /usr/bin/chromium is missing: apt-get install -y chromium")
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        gate = {"asked": anyio.Event(), "released": anyio.Event()}

        async def held(route: Route) -> None:
            asked, released = gate["asked"], gate["released"]
            asked.set()
            await released.wait()
            await route.continue_()

        def hold_the_next_stream() -> None:
            gate["asked"], gate["released"] = anyio.Event(), anyio.Event()

        async def agent_calls(text: str) -> None:
            async with bastion.client(agent) as client:
                await client.call_tool("fx__echo", {"text": text})

        with anyio.fail_after(WAIT * 3):
            async with async_playwright() as playwright, anyio.create_task_group() as tg:
                browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
                try:
                    page = await browser.new_page()
                    await page.goto(f"{bastion.url}/inbox")
                    await page.fill("#token", admin["Authorization"].removeprefix("Bearer "))
                    await page.route("**/inbox/events*", held)  # each page's stream is held before it connects
                    await page.click("button[type=submit]")
                    await expect(page.locator("h1")).to_have_text("Pending calls (0)")
                    await gate["asked"].wait()
                    tg.start_soon(agent_calls, "while the page loads")
                    (first,) = await bastion.pending(1)  # pending after the render, before the stream
                    gate["released"].set()
                    await expect(page.locator(f'[data-invocation="{first.id}"]')).to_be_visible()

                    hold_the_next_stream()
                    await page.locator(f'[data-invocation="{first.id}"] button.deny').click()  # a decision
                    await expect(page.locator(".flash")).to_contain_text("denied")
                    await gate["asked"].wait()  # the decided page's stream, held
                    tg.start_soon(agent_calls, "while the decision's page loads")
                    (second,) = await bastion.pending(1)
                    gate["released"].set()
                    await expect(page.locator(f'[data-invocation="{second.id}"]')).to_be_visible()
                    await bastion.gateway.ledger.invocations.decide(
                        second.id, approve=False, principal="alice", note=None, now=utcnow()
                    )
                finally:
                    await browser.close()


def test_the_login_hint_command_wraps_between_words_never_inside_one() -> None:
    html = login_body("csrf-token")
    assert "<span class=word>--role</span>" in html, "a browser would break --role between its hyphens"
    css = Path(__file__).resolve().parent.parent / "bastion" / "server" / "static" / "inbox.css"
    assert ".command .word { white-space: nowrap; }" in css.read_text()


BROWSER: Final = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
"""What a browser asks for when it sends a form or follows a link."""


async def test_a_bulk_deny_decides_each_picked_call_as_a_single_deny_does_and_says_which_were_not(
    tmp_path: Path,
) -> None:
    async with live(tmp_path) as bastion, browserless(bastion) as http:
        admin = await bastion.token("alice", "admin")
        assert (await _log_in(http, admin["Authorization"].removeprefix("Bearer "))).status_code == 303
        await seed(bastion.ledger, invocation(1), invocation(2), invocation(3), invocation(4, principal="alice"))
        await bastion.ledger.invocations.decide("inv-0003", approve=True, principal="bob", note=None, now=utcnow())
        csrf = _csrf((await http.get("/inbox")).text)
        picked = ["inv-0001", "inv-0002", "inv-0003", "inv-0004", "inv-0001"]  # a duplicate counts once
        form: dict[str, str | list[str]] = {"csrf": csrf, "id": picked, "reason": "a batch gone wrong"}

        forged = await http.post("/inbox/approvals/deny", data=form | {"csrf": "forged"})
        assert forged.status_code == 403
        sent = await http.post("/inbox/approvals/deny", data=form)
        assert sent.status_code == 303 and sent.headers["location"] == "/inbox"
        told = (await http.get("/inbox")).text
        assert 'data-error-class="conflict"' in told and "2 of 4 not denied" in told

        for denied in ("inv-0001", "inv-0002"):
            found = await bastion.ledger.invocations.get(denied)
            assert found is not None and found.status == "denied"
            assert found.error_message == "denied by alice: a batch gone wrong"
        kept = [await bastion.ledger.invocations.get(i) for i in ("inv-0003", "inv-0004")]
        assert [(i.status if i else None) for i in kept] == ["approved", "pending"]  # decided by bob; alice's own

        nothing = await http.post("/inbox/approvals/deny", data={"csrf": csrf, "reason": "none picked"})
        assert nothing.status_code == 303
        assert 'data-error-class="invalid_arguments"' in (await http.get("/inbox")).text


async def test_the_favicon_is_served_to_anyone_without_a_token_or_a_session(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, browserless(bastion) as http:
        await bastion.token("alice", "admin")  # once a token exists, anonymous requests elsewhere are refused
        assert (await http.post("/mcp", json={})).status_code == 401
        for path in ("/favicon.ico", "/inbox/static/favicon.svg"):
            icon = await http.get(path)
            assert icon.status_code == 200, path
            assert icon.headers["content-type"].startswith("image/svg+xml")
            assert icon.text.startswith("<svg")


async def test_a_refusal_reaches_a_browser_as_a_page_with_a_message_and_a_script_as_json(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion, browserless(bastion) as http:
        admin = await bastion.token("alice", "admin")
        assert (await _log_in(http, admin["Authorization"].removeprefix("Bearer "))).status_code == 303
        await seed(bastion.ledger, invocation(1))
        deny = "/inbox/approvals/inv-0001/deny"

        stale = await http.post(deny, data={"csrf": "from an older session"}, headers=BROWSER)
        assert stale.status_code == 403 and stale.headers["content-type"].startswith("text/html")
        assert 'data-error-class="csrf_refused"' in stale.text and '{"error"' not in stale.text
        assert (await http.post(deny, data={"csrf": "from an older session"})).json()["error"][
            "class"
        ] == "csrf_refused"

        unknown = await http.get("/inbox/history?status=finished", headers=BROWSER)
        assert unknown.status_code == 422 and 'data-error-class="invalid_arguments"' in unknown.text

        csrf = _csrf((await http.get("/inbox")).text)
        await bastion.ledger.tokens.revoke_token("alice", now=utcnow())
        ended = await http.post(deny, data={"csrf": csrf}, headers=BROWSER)
        assert ended.status_code == 303 and ended.headers["location"] == "/inbox/login?ended=1"
        login = await http.get(ended.headers["location"])
        assert 'data-error-class="unauthenticated"' in login.text
        assert (await http.post(deny, data={"csrf": csrf})).status_code == 401  # a script: the error's JSON
        assert (await http.get("/inbox/approvals/inv-0001/card")).status_code == 401
        found = await bastion.ledger.invocations.get("inv-0001")
        assert found is not None and found.status == "pending", "nothing was decided"
