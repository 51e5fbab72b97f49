"""Linear provider actions: the exact GraphQL requests each one sends, and what its GraphQL errors become."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from bastion.errors import BastionError, RateLimited, UnknownOutcome, UpstreamError
from bastion.sources.providers.linear import issue_id_for, unkeyed_issue_id_for
from tests.providers import CANARY, MARKER_KEY, ScriptedApi, body_of, call, looked_up, ok, running, source

pytestmark = pytest.mark.anyio

TEAM_ID = "9cfb482a-81e3-4154-b5b9-2c805e70a02d"


def node(identifier: str = "ENG-1", **extra: Any) -> dict[str, Any]:
    return {
        "id": "2a9d0c4e-0000-4000-8000-000000000001",
        "identifier": identifier,
        "title": "Fix login",
        "url": f"https://linear.app/acme/issue/{identifier}",
        "priority": 2,
        "updatedAt": "2025-01-02T00:00:00.000Z",
        "state": {"name": "Todo"},
        "assignee": None,
        "team": {"key": "ENG"},
        **extra,
    }


def page(nodes: list[dict[str, Any]], *, more: bool, cursor: str | None = None) -> dict[str, Any]:
    return {"data": {"issues": {"nodes": nodes, "pageInfo": {"hasNextPage": more, "endCursor": cursor}}}}


async def test_list_issues_posts_a_filtered_query_and_follows_cursors_to_the_limit() -> None:
    api = ScriptedApi(
        [
            ok(page([node("ENG-1"), node("ENG-2")], more=True, cursor="c2")),
            ok(page([node("ENG-3")], more=True, cursor="c3")),
        ]
    )
    async with running(source("linear", api, token="lin_api_" + CANARY)) as linear:
        result = await call(linear, "list_issues", {"team": "ENG", "state": "In Progress", "limit": 3})
    first, second = api.requests
    assert (first.method, str(first.url)) == ("POST", "https://api.linear.app/graphql")
    assert first.headers["authorization"] == "lin_api_" + CANARY
    assert "idempotency-key" not in first.headers
    sent = body_of(first)
    assert "issues(first: $first, after: $after, filter: $filter, orderBy: updatedAt)" in sent["query"]
    assert sent["variables"] == {
        "first": 3,
        "after": None,
        "filter": {"team": {"key": {"eq": "ENG"}}, "state": {"name": {"eqIgnoreCase": "In Progress"}}},
    }
    assert body_of(second)["variables"]["after"] == "c2"
    assert body_of(second)["variables"]["first"] == 1
    assert result.structured_content is not None
    assert [i["identifier"] for i in result.structured_content["issues"]] == ["ENG-1", "ENG-2", "ENG-3"]
    assert result.structured_content["truncated"] is True
    assert result.structured_content["issues"][0] == {
        "id": "2a9d0c4e-0000-4000-8000-000000000001",
        "identifier": "ENG-1",
        "title": "Fix login",
        "url": "https://linear.app/acme/issue/ENG-1",
        "state": "Todo",
        "assignee": None,
        "team": "ENG",
        "priority": 2,
        "updated_at": "2025-01-02T00:00:00.000Z",
    }


async def test_an_oauth_token_goes_as_a_bearer_token() -> None:
    api = ScriptedApi([ok(page([], more=False))])
    async with running(source("linear", api)) as linear:
        await call(linear, "list_issues", {})
    assert api.last.headers["authorization"] == f"Bearer {CANARY}"
    assert body_of(api.last)["variables"]["filter"] is None


async def test_create_issue_finds_the_team_then_creates_it_under_an_id_derived_from_the_invocation() -> None:
    api = ScriptedApi(
        [
            ok({"data": {"teams": {"nodes": [{"id": TEAM_ID}]}}}),
            ok({"data": {"issueCreate": {"success": True, "issue": node("ENG-9")}}}),
        ]
    )
    async with running(source("linear", api)) as linear:
        result = await call(linear, "create_issue", {"team": "ENG", "title": "Fix login", "priority": 2})
    lookup, create = api.requests
    assert body_of(lookup)["variables"] == {"key": "ENG"}
    assert "idempotency-key" not in lookup.headers
    assert create.headers["idempotency-key"] == "inv-1"
    assert "issueCreate(input: $input)" in body_of(create)["query"]
    assert body_of(create)["variables"] == {
        "input": {"id": issue_id_for(MARKER_KEY, "inv-1"), "teamId": TEAM_ID, "title": "Fix login", "priority": 2}
    }
    assert issue_id_for(MARKER_KEY, "inv-1") == issue_id_for(MARKER_KEY, "inv-1") != issue_id_for(MARKER_KEY, "inv-2")
    assert uuid.UUID(issue_id_for(MARKER_KEY, "inv-1")).version == 4
    assert result.structured_content is not None and result.structured_content["identifier"] == "ENG-9"


async def test_the_issue_id_is_keyed_so_the_invocation_id_alone_does_not_give_it() -> None:
    keyed = issue_id_for(MARKER_KEY, "inv-1")
    assert keyed != unkeyed_issue_id_for("inv-1"), "the old id, a public hash of the invocation id"
    assert keyed != issue_id_for(b"another key" * 3, "inv-1")


async def test_a_look_up_reports_an_issue_of_the_old_unkeyed_id_another_user_made_without_accepting_it() -> None:
    old = node("ENG-7", id=unkeyed_issue_id_for("inv-1"), createdAt="2099-01-01T00:00:00.000Z")
    old |= {"creator": {"id": "user-agent", "name": "Agent"}, "team": {"id": TEAM_ID, "key": "ENG"}}
    answer = {"data": {"viewer": {"id": "user-bastion", "name": "Bastion"}, "issues": {"nodes": [old]}}}
    api = ScriptedApi([ok(answer)])
    async with running(source("linear", api)) as linear:
        found = await looked_up(linear, "create_issue", {"team": "ENG", "title": "t"})
    assert body_of(api.last)["variables"] == {"ids": [issue_id_for(MARKER_KEY, "inv-1"), unkeyed_issue_id_for("inv-1")]}
    assert "idempotency-key" not in api.last.headers
    assert found is not None and (found.outcome, found.accepted) == ("completed", False)
    assert found.reason is not None
    for why in ("without a key", "made by Agent, not by the token's user Bastion", "outside the call's window"):
        assert why in found.reason
    assert (found.creator, found.result["identifier"]) == ("Agent", "ENG-7")


async def test_create_issue_with_a_team_id_asks_nothing_first() -> None:
    api = ScriptedApi([ok({"data": {"issueCreate": {"success": True, "issue": node()}}})])
    async with running(source("linear", api)) as linear:
        await call(linear, "create_issue", {"team": TEAM_ID, "title": "t", "description": "d", "label_ids": ["l1"]})
    assert len(api.requests) == 1
    assert body_of(api.last)["variables"]["input"] == {
        "id": issue_id_for(MARKER_KEY, "inv-1"),
        "teamId": TEAM_ID,
        "title": "t",
        "description": "d",
        "labelIds": ["l1"],
    }


async def test_update_issue_finds_the_state_by_name_then_sets_only_the_fields_given() -> None:
    states = {"data": {"issue": {"team": {"states": {"nodes": [{"id": "state-done"}]}}}}}
    api = ScriptedApi(
        [ok(states), ok({"data": {"issueUpdate": {"success": True, "issue": node(state={"name": "Done"})}}})]
    )
    async with running(source("linear", api)) as linear:
        result = await call(linear, "update_issue", {"issue": "ENG-1", "state": "done", "priority": 1})
    lookup, update = api.requests
    assert body_of(lookup)["variables"] == {"id": "ENG-1", "name": "done"}
    assert update.headers["idempotency-key"] == "inv-1"
    assert body_of(update)["variables"] == {"id": "ENG-1", "input": {"stateId": "state-done", "priority": 1}}
    assert result.structured_content is not None and result.structured_content["state"] == "Done"


async def test_an_unknown_team_or_state_is_refused_before_anything_is_changed() -> None:
    api = ScriptedApi([ok({"data": {"teams": {"nodes": []}}})])
    async with running(source("linear", api)) as linear:
        with pytest.raises(UpstreamError):
            await call(linear, "create_issue", {"team": "NOPE", "title": "t"})
    assert len(api.requests) == 1
    api = ScriptedApi([ok({"data": {"issue": {"team": {"states": {"nodes": []}}}}})])
    async with running(source("linear", api)) as linear:
        with pytest.raises(UpstreamError):
            await call(linear, "update_issue", {"issue": "ENG-1", "state": "Nope"})
    assert len(api.requests) == 1


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (
            ok(
                {"errors": [{"message": "Rate limit exceeded", "extensions": {"code": "RATELIMITED"}}]},
                400,
                headers={"retry-after": "12"},
            ),
            RateLimited,
        ),
        (ok({"errors": [{"message": "Entity not found", "extensions": {"code": "INVALID_INPUT"}}]}), UpstreamError),
        (ok({"errors": [{"message": "Authentication required"}]}, 401), UpstreamError),
        (ok({"data": {"issueUpdate": {"success": False, "issue": None}}}), UpstreamError),
        (ok({"data": {"issueUpdate": None}}), UnknownOutcome),
    ],
)
async def test_graphql_errors_become_bastion_errors(answer: Any, error: type[BastionError]) -> None:
    api = ScriptedApi([answer])
    async with running(source("linear", api)) as linear:
        with pytest.raises(error) as raised:
            await call(linear, "update_issue", {"issue": "ENG-1", "title": "t"})
    if isinstance(raised.value, RateLimited):
        assert raised.value.retry_after == 12


async def test_each_action_declares_its_risk_and_whether_a_retry_is_safe() -> None:
    async with running(source("linear", ScriptedApi([ok({})]))) as linear:
        specs = linear.actions()
    assert {s.action_id: (s.risk, s.idempotency_key, s.reconcile) for s in specs} == {
        "list_issues": ("read", False, "manual"),
        "create_issue": ("write", True, "lookup"),
        "update_issue": ("write", True, "manual"),
    }
