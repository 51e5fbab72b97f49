"""Sentry's REST API (sentry.io, or a self-hosted Sentry with `base_url`), for one organization.

Risks: listing issues is `read`; resolving an issue is `write` (it can be unresolved, and Sentry reopens it by
itself when the error comes back). Resolving sets a state, so it is safe to repeat; its request sends the
invocation id as `Idempotency-Key`. Nothing here is looked up (no `look_up`): resolving marks nothing a look-up
could tell from a person's resolve, so an `unknown` outcome is settled by hand (`--outcome`), after a look at the
issue.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import AliasPath, BeforeValidator, Field

from bastion.config import ProviderConfig
from bastion.sources.providers.api import Api
from bastion.sources.providers.base import Output, Params, ProviderAction, ProviderDefinition

DEFAULT_BASE_URL: Final = "https://sentry.io"


def _count(value: Any) -> Any:
    """Sentry sends event counts as strings."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


# -- results


class Issue(Output):
    id: str
    short_id: str | None = Field(default=None, validation_alias="shortId")
    title: str
    culprit: str | None = None
    level: str | None = None
    status: str
    project: str | None = Field(default=None, validation_alias=AliasPath("project", "slug"))
    events: Annotated[int | None, BeforeValidator(_count)] = Field(default=None, validation_alias="count")
    users: int | None = Field(default=None, validation_alias="userCount")
    first_seen: str | None = Field(default=None, validation_alias="firstSeen")
    last_seen: str | None = Field(default=None, validation_alias="lastSeen")
    url: str | None = Field(default=None, validation_alias="permalink")


class IssueList(Output):
    issues: list[Issue]
    truncated: bool = Field(description="More matched than were returned: narrow the query or raise limit.")


class Resolved(Output):
    id: str
    status: str
    url: str | None = Field(default=None, validation_alias="permalink")


# -- params


class ListIssues(Params):
    project: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_-]+$", description="Only this project, by slug (default: every project)."
    )
    query: str = Field(default="is:unresolved", description="Sentry search syntax, e.g. 'is:unresolved level:error'.")
    sort: str = Field(default="date", pattern=r"^(date|new|freq|user)$", description="date, new, freq or user.")
    limit: int = Field(default=25, ge=1, le=500, description="At most this many.")


class ResolveIssue(Params):
    issue_id: str = Field(pattern=r"^[0-9]+$", description="The numeric issue id (id from list_issues).")


# -- execution


def definition(config: ProviderConfig) -> ProviderDefinition:
    """Sentry's actions for the configured organization (the loader requires one)."""
    organization = config.organization or ""

    async def list_issues(api: Api, params: ListIssues) -> IssueList:
        if params.project is not None:
            path = f"/api/0/projects/{organization}/{params.project}/issues/"
        else:
            path = f"/api/0/organizations/{organization}/issues/"
        query = {"query": params.query, "sort": params.sort, "limit": min(params.limit, 100)}
        items, truncated = await api.pages(path, params=query, limit=params.limit)
        return api.parse(IssueList, {"issues": items, "truncated": truncated})

    async def resolve_issue(api: Api, params: ResolveIssue) -> Resolved:
        path = f"/api/0/organizations/{organization}/issues/{params.issue_id}/"
        answer = await api.json("PUT", path, body={"status": "resolved"})
        return api.parse(Resolved, {"id": params.issue_id, **answer} if isinstance(answer, dict) else answer)

    actions: tuple[ProviderAction[Any], ...] = (
        ProviderAction(
            "list_issues",
            "List Sentry issues",
            f"List the issues of the {organization} organization (or one project), unresolved ones by default, "
            "with their short id, title, level, status, event and user counts, last seen time and URL.",
            "read",
            ListIssues,
            IssueList,
            list_issues,
        ),
        ProviderAction(
            "resolve_issue",
            "Resolve a Sentry issue",
            "Mark an issue resolved, by its numeric id. Sentry reopens it if the error happens again.",
            "write",
            ResolveIssue,
            Resolved,
            resolve_issue,
            idempotency_key=True,
        ),
    )
    return ProviderDefinition("sentry", DEFAULT_BASE_URL, auth_headers, actions)


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
