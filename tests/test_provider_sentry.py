"""Sentry provider actions: the exact requests each one sends (its organization from the configuration)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.providers import CANARY, ScriptedApi, body_of, call, ok, query_of, running, source

pytestmark = pytest.mark.anyio

ORG: dict[str, Any] = {"organization": "acme"}


def issue(issue_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": issue_id,
        "shortId": f"APP-{issue_id}",
        "title": "ZeroDivisionError: division by zero",
        "culprit": "app.views in total",
        "level": "error",
        "status": "unresolved",
        "project": {"id": "2", "slug": "app", "name": "App"},
        "count": "1520",
        "userCount": 17,
        "firstSeen": "2025-01-01T00:00:00Z",
        "lastSeen": "2025-01-02T00:00:00Z",
        "permalink": f"https://acme.sentry.io/issues/{issue_id}/",
        "metadata": {"type": "ZeroDivisionError"},
        **extra,
    }


async def test_list_issues_asks_the_organization_and_follows_cursor_links_while_sentry_says_there_are_results() -> None:
    base = "https://sentry.io/api/0/organizations/acme/issues/"
    more = (
        f'<{base}?cursor=0:0:1>; rel="previous"; results="false"; cursor="0:0:1", '
        f'<{base}?cursor=0:2:0>; rel="next"; results="true"; cursor="0:2:0"'
    )
    done = f'<{base}?cursor=0:2:1>; rel="previous"; results="true", <{base}?cursor=0:4:0>; rel="next"; results="false"'
    api = ScriptedApi([ok([issue("1"), issue("2")], headers={"link": more}), ok([issue("3")], headers={"link": done})])
    async with running(source("sentry", api, **ORG)) as sentry:
        result = await call(sentry, "list_issues", {"query": "is:unresolved level:error", "limit": 10})
    first, second = api.requests
    assert (first.method, first.url.path) == ("GET", "/api/0/organizations/acme/issues/")
    assert query_of(first) == {"query": "is:unresolved level:error", "sort": "date", "limit": "10"}
    assert first.headers["authorization"] == f"Bearer {CANARY}"
    assert "idempotency-key" not in first.headers
    assert str(second.url) == f"{base}?cursor=0:2:0"
    assert result.structured_content is not None
    assert result.structured_content["truncated"] is False
    assert result.structured_content["issues"][0] == {
        "id": "1",
        "short_id": "APP-1",
        "title": "ZeroDivisionError: division by zero",
        "culprit": "app.views in total",
        "level": "error",
        "status": "unresolved",
        "project": "app",
        "events": 1520,
        "users": 17,
        "first_seen": "2025-01-01T00:00:00Z",
        "last_seen": "2025-01-02T00:00:00Z",
        "url": "https://acme.sentry.io/issues/1/",
    }


async def test_list_issues_of_one_project_on_a_self_hosted_sentry() -> None:
    api = ScriptedApi([ok([issue("1")])])
    async with running(source("sentry", api, base_url="https://sentry.internal", **ORG)) as sentry:
        await call(sentry, "list_issues", {"project": "app", "limit": 1})
    assert str(api.last.url).startswith("https://sentry.internal/api/0/projects/acme/app/issues/?")
    assert query_of(api.last) == {"query": "is:unresolved", "sort": "date", "limit": "1"}


async def test_resolve_issue_puts_the_resolved_status() -> None:
    api = ScriptedApi([ok(issue("42", status="resolved"))])
    async with running(source("sentry", api, **ORG)) as sentry:
        result = await call(sentry, "resolve_issue", {"issue_id": "42"})
    assert (api.last.method, api.last.url.path) == ("PUT", "/api/0/organizations/acme/issues/42/")
    assert api.last.headers["idempotency-key"] == "inv-1"
    assert body_of(api.last) == {"status": "resolved"}
    assert result.structured_content == {"id": "42", "status": "resolved", "url": "https://acme.sentry.io/issues/42/"}


async def test_each_action_declares_its_risk_and_whether_a_retry_is_safe() -> None:
    async with running(source("sentry", ScriptedApi([ok({})]), **ORG)) as sentry:
        specs = sentry.actions()
    assert {s.action_id: (s.risk, s.idempotency_key, s.reconcile) for s in specs} == {
        "list_issues": ("read", False, "manual"),
        "resolve_issue": ("write", True, "manual"),
    }
    assert all("acme" in (s.tool.description or "") for s in specs if s.action_id == "list_issues")
