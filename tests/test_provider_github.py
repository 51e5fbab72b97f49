"""GitHub provider actions: the exact requests each one sends and the compact results it returns."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.config import ProviderConfig
from bastion.errors import ConnectorUnavailable, UpstreamError
from bastion.sources.providers import provider_source
from bastion.sources.providers.evidence import tag_of
from bastion.sources.providers.github import BODY_CHARS, marker
from tests.providers import CANARY, MARKER_KEY, ScriptedApi, body_of, call, looked_up, ok, query_of, running, source

pytestmark = pytest.mark.anyio

API = "https://api.github.com"
MARKER = marker("inv-1", tag_of(MARKER_KEY, "inv-1"))
ME = {"login": "bastion-bot", "id": 1}


def issue(number: int, **extra: Any) -> dict[str, Any]:
    return {
        "number": number,
        "title": f"Issue #{number}",
        "state": "open",
        "user": {"login": "octocat", "id": 1},
        "labels": [{"name": "bug", "color": "f00"}],
        "assignees": [{"login": "hubot"}],
        "comments": 2,
        "html_url": f"https://github.com/acme/app/issues/{number}",
        "url": f"{API}/repos/acme/app/issues/{number}",
        "created_at": "2025-01-01T00:00:00Z",
        "updated_at": "2025-01-02T00:00:00Z",
        "node_id": "I_x",
        "reactions": {"+1": 3},
        **extra,
    }


def pull(number: int, **extra: Any) -> dict[str, Any]:
    return {
        "number": number,
        "title": f"pr {number}",
        "state": "open",
        "draft": False,
        "user": {"login": "octocat"},
        "head": {"ref": "feature", "sha": "a" * 40, "repo": {}},
        "base": {"ref": "main", "sha": "b" * 40},
        "html_url": f"https://github.com/acme/app/pull/{number}",
        "created_at": "2025-01-01T00:00:00Z",
        "updated_at": "2025-01-02T00:00:00Z",
        **extra,
    }


def assert_github_headers(request: Any, *, mutating: bool) -> None:
    assert request.headers["authorization"] == f"Bearer {CANARY}"
    assert request.headers["accept"] == "application/vnd.github+json"
    assert request.headers["x-github-api-version"] == "2022-11-28"
    assert request.headers["user-agent"].startswith("bastion/")
    assert request.headers.get("idempotency-key") == ("inv-1" if mutating else None)


async def test_list_issues_sends_its_filters_follows_pages_to_the_limit_and_leaves_pull_requests_out() -> None:
    next_page = f'<{API}/repositories/1/issues?state=open&per_page=3&page=2>; rel="next", <{API}/x?page=9>; rel="last"'
    api = ScriptedApi(
        [
            ok([issue(1), issue(2, pull_request={"url": "..."}), issue(3)], headers={"link": next_page}),
            ok([issue(4), issue(5)], headers={"link": f'<{API}/repositories/1/issues?page=3>; rel="next"'}),
        ]
    )
    async with running(source("github", api)) as github:
        result = await call(
            github, "list_issues", {"owner": "acme", "repo": "app", "labels": ["bug", "ui"], "limit": 3}
        )
    first, second = api.requests
    assert (first.method, first.url.path) == ("GET", "/repos/acme/app/issues")
    assert query_of(first) == {
        "state": "open",
        "labels": "bug,ui",
        "sort": "updated",
        "direction": "desc",
        "per_page": "3",
    }
    assert_github_headers(first, mutating=False)
    assert str(second.url) == f"{API}/repositories/1/issues?state=open&per_page=3&page=2"
    assert result.structured_content is not None
    assert [i["number"] for i in result.structured_content["issues"]] == [1, 3, 4]
    assert result.structured_content["truncated"] is True
    assert result.structured_content["issues"][0] == {
        "number": 1,
        "title": "Issue #1",
        "state": "open",
        "author": "octocat",
        "labels": ["bug"],
        "assignees": ["hubot"],
        "comments": 2,
        "url": "https://github.com/acme/app/issues/1",
        "created_at": "2025-01-01T00:00:00Z",
        "updated_at": "2025-01-02T00:00:00Z",
    }


async def test_a_list_that_ends_before_the_limit_is_not_truncated() -> None:
    api = ScriptedApi([ok([issue(1)])])
    async with running(source("github", api)) as github:
        result = await call(github, "list_issues", {"owner": "acme", "repo": "app", "state": "closed"})
    assert query_of(api.last)["state"] == "closed"
    assert query_of(api.last)["per_page"] == "30"
    assert result.structured_content is not None
    assert (len(result.structured_content["issues"]), result.structured_content["truncated"]) == (1, False)


async def test_get_issue_returns_the_body_cut_to_its_bound() -> None:
    api = ScriptedApi([ok(issue(7, body="x" * (BODY_CHARS + 10), state_reason=None, closed_at=None))])
    async with running(source("github", api)) as github:
        result = await call(github, "get_issue", {"owner": "acme", "repo": "app", "number": 7})
    assert (api.last.method, api.last.url.path) == ("GET", "/repos/acme/app/issues/7")
    assert result.structured_content is not None
    assert len(result.structured_content["body"]) == BODY_CHARS
    assert result.structured_content["body_truncated"] is True
    assert "node_id" not in result.structured_content and "reactions" not in result.structured_content


async def test_create_issue_posts_the_body_with_its_invocation_marker_and_idempotency_key() -> None:
    api = ScriptedApi([ok(issue(12, title="Crash on save"), status=201)])
    async with running(source("github", api)) as github:
        result = await call(
            github,
            "create_issue",
            {"owner": "acme", "repo": "app", "title": "Crash on save", "body": "Steps: save.", "labels": ["bug"]},
        )
    assert (api.last.method, api.last.url.path, query_of(api.last)) == ("POST", "/repos/acme/app/issues", {})
    assert_github_headers(api.last, mutating=True)
    assert body_of(api.last) == {"title": "Crash on save", "body": f"Steps: save.\n\n{MARKER}", "labels": ["bug"]}
    assert result.structured_content == {
        "number": 12,
        "title": "Crash on save",
        "state": "open",
        "url": "https://github.com/acme/app/issues/12",
    }
    assert not result.is_error


async def test_the_marker_carries_a_tag_keyed_with_the_marker_key_that_the_invocation_id_alone_cannot_give() -> None:
    assert MARKER.startswith("<!-- bastion:invocation inv-1 ") and MARKER.endswith(" -->")
    assert MARKER != "<!-- bastion:invocation inv-1 -->", "the old, unkeyed marker"
    assert marker("inv-1", tag_of(b"another key" * 3, "inv-1")) != MARKER
    assert len(tag_of(MARKER_KEY, "inv-1")) == 32


async def test_a_provider_without_the_marker_key_refuses_to_mark_or_look_up_before_sending_anything() -> None:
    api = ScriptedApi([ok([])])
    unkeyed = provider_source("github", ProviderConfig.model_validate({"token": CANARY}), transport=api.transport)
    async with running(unkeyed) as github:
        await call(github, "list_issues", {"owner": "acme", "repo": "app"})
        with pytest.raises(ConnectorUnavailable):
            await call(github, "create_issue", {"owner": "acme", "repo": "app", "title": "t"})
        with pytest.raises(ConnectorUnavailable):
            await looked_up(github, "create_issue", {"owner": "acme", "repo": "app", "title": "t"})
    assert [r.method for r in api.requests] == ["GET"], "only the read was sent"


async def test_a_look_up_accepts_only_its_keyed_marker_on_what_the_token_s_user_made_where_and_when_the_call_did() -> (
    None
):
    now = "2099-01-01T00:00:00Z"  # the window of the call below ends long before
    mine = {"user": ME, "repository_url": f"{API}/repos/acme/app", "created_at": now}
    elsewhere = issue(4, body=MARKER, **mine | {"repository_url": f"{API}/repos/acme/other"})
    api = ScriptedApi([ok([issue(3, body="nothing"), elsewhere]), ok(ME)])
    async with running(source("github", api)) as github:
        found = await looked_up(github, "create_issue", {"owner": "acme", "repo": "app", "title": "t"})
    assert found is not None and not found.accepted and found.reason is not None
    assert "acme/other" in found.reason and "outside the call's window" in found.reason
    assert (found.creator, found.created_at, found.result["number"]) == ("bastion-bot", now, 4)
    assert [r.url.path for r in api.requests] == ["/repos/acme/app/issues", "/user"]


async def test_an_issue_created_without_a_body_carries_only_the_marker() -> None:
    api = ScriptedApi([ok(issue(13), status=201)])
    async with running(source("github", api)) as github:
        await call(github, "create_issue", {"owner": "acme", "repo": "app", "title": "t", "assignees": ["hubot"]})
    assert body_of(api.last) == {"title": "t", "body": MARKER, "assignees": ["hubot"]}


async def test_comment_on_issue_posts_the_comment_with_its_marker() -> None:
    comment = {"id": 99, "html_url": "https://github.com/acme/app/issues/7#issuecomment-99", "created_at": "now"}
    api = ScriptedApi([ok(comment, status=201)])
    async with running(source("github", api)) as github:
        result = await call(github, "comment_on_issue", {"owner": "acme", "repo": "app", "number": 7, "body": "LGTM"})
    assert (api.last.method, api.last.url.path) == ("POST", "/repos/acme/app/issues/7/comments")
    assert_github_headers(api.last, mutating=True)
    assert body_of(api.last) == {"body": f"LGTM\n\n{MARKER}"}
    assert result.structured_content == {
        "id": 99,
        "url": "https://github.com/acme/app/issues/7#issuecomment-99",
        "created_at": "now",
    }


async def test_close_issue_patches_its_state_and_reason() -> None:
    api = ScriptedApi([ok(issue(7, state="closed", state_reason="not_planned"))])
    async with running(source("github", api)) as github:
        result = await call(
            github, "close_issue", {"owner": "acme", "repo": "app", "number": 7, "reason": "not_planned"}
        )
    assert (api.last.method, api.last.url.path) == ("PATCH", "/repos/acme/app/issues/7")
    assert_github_headers(api.last, mutating=True)
    assert body_of(api.last) == {"state": "closed", "state_reason": "not_planned"}
    assert result.structured_content == {
        "number": 7,
        "state": "closed",
        "state_reason": "not_planned",
        "url": "https://github.com/acme/app/issues/7",
    }


async def test_list_and_get_pull_requests() -> None:
    details = pull(
        5, merged=False, mergeable=True, mergeable_state="clean", additions=3, deletions=1, changed_files=2, body=None
    )
    api = ScriptedApi([ok([pull(5), pull(6)]), ok(details)])
    async with running(source("github", api)) as github:
        listed = await call(github, "list_pull_requests", {"owner": "acme", "repo": "app", "base": "main", "limit": 2})
        got = await call(github, "get_pull_request", {"owner": "acme", "repo": "app", "number": 5})
    listing, single = api.requests
    assert (listing.method, listing.url.path) == ("GET", "/repos/acme/app/pulls")
    assert query_of(listing) == {
        "state": "open",
        "base": "main",
        "sort": "updated",
        "direction": "desc",
        "per_page": "2",
    }
    assert (single.method, single.url.path) == ("GET", "/repos/acme/app/pulls/5")
    assert listed.structured_content is not None
    assert listed.structured_content["pull_requests"][1] == {
        "number": 6,
        "title": "pr 6",
        "state": "open",
        "draft": False,
        "author": "octocat",
        "head": "feature",
        "base": "main",
        "url": "https://github.com/acme/app/pull/6",
        "created_at": "2025-01-01T00:00:00Z",
        "updated_at": "2025-01-02T00:00:00Z",
    }
    assert got.structured_content is not None
    assert (got.structured_content["head_sha"], got.structured_content["mergeable"]) == ("a" * 40, True)
    assert (got.structured_content["body"], got.structured_content["changed_files"]) == ("", 2)


async def test_merge_pull_request_puts_the_method_and_the_expected_head() -> None:
    api = ScriptedApi([ok({"sha": "c" * 40, "merged": True, "message": "Pull Request successfully merged"})])
    async with running(source("github", api)) as github:
        result = await call(
            github,
            "merge_pull_request",
            {"owner": "acme", "repo": "app", "number": 5, "merge_method": "squash", "sha": "a" * 40},
        )
    assert (api.last.method, api.last.url.path) == ("PUT", "/repos/acme/app/pulls/5/merge")
    assert_github_headers(api.last, mutating=True)
    assert body_of(api.last) == {"merge_method": "squash", "sha": "a" * 40}
    assert result.structured_content == {"merged": True, "sha": "c" * 40, "message": "Pull Request successfully merged"}


async def test_github_enterprise_requests_go_under_its_base_url() -> None:
    api = ScriptedApi([ok([])])
    async with running(source("ghe", api, kind="github", base_url="https://ghe.example.com/api/v3/")) as ghe:
        await call(ghe, "list_issues", {"owner": "acme", "repo": "app"})
    assert str(api.last.url).startswith("https://ghe.example.com/api/v3/repos/acme/app/issues?")


async def test_each_action_declares_its_risk_and_whether_a_retry_is_safe() -> None:
    async with running(source("github", ScriptedApi([ok({})]))) as github:
        specs = github.actions()
    declared = {spec.action_id: (spec.risk, spec.idempotency_key, spec.reconcile) for spec in specs}
    assert declared == {
        "list_issues": ("read", False, "manual"),
        "get_issue": ("read", False, "manual"),
        "create_issue": ("write", False, "lookup"),
        "comment_on_issue": ("write", False, "lookup"),
        "close_issue": ("write", True, "manual"),
        "list_pull_requests": ("read", False, "manual"),
        "get_pull_request": ("read", False, "manual"),
        "merge_pull_request": ("danger", True, "manual"),
    }
    for spec in specs:
        assert spec.tool.output_schema is not None and spec.tool.input_schema["additionalProperties"] is False
        assert spec.tool.annotations is not None
        assert spec.tool.annotations.destructive_hint is (spec.risk == "danger")
        assert spec.tool.annotations.read_only_hint is (spec.risk == "read")


@pytest.mark.parametrize(
    "elsewhere",
    ["https://evil.example/steal?page=2", "http://api.github.com/repositories/1/issues?page=2", "//evil.example/x"],
)
async def test_a_next_page_on_another_origin_is_never_requested_with_the_token(elsewhere: str) -> None:
    api = ScriptedApi([ok([issue(1)], headers={"link": f'<{elsewhere}>; rel="next"'}), ok([issue(2)])])
    async with running(source("github", api)) as github:
        with pytest.raises(UpstreamError, match="another origin"):
            await call(github, "list_issues", {"owner": "acme", "repo": "app", "limit": 5})
    (only,) = api.requests  # the second page was never asked for
    assert only.url.host == "api.github.com"
