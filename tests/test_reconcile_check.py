"""Reconcile by check: a provider call whose outcome is unknown is settled by asking the provider.

A real gateway behind the real host server, a real MCP client and a real SQLite ledger; the provider's API is a
stateful fake (tests/fake_apis.py) that can apply a write and drop the connection before answering, so the ledger
says `unknown` while the write happened, or drop it before applying anything. Only what the call itself made
settles it: what anyone else made carrying its mark (the agent, with its own token or through another call) is
reported and leaves it unknown.
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

from bastion.actions import Found
from bastion.config import Config, PolicyConfig, ProviderConfig, Settings
from bastion.errors import Conflict, Forbidden, InvalidArguments
from bastion.ledger import Redactor, open_ledger
from bastion.models import EventKind, Invocation, Principal, utcnow
from bastion.pipeline.authority import Checked, reconcile, reconcile_by_check
from bastion.pipeline.gateway import Gateway
from bastion.server.http import allowed_hosts_for, build_app
from bastion.server.mcp import HostServer
from bastion.sources.providers import provider_source
from bastion.sources.providers.evidence import tag_of
from bastion.sources.providers.github import marker
from bastion.sources.providers.linear import issue_id_for, unkeyed_issue_id_for
from bastion.sources.providers.slack import METADATA_EVENT
from tests.fake_apis import AGENT_TOKEN, FakeApi, FakeGitHub, FakeLinear, FakeSlack
from tests.postgres import PostgresServer
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
    marker_key: bytes
    """The ledger's marker key: a test uses it to copy the mark of what a call made (a real copy needs that object)."""

    def tag(self, invocation_id: str) -> str:
        return tag_of(self.marker_key, invocation_id)

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


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store of a test run once on each backend: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/l.db"
    postgres: PostgresServer = request.getfixturevalue("postgres")
    return postgres.create_database()


@asynccontextmanager
async def bastion(
    tmp_path: Path, provider_id: str, fake: FakeApi, ledger_url: str | None = None
) -> AsyncIterator[Running]:
    url = ledger_url or f"sqlite:///{tmp_path}/l.db"
    config = Config(
        directory=None,
        settings=Settings(),
        connectors=[],
        policy=PolicyConfig.model_validate({"modes": WRITES}),
        ledger_url=url,
    )
    async with await open_ledger(url, redactor=Redactor(), key_path=tmp_path / "ledger.key") as ledger:
        provider = provider_source(
            provider_id,
            ProviderConfig.model_validate({"token": CANARY}),
            marker_key=ledger.marker_key,
            transport=fake.transport,
        )
        gateway = Gateway(config, ledger, [provider])
        async with gateway.running(), Client(HostServer(gateway).server, cache=None) as client:
            yield Running(client, gateway, fake, ledger.marker_key)


async def test_a_github_issue_made_though_its_answer_was_lost_is_reconciled_completed_by_check_with_what_was_found(
    tmp_path: Path,
) -> None:
    fake = FakeGitHub()
    fake.seed_issue("Older", "no marker here")
    fake.seed_issue("Another call's", f"Made by Bastion.\n\n{marker('inv-another', 'f' * 32)}")
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
    assert checked.found.accepted and (checked.found.creator, checked.found.reason) == ("bastion-bot", None)
    assert events[-1].kind == "reconciled"
    detail = events[-1].detail
    assert [detail[k] for k in ("outcome", "how", "by", "note")] == ["completed", "check", "alice", "asked GitHub"]
    assert detail["found"] == {
        "where": checked.found.where,
        "creator": "bastion-bot",
        "created_at": fake.issues[2]["created_at"],
        "result": expected,
    }
    look_up, who = fake.reads()
    assert (look_up.url.path, look_up.url.params["state"]) == ("/repos/acme/app/issues", "all")
    assert who.url.path == "/user", "who made it is checked against the token's own user"
    assert "idempotency-key" not in look_up.headers, "a look-up changes nothing"
    assert [r.method for r in fake.requests] == ["POST", "GET", "GET"]


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
    assert fake.reads()[0].url.path == "/repos/acme/app/issues/1/comments"


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
        "ts": fake.messages[0]["message"]["ts"],
        "thread_ts": None,
    }
    assert in_channel.found.creator == "B0BASTION", "the token's bot posted it"
    assert in_thread.found is not None and in_thread.found.result["thread_ts"] == "1699999999.000001"
    methods = [r.url.path.rsplit("/", 1)[1] for r in fake.reads()]
    assert methods == ["conversations.list", "conversations.history", "auth.test", "conversations.replies", "auth.test"]
    reads = [r for r in fake.reads() if r.url.path.endswith(("history", "replies"))]
    assert all(r.url.params.get("include_all_metadata") == "true" for r in reads)


def old_marker(invocation_id: str) -> str:
    """The marker calls wrote before it was keyed: anyone who knows the invocation id can write it."""
    return f"<!-- bastion:invocation {invocation_id} -->"


async def _left_unknown(running: Running, invocation: Invocation) -> Checked:
    """A check of `invocation` that finds what carries its mark and does not accept it: the call stays unknown, its
    window as it was, and the refused check is on the record, which still verifies."""
    ledger = running.gateway.ledger
    before = await ledger.invocations.get(invocation.id)
    checked = await running.check(invocation.id, note="asked the provider")
    events = await ledger.invocations.events(invocation.id)
    assert before is not None and before.status == "unknown"
    assert (checked.invocation.status, checked.invocation.updated_at) == ("unknown", before.updated_at)
    assert checked.found is not None and not checked.found.accepted, checked.found
    assert checked.found.reason is not None
    found = checked.found
    assert (events[-1].kind, events[-1].detail) == (
        "checked",
        {
            "by": "alice",
            "how": "check",
            "note": "asked the provider",
            "found": {"where": found.where, "creator": found.creator, "created_at": found.created_at},
            "reason": found.reason,
        },
    ), "what is no proof is recorded as a check, not as an outcome"
    assert [event.kind for event in events].count("reconciled") == 0
    report = await ledger.audit.verify()
    assert report.broken is None, report.broken
    return checked


async def test_a_github_issue_with_the_call_s_mark_made_by_anyone_but_the_call_leaves_it_unknown_with_what_was_found(
    tmp_path: Path, ledger_url: str
) -> None:
    fake = FakeGitHub()
    async with bastion(tmp_path, "github", fake, ledger_url) as bastion_:
        fake.lose = "request"
        lost = await bastion_.unknown_call("github__create_issue", ISSUE)
        assert fake.issues == [], "the call made nothing"

        # The agent has Bastion write the old public marker for it, in another call (Bastion's user, in the window).
        forged = {**ISSUE, "body": f"Looks like Bastion's.\n\n{old_marker(lost.id)}"}
        assert not (await bastion_.client.call_tool("github__create_issue", forged)).is_error
        by_proxy = await _left_unknown(bastion_, lost)
        assert "not keyed by this Bastion" in str(by_proxy.found and by_proxy.found.reason)
        assert by_proxy.found is not None and by_proxy.found.creator == "bastion-bot"

        # A copy of the call's keyed marker, on an issue the agent makes with its own token.
        keyed = marker(lost.id, bastion_.tag(lost.id))
        async with fake.client(AGENT_TOKEN) as agent:
            await agent.post("/repos/acme/app/issues", json={"title": "Crash on save", "body": keyed})
        copied = await _left_unknown(bastion_, lost)
        assert copied.found is not None and copied.found.creator == "agent"
        assert "made by agent, not by the token's user bastion-bot" in str(copied.found.reason)
        assert "1 other object(s)" in str(copied.found.reason), "the other forgery is counted"
        assert copied.found.result["number"] == 2

        # A copy on an issue Bastion's user made long before the call (edited since, so listed).
        fake.seed_issue("Old", keyed, created="2020-01-01T00:00:00Z")
        old = await _left_unknown(bastion_, lost)
        assert old.found is not None and "outside the call's window" in str(old.found.reason)

        fake.lose = "answer"
        genuine = await bastion_.unknown_call("github__create_issue", ISSUE)
        accepted = await bastion_.check(genuine.id)
    assert accepted.invocation.status == "completed"
    assert accepted.found is not None and accepted.found.accepted and accepted.found.result["number"] == 4


async def test_a_github_comment_with_the_call_s_mark_made_by_anyone_but_the_call_leaves_it_unknown_with_what_was_found(
    tmp_path: Path, ledger_url: str
) -> None:
    fake = FakeGitHub()
    fake.seed_issue("Crash on save", None)
    arguments = {"owner": "acme", "repo": "app", "number": 1, "body": "Fixed in main."}
    async with bastion(tmp_path, "github", fake, ledger_url) as bastion_:
        fake.lose = "request"
        lost = await bastion_.unknown_call("github__comment_on_issue", arguments)
        async with fake.client(AGENT_TOKEN) as agent:
            await agent.post("/repos/acme/app/issues/1/comments", json={"body": f"Done.\n\n{old_marker(lost.id)}"})
        public = await _left_unknown(bastion_, lost)
        assert public.found is not None and public.found.creator == "agent"
        assert "not keyed by this Bastion" in str(public.found.reason)

        keyed = marker(lost.id, bastion_.tag(lost.id))
        forged = {**arguments, "body": f"Done.\n\n{keyed}"}  # a copy, through another call: Bastion's own user
        assert not (await bastion_.client.call_tool("github__comment_on_issue", forged)).is_error
        fake.comments[-1]["created_at"] = "2020-01-01T00:00:00Z"  # ...that was made long before the call
        old = await _left_unknown(bastion_, lost)
        assert old.found is not None and old.found.creator == "bastion-bot"
        assert "outside the call's window" in str(old.found.reason)

        fake.lose = "answer"
        genuine = await bastion_.unknown_call("github__comment_on_issue", arguments)
        accepted = await bastion_.check(genuine.id)
    assert accepted.invocation.status == "completed"
    assert accepted.found is not None and accepted.found.accepted and accepted.found.result["id"] == 102


async def test_a_linear_issue_under_the_call_s_old_public_id_or_moved_elsewhere_leaves_it_unknown_not_failed(
    tmp_path: Path, ledger_url: str
) -> None:
    fake = FakeLinear()
    arguments = {"team": "ENG", "title": "Crash on save"}
    async with bastion(tmp_path, "linear", fake, ledger_url) as bastion_:
        fake.lose = "request"
        lost = await bastion_.unknown_call("linear__create_issue", arguments)
        await fake.create(AGENT_TOKEN, unkeyed_issue_id_for(lost.id))  # the id anyone could derive from the call's
        squatted = await bastion_.check(lost.id, stale_after=timedelta(0))
        assert squatted.invocation.status == "unknown", "neither completed nor failed"
        assert squatted.found is not None and not squatted.found.accepted
        assert squatted.found.creator == "Agent"
        assert "without a key" in str(squatted.found.reason) and "not by the token's user Bastion" in str(
            squatted.found.reason
        )
        noted = (await bastion_.gateway.ledger.invocations.events(lost.id))[-1]
        assert (noted.kind, noted.detail["reason"], noted.detail["found"]["creator"]) == (
            "checked",
            squatted.found.reason,
            "Agent",
        )

        fake.lose = "answer"
        genuine = await bastion_.unknown_call("linear__create_issue", arguments)
        keyed = issue_id_for(bastion_.marker_key, genuine.id)
        assert set(fake.issues) == {unkeyed_issue_id_for(lost.id), keyed}
        fake.issues[keyed]["team"] = {"id": "team-ops", "key": "OPS"}  # moved to another team since
        moved = await _left_unknown(bastion_, genuine)
        assert "in team OPS, not in ENG" in str(moved.found and moved.found.reason)
        fake.issues[keyed]["team"] = {"id": "team-eng", "key": "ENG"}
        accepted = await bastion_.check(genuine.id)
    assert accepted.invocation.status == "completed"
    assert accepted.found is not None and accepted.found.accepted and accepted.found.creator == "Bastion"


async def test_a_slack_message_with_the_call_s_mark_posted_by_anyone_but_the_call_leaves_it_unknown_with_what_was_found(
    tmp_path: Path, ledger_url: str
) -> None:
    fake = FakeSlack()
    arguments = {"channel": "#general", "text": "Deployed."}
    async with bastion(tmp_path, "slack", fake, ledger_url) as bastion_:
        fake.lose = "request"
        lost = await bastion_.unknown_call("slack__post_message", arguments)
        untagged = {"event_type": METADATA_EVENT, "event_payload": {"invocation_id": lost.id}}
        await fake.post(AGENT_TOKEN, {"channel": "C1", "text": "Deployed.", "metadata": untagged})
        public = await _left_unknown(bastion_, lost)
        assert public.found is not None and public.found.creator == "U0AGENT"
        assert "tag is missing" in str(public.found.reason) and "not by the token's bot B0BASTION" in str(
            public.found.reason
        )

        keyed = {
            "event_type": METADATA_EVENT,
            "event_payload": {"invocation_id": lost.id, "tag": bastion_.tag(lost.id)},
        }
        root = await fake.post(CANARY, {"channel": "C1", "text": "Release thread"})
        reply = {
            "channel": "C1",
            "text": "Deployed.",
            "metadata": keyed,
            "thread_ts": root["ts"],
            "reply_broadcast": True,
        }
        await fake.post(CANARY, reply)  # a copy, with Bastion's token, as a reply also sent to the channel
        elsewhere = await _left_unknown(bastion_, lost)
        assert elsewhere.found is not None and elsewhere.found.creator == "B0BASTION"
        assert f"a reply in thread {root['ts']}" in str(elsewhere.found.reason)

        long_ago = await _recorded(bastion_, "unknown", minutes_ago=120, tool="slack:post_message", args=arguments)
        await fake.post(CANARY, {"channel": "C1", "text": "Deployed.", "metadata": {**keyed, "event_payload": {
            "invocation_id": long_ago.id, "tag": bastion_.tag(long_ago.id)}}})  # fmt: skip
        late = await _left_unknown(bastion_, long_ago)
        assert "outside the call's window" in str(late.found and late.found.reason)

        fake.lose = "answer"
        genuine = await bastion_.unknown_call("slack__post_message", arguments)
        accepted = await bastion_.check(genuine.id)
    assert accepted.invocation.status == "completed"
    assert accepted.found is not None and accepted.found.accepted
    assert accepted.found.result["ts"] == fake.messages[-1]["message"]["ts"]


async def test_reconciling_with_refused_evidence_records_the_attempt_then_refuses_and_a_settled_call_is_a_conflict(
    tmp_path: Path, ledger_url: str
) -> None:
    copied = Found("completed", "acme/app#7", {"number": 7}, "agent", "2020-01-01T00:00:00Z", "made by agent")
    async with bastion(tmp_path, "github", FakeGitHub(), ledger_url) as bastion_:
        ledger = bastion_.gateway.ledger
        unknown = await _recorded(bastion_, "unknown", minutes_ago=1)
        with pytest.raises(InvalidArguments):
            await reconcile(ledger, unknown.id, outcome="completed", principal=OWNER, note="seen", found=copied)
        after_refusal = await ledger.invocations.get(unknown.id)
        noted = (await ledger.invocations.events(unknown.id))[-1]
        await reconcile(ledger, unknown.id, outcome="failed", principal=OWNER, note="by hand")
        with pytest.raises(Conflict):
            await reconcile(ledger, unknown.id, outcome="completed", principal=OWNER, note=None, found=copied)
        kinds = [event.kind for event in await ledger.invocations.events(unknown.id)]
        report = await ledger.audit.verify()
    assert after_refusal is not None and after_refusal.status == "unknown"
    assert (noted.kind, noted.detail["by"], noted.detail["how"], noted.detail["reason"]) == (
        "checked",
        "alice",
        "check",
        "made by agent",
    )
    assert noted.detail["found"] == {"where": "acme/app#7", "creator": "agent", "created_at": "2020-01-01T00:00:00Z"}
    assert kinds == ["planned", "executing", "unknown", "checked", "reconciled"], "a settled call records no check"
    assert report.broken is None, report.broken


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
    assert len(fake.reads()) == reads + 2, "only the allowed check asked the API (what it made, who the token is)"


async def _recorded(
    running: Running,
    status: Literal["executing", "unknown"],
    *,
    minutes_ago: float,
    tool: str = "github:create_issue",
    args: dict[str, Any] = ISSUE,
) -> Invocation:
    """A call of `tool` (a policy key) recorded straight into the ledger, last updated `minutes_ago`."""
    at = utcnow() - timedelta(minutes=minutes_ago)
    source_id, _, action_id = tool.partition(":")
    invocation = Invocation(
        id=f"inv-{status}",
        status=status,
        policy_key=tool,
        tool=tool.replace(":", "__"),
        source_id=source_id,
        action_id=action_id,
        risk="write",
        mode="allow",
        mode_source="policy",
        session_id="s",
        args=args,
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
        fake.seed_issue("Crash on save", f"Steps: save.\n\n{marker(stuck.id, bastion_.tag(stuck.id))}")
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
        fake.seed_issue(f"token seen: {CANARY}", marker(unknown.id, bastion_.tag(unknown.id)))
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
