"""Reconcile by check: a provider call whose outcome is unknown is settled by asking the provider.

A real gateway behind the real host server, a real MCP client and a real SQLite ledger; the provider's API is a
stateful fake (tests/fake_apis.py) that can apply a write and drop the connection before answering, so the ledger
says `unknown` while the write happened, or drop it before applying anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import httpx2
import pytest
from mcp import Client

from bastion.config import Config, PolicyConfig, ProviderConfig, Settings
from bastion.errors import Conflict, Forbidden, InvalidArguments
from bastion.ledger import Redactor, open_ledger
from bastion.models import EventKind, Invocation, Principal, utcnow
from bastion.pipeline.authority import Checked, reconcile_by_check
from bastion.pipeline.gateway import Gateway
from bastion.server.http import allowed_hosts_for, build_app
from bastion.server.mcp import HostServer
from bastion.sources.providers import provider_source
from bastion.sources.providers.github import marker
from tests.fake_apis import FakeApi, FakeGitHub, FakeLinear, FakeSlack
from tests.providers import CANARY, dumped
from tests.test_api import error_class, serving
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

OWNER = Principal(name="alice", role="owner")
WRITES = {
    "github:create_issue": "allow",
    "github:comment_on_issue": "allow",
    "github:close_issue": "allow",
    "linear:create_issue": "allow",
    "slack:post_message": "allow",
}
ISSUE = {"owner": "acme", "repo": "app", "title": "Crash on save", "body": "Steps: save."}


@dataclass
class Running:
    """A gateway serving one provider over a fake API, and an MCP client of it."""

    client: Client
    gateway: Gateway
    fake: FakeApi

    async def unknown_call(self, tool: str, arguments: dict[str, Any]) -> Invocation:
        """Call `tool` while the fake loses the write's answer or request as set; the call is recorded unknown."""
        result = await self.client.call_tool(tool, arguments)
        assert error_of(result)["class"] == "unknown_outcome", result
        (invocation,) = await self.gateway.ledger.invocations.list(limit=1)
        assert invocation.status == "unknown"
        return invocation

    async def check(self, invocation_id: str, *, principal: Principal = OWNER, **options: Any) -> Checked:
        return await reconcile_by_check(
            self.gateway.ledger,
            invocation_id,
            source_of=self.gateway.listings.sources.get,
            principal=principal,
            now=utcnow(),
            **options,
        )


@asynccontextmanager
async def bastion(tmp_path: Path, provider_id: str, fake: FakeApi) -> AsyncIterator[Running]:
    config = Config(
        directory=None,
        settings=Settings(),
        connectors=[],
        policy=PolicyConfig.model_validate({"modes": WRITES}),
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    provider = provider_source(provider_id, ProviderConfig.model_validate({"token": CANARY}), transport=fake.transport)
    async with await open_ledger(tmp_path / "l.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, [provider])
        async with gateway.running(), Client(HostServer(gateway).server, cache=None) as client:
            yield Running(client, gateway, fake)


async def test_a_github_issue_made_though_its_answer_was_lost_is_reconciled_completed_by_check_with_what_was_found(
    tmp_path: Path,
) -> None:
    fake = FakeGitHub()
    fake.seed_issue("Older", "no marker here")
    fake.seed_issue("Another call's", f"Made by Bastion.\n\n{marker('inv-another')}")
    async with bastion(tmp_path, "github", fake) as bastion_:
        fake.lose = "answer"
        invocation = await bastion_.unknown_call("github__create_issue", ISSUE)
        assert len(fake.issues) == 3, "the issue was made although the answer was lost"

        checked = await bastion_.check(invocation.id, note="asked GitHub")
        events = await bastion_.gateway.ledger.invocations.events(invocation.id)

    assert checked.invocation.status == "completed"
    assert checked.found is not None
    expected = {"number": 3, "title": "Crash on save", "state": "open", "url": "https://github.com/acme/app/issues/3"}
    assert (checked.found.outcome, checked.found.result) == ("completed", expected)
    assert "acme/app#3" in checked.found.where
    assert events[-1].kind == "reconciled"
    detail = events[-1].detail
    assert [detail[k] for k in ("outcome", "how", "by", "note")] == ["completed", "check", "alice", "asked GitHub"]
    assert detail["found"]["result"] == expected
    (look_up,) = fake.reads()
    assert (look_up.url.path, look_up.url.params["state"]) == ("/repos/acme/app/issues", "all")
    assert "idempotency-key" not in look_up.headers, "a look-up changes nothing"
    assert [r.method for r in fake.requests] == ["POST", "GET"]


async def test_a_github_comment_whose_answer_was_lost_is_found_by_its_marker_among_the_issue_s_comments(
    tmp_path: Path,
) -> None:
    fake = FakeGitHub()
    fake.seed_issue("Crash on save", None)
    async with bastion(tmp_path, "github", fake) as bastion_:
        fake.lose = "answer"
        arguments = {"owner": "acme", "repo": "app", "number": 1, "body": "Fixed in main."}
        invocation = await bastion_.unknown_call("github__comment_on_issue", arguments)
        checked = await bastion_.check(invocation.id)
    assert checked.invocation.status == "completed"
    assert checked.found is not None and checked.found.result["id"] == 100
    assert fake.reads()[-1].url.path == "/repos/acme/app/issues/1/comments"


async def test_a_github_call_that_never_reached_the_api_is_left_unknown_by_check_since_github_cannot_be_sure(
    tmp_path: Path,
) -> None:
    fake = FakeGitHub()
    async with bastion(tmp_path, "github", fake) as bastion_:
        fake.lose = "request"
        invocation = await bastion_.unknown_call("github__create_issue", ISSUE)
        assert fake.issues == []
        checked = await bastion_.check(invocation.id)
        events = await bastion_.gateway.ledger.invocations.events(invocation.id)
    assert checked.found is None
    assert checked.invocation.status == "unknown"
    assert events[-1].kind == "unknown", "nothing is recorded when nothing certain was found"


async def test_a_linear_issue_made_though_its_answer_was_lost_is_completed_and_one_never_made_is_failed_once_stale(
    tmp_path: Path,
) -> None:
    fake = FakeLinear()
    arguments = {"team": "ENG", "title": "Crash on save"}
    async with bastion(tmp_path, "linear", fake) as bastion_:
        fake.lose = "answer"
        created = await bastion_.unknown_call("linear__create_issue", arguments)
        fake.lose = "request"
        lost = await bastion_.unknown_call("linear__create_issue", arguments)
        assert len(fake.issues) == 1

        completed = await bastion_.check(created.id)
        too_soon = await bastion_.check(lost.id)  # a request lost a moment ago may still be applied
        failed = await bastion_.check(lost.id, stale_after=timedelta(0))
        events = await bastion_.gateway.ledger.invocations.events(lost.id)

    assert completed.invocation.status == "completed"
    assert completed.found is not None and completed.found.result["identifier"] == "ENG-1"
    assert "ENG-1" in completed.found.where
    assert (too_soon.found, too_soon.invocation.status) == (None, "unknown")
    assert failed.found is not None and failed.found.outcome == "failed"
    assert (failed.invocation.status, failed.invocation.error_class) == ("failed", "upstream_error")
    assert events[-1].kind == "reconciled"
    assert (events[-1].detail["how"], events[-1].detail["found"]["where"]) == ("check", failed.found.where)


async def test_a_slack_message_posted_though_its_answer_was_lost_is_found_by_its_metadata_in_history_or_thread(
    tmp_path: Path,
) -> None:
    fake = FakeSlack()
    async with bastion(tmp_path, "slack", fake) as bastion_:
        fake.lose = "answer"
        posted = await bastion_.unknown_call("slack__post_message", {"channel": "#general", "text": "Deployed."})
        fake.lose = "answer"
        reply = {"channel": "C1", "text": "Rolled back.", "thread_ts": "1699999999.000001"}
        replied = await bastion_.unknown_call("slack__post_message", reply)

        in_channel = await bastion_.check(posted.id)
        in_thread = await bastion_.check(replied.id)

    assert in_channel.invocation.status == in_thread.invocation.status == "completed"
    assert in_channel.found is not None and in_channel.found.result == {
        "channel": "C1",
        "ts": "1700000000.000001",
        "thread_ts": None,
    }
    assert in_thread.found is not None and in_thread.found.result["thread_ts"] == "1699999999.000001"
    methods = [r.url.path.rsplit("/", 1)[1] for r in fake.reads()]
    assert methods == ["conversations.list", "conversations.history", "conversations.replies"]
    assert all(r.url.params.get("include_all_metadata") == "true" for r in fake.reads()[1:])


async def test_a_check_is_refused_for_an_action_without_a_look_up_for_an_agent_and_for_a_resolved_call(
    tmp_path: Path,
) -> None:
    fake = FakeGitHub()
    fake.seed_issue("Crash on save", None)
    async with bastion(tmp_path, "github", fake) as bastion_:
        fake.lose = "answer"
        closed = await bastion_.unknown_call("github__close_issue", {"owner": "acme", "repo": "app", "number": 1})
        with pytest.raises(InvalidArguments):
            await bastion_.check(closed.id)
        fake.lose = "answer"
        created = await bastion_.unknown_call("github__create_issue", ISSUE)
        with pytest.raises(Forbidden):
            await bastion_.check(created.id, principal=Principal(name="ci", role="agent"))
        reads = len(fake.reads())
        assert (await bastion_.check(created.id)).invocation.status == "completed"
        with pytest.raises(Conflict):
            await bastion_.check(created.id)
        still = await bastion_.gateway.ledger.invocations.get(closed.id)
    assert still is not None and still.status == "unknown"
    assert len(fake.reads()) == reads + 1, "only the allowed check asked the API"


async def _recorded(running: Running, status: Literal["executing", "unknown"], *, minutes_ago: float) -> Invocation:
    """A `github:create_issue` call recorded straight into the ledger, last updated `minutes_ago`."""
    at = utcnow() - timedelta(minutes=minutes_ago)
    invocation = Invocation(
        id=f"inv-{status}",
        status=status,
        policy_key="github:create_issue",
        tool="github__create_issue",
        source_id="github",
        action_id="create_issue",
        risk="write",
        mode="allow",
        mode_source="policy",
        session_id="s",
        args=ISSUE,
        owner=running.gateway.instance_id,  # alive: recovery leaves it as it is
        created_at=at,
        updated_at=at,
    )
    history: list[EventKind] = ["planned", "executing"] if status == "executing" else ["planned", "executing", status]
    await running.gateway.ledger.invocations.record(invocation, history)
    return invocation


async def test_a_call_executing_recently_is_not_checked_but_one_stale_for_the_given_time_is(tmp_path: Path) -> None:
    fake = FakeGitHub()
    async with bastion(tmp_path, "github", fake) as bastion_:
        stuck = await _recorded(bastion_, "executing", minutes_ago=2)
        fake.seed_issue("Crash on save", f"Steps: save.\n\n{marker(stuck.id)}")
        with pytest.raises(Conflict):
            await bastion_.check(stuck.id)
        checked = await bastion_.check(stuck.id, stale_after=timedelta(minutes=1))
    assert checked.invocation.status == "completed"


async def test_what_a_look_up_finds_is_scrubbed_of_the_provider_s_token_even_when_the_api_echoes_it(
    tmp_path: Path,
) -> None:
    fake = FakeGitHub()
    async with bastion(tmp_path, "github", fake) as bastion_:
        unknown = await _recorded(bastion_, "unknown", minutes_ago=1)
        fake.seed_issue(f"token seen: {CANARY}", marker(unknown.id))
        checked = await bastion_.check(unknown.id)
        events = await bastion_.gateway.ledger.invocations.events(unknown.id)
    assert checked.found is not None and checked.found.result["title"] == "token seen: [REDACTED]"
    assert CANARY not in dumped(checked.found.result, checked.found.where, events[-1].detail)


async def test_the_api_reconciles_by_check_for_approvers_only_and_documents_the_route(tmp_path: Path) -> None:
    fake = FakeGitHub()
    async with bastion(tmp_path, "github", fake) as bastion_:
        fake.lose = "answer"
        created = await bastion_.unknown_call("github__create_issue", ISSUE)
        fake.lose = "request"
        never = await bastion_.unknown_call("github__create_issue", ISSUE)
        fake.lose = "answer"
        closed = await bastion_.unknown_call("github__close_issue", {"owner": "acme", "repo": "app", "number": 1})
        tokens = bastion_.gateway.ledger.tokens
        admin = {
            "Authorization": f"Bearer {await tokens.create_token('alice', role='admin', profile=None, now=utcnow())}"
        }
        agent = {"Authorization": f"Bearer {await tokens.create_token('ci', role='agent', profile=None, now=utcnow())}"}
        app = build_app(HostServer(bastion_.gateway), allowed_hosts=allowed_hosts_for("127.0.0.1"))
        async with serving(app) as url, httpx2.AsyncClient(base_url=url, timeout=20) as http:
            path = "/api/invocations/{}/reconcile/check"
            refused = await http.post(path.format(created.id), headers=agent)
            no_look_up = await http.post(path.format(closed.id), json={}, headers=admin)
            found = await http.post(path.format(created.id), json={"note": "by check"}, headers=admin)
            again = await http.post(path.format(created.id), headers=admin)
            not_found = await http.post(path.format(never.id), headers=admin)
            document = (await http.get("/api/openapi.json", headers=admin)).json()

    assert (refused.status_code, error_class(refused)) == (403, "forbidden")
    assert (no_look_up.status_code, error_class(no_look_up)) == (422, "invalid_arguments")
    assert found.status_code == 200, found.text
    report = found.json()
    assert (report["invocation"]["status"], report["found"]["outcome"]) == ("completed", "completed")
    assert report["found"]["result"]["number"] == 1
    assert (again.status_code, error_class(again)) == (409, "conflict")
    assert not_found.status_code == 200
    assert (not_found.json()["found"], not_found.json()["invocation"]["status"]) == (None, "unknown")
    operation = document["paths"]["/api/invocations/{invocation_id}/reconcile/check"]["post"]
    assert operation["operationId"] == "reconcileInvocationByCheck"
    assert {"403", "409", "422", "502"} <= set(operation["responses"])
