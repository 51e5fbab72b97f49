"""GitHub's REST API (github.com, or GitHub Enterprise Server with `base_url = "https://HOST/api/v3"`).

Risks: the lists and gets are `read`; creating an issue, commenting and closing an issue are `write` (a person
can edit, delete or reopen them); merging a pull request is `danger` (it changes the base branch for everyone,
and undoing it takes a revert). What Bastion creates carries a hidden marker with the invocation id and its keyed
tag (`<!-- bastion:invocation ID TAG -->` at the end of the body, see `evidence.py`), so an `unknown` outcome can
be settled by looking for it (`bastion invocations reconcile ID --check`); every mutating request also sends the
id as `Idempotency-Key`.

A look-up lists the repository's issues (or the issue's comments) updated since the call began, newest first (a
list, not the search API, whose index lags), and keeps those whose body carries the invocation's marker. One is
accepted, and the call completed, only when its tag verifies, it was made by the token's own user (`GET /user`,
by id), it is in the repository (the issue) the call named, and it was made within the call's window. Any other
(the old unkeyed marker, which anyone who knows the invocation id can write; a copied marker on an object of
another user, place or time) is answered not accepted, saying why, and the call stays unknown. Not found leaves
it unknown too: anyone with write access can edit the marker out of a body or delete what was made, and the list
is bounded (`api.MAX_PAGES` pages), so GitHub cannot say for certain that a call never acted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AliasPath, BeforeValidator, Field

from bastion.actions import Found
from bastion.config import ProviderConfig
from bastion.sources.providers.api import MAX_PAGES, Api, Json
from bastion.sources.providers.base import Output, Params, ProviderAction, ProviderDefinition, arguments_for
from bastion.sources.providers.evidence import Candidate, Window, moment, verdict

DEFAULT_BASE_URL: Final = "https://api.github.com"
API_VERSION: Final = "2022-11-28"
BODY_CHARS: Final = 4000
"""How much of an issue's or pull request's body a `get` returns (`body_truncated` says when it cut)."""

_NAME: Final = r"^(?!\.\.?$)[A-Za-z0-9_.-]+$"
"""An owner or repository name: never `.` or `..`, never a `/` (it goes into the URL path)."""

Owner = Annotated[str, Field(pattern=_NAME, max_length=100, description="The account that owns the repository.")]
Repo = Annotated[str, Field(pattern=_NAME, max_length=100, description="The repository name, without the owner.")]
Number = Annotated[int, Field(ge=1, description="The issue or pull request number.")]
Limit = Annotated[int, Field(ge=1, le=500, description="At most this many, newest activity first.")]


def marker(invocation_id: str, tag: str) -> str:
    """The hidden footer that ties what Bastion wrote to its invocation: its id and keyed tag (`Api.tag`)."""
    return f"<!-- bastion:invocation {invocation_id} {tag} -->"


def with_marker(body: str | None, api: Api) -> str:
    """The body with the call's marker as its last line."""
    footer = marker(api.correlation_id, api.tag)
    return f"{body}\n\n{footer}" if body else footer


def _markers_of(invocation_id: str) -> re.Pattern[str]:
    """The invocation's markers in a body: the keyed form (its tag captured) and the old one without a tag."""
    return re.compile(rf"<!-- bastion:invocation {re.escape(invocation_id)}(?: (\S+))? -->")


def _field_of(key: str) -> Any:
    """A validator reading a list of objects (GitHub's users, labels) as the list of their `key`."""

    def read(value: Any) -> Any:
        if not isinstance(value, list):
            return value
        return [item.get(key) if isinstance(item, dict) else item for item in value]

    return read


Logins = Annotated[list[str], BeforeValidator(_field_of("login"))]
Labels = Annotated[list[str], BeforeValidator(_field_of("name"))]


# -- results


class IssueSummary(Output):
    number: int
    title: str
    state: str
    author: str | None = Field(default=None, validation_alias=AliasPath("user", "login"))
    labels: Labels = Field(default_factory=list)
    assignees: Logins = Field(default_factory=list)
    comments: int = 0
    url: str = Field(validation_alias="html_url")
    created_at: str
    updated_at: str


class Issue(IssueSummary):
    body: str = ""
    body_truncated: bool = False
    state_reason: str | None = None
    closed_at: str | None = None


class IssueList(Output):
    issues: list[IssueSummary]
    truncated: bool = Field(description="More matched than were returned: narrow the filters or raise limit.")


class CreatedIssue(Output):
    number: int
    title: str
    state: str
    url: str = Field(validation_alias="html_url")


class Comment(Output):
    id: int
    url: str = Field(validation_alias="html_url")
    created_at: str


class ClosedIssue(Output):
    number: int
    state: str
    state_reason: str | None = None
    url: str = Field(validation_alias="html_url")


class PullSummary(Output):
    number: int
    title: str
    state: str
    draft: bool = False
    author: str | None = Field(default=None, validation_alias=AliasPath("user", "login"))
    head: str = Field(validation_alias=AliasPath("head", "ref"))
    base: str = Field(validation_alias=AliasPath("base", "ref"))
    url: str = Field(validation_alias="html_url")
    created_at: str
    updated_at: str


class Pull(PullSummary):
    head_sha: str = Field(validation_alias=AliasPath("head", "sha"))
    merged: bool = False
    mergeable: bool | None = None
    mergeable_state: str | None = None
    additions: int = 0
    deletions: int = 0
    changed_files: int = 0
    body: str = ""
    body_truncated: bool = False


class PullList(Output):
    pull_requests: list[PullSummary]
    truncated: bool = Field(description="More matched than were returned: narrow the filters or raise limit.")


class Merge(Output):
    merged: bool
    sha: str | None = None
    message: str = ""


def _cut(data: dict[str, Any]) -> dict[str, Any]:
    """The answer with its body cut to BODY_CHARS (and `body_truncated` set)."""
    body = data.get("body") or ""
    return {**data, "body": body[:BODY_CHARS], "body_truncated": len(body) > BODY_CHARS}


# -- params


class RepoParams(Params):
    owner: Owner
    repo: Repo

    @property
    def path(self) -> str:
        return f"/repos/{self.owner}/{self.repo}"


class ListIssues(RepoParams):
    state: Literal["open", "closed", "all"] = "open"
    labels: list[str] = Field(default_factory=list, description="Only issues with all of these labels.")
    assignee: str | None = Field(default=None, description='A login, "none" or "*".')
    limit: Limit = 30


class GetIssue(RepoParams):
    number: Number


class CreateIssue(RepoParams):
    title: str = Field(min_length=1, max_length=256)
    body: str | None = Field(default=None, description="Markdown.", max_length=60000)
    labels: list[str] = Field(default_factory=list)
    assignees: list[str] = Field(default_factory=list, description="Logins.")


class CommentOnIssue(RepoParams):
    number: Number
    body: str = Field(min_length=1, max_length=60000, description="Markdown.")


class CloseIssue(RepoParams):
    number: Number
    reason: Literal["completed", "not_planned"] = "completed"


class ListPullRequests(RepoParams):
    state: Literal["open", "closed", "all"] = "open"
    base: str | None = Field(default=None, description="Only pull requests into this branch.")
    limit: Limit = 30


class GetPullRequest(RepoParams):
    number: Number


class MergePullRequest(RepoParams):
    number: Number
    merge_method: Literal["merge", "squash", "rebase"] = "merge"
    sha: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$",
        description="Merge only if the head is still this commit (from get_pull_request's head_sha).",
    )
    commit_title: str | None = None
    commit_message: str | None = None


# -- execution


async def list_issues(api: Api, params: ListIssues) -> IssueList:
    query = {
        "state": params.state,
        "labels": ",".join(params.labels) or None,
        "assignee": params.assignee,
        "sort": "updated",
        "direction": "desc",
        "per_page": min(params.limit, 100),
    }
    items, truncated = await api.pages(
        f"{params.path}/issues", params=query, limit=params.limit, keep=lambda item: "pull_request" not in item
    )
    return api.parse(IssueList, {"issues": items, "truncated": truncated})


async def get_issue(api: Api, params: GetIssue) -> Issue:
    return api.parse(Issue, _cut(await api.json("GET", f"{params.path}/issues/{params.number}")))


async def create_issue(api: Api, params: CreateIssue) -> CreatedIssue:
    body: dict[str, Any] = {"title": params.title, "body": with_marker(params.body, api)}
    if params.labels:
        body["labels"] = params.labels
    if params.assignees:
        body["assignees"] = params.assignees
    return api.parse(CreatedIssue, await api.json("POST", f"{params.path}/issues", body=body))


async def comment_on_issue(api: Api, params: CommentOnIssue) -> Comment:
    path = f"{params.path}/issues/{params.number}/comments"
    return api.parse(Comment, await api.json("POST", path, body={"body": with_marker(params.body, api)}))


async def close_issue(api: Api, params: CloseIssue) -> ClosedIssue:
    body = {"state": "closed", "state_reason": params.reason}
    return api.parse(ClosedIssue, await api.json("PATCH", f"{params.path}/issues/{params.number}", body=body))


async def list_pull_requests(api: Api, params: ListPullRequests) -> PullList:
    query = {
        "state": params.state,
        "base": params.base,
        "sort": "updated",
        "direction": "desc",
        "per_page": min(params.limit, 100),
    }
    path = f"{params.path}/pulls"
    items, truncated = await api.pages(path, params=query, limit=params.limit)
    return api.parse(PullList, {"pull_requests": items, "truncated": truncated})


async def get_pull_request(api: Api, params: GetPullRequest) -> Pull:
    path = f"{params.path}/pulls/{params.number}"
    return api.parse(Pull, _cut(await api.json("GET", path)))


async def merge_pull_request(api: Api, params: MergePullRequest) -> Merge:
    body = params.model_dump(include={"merge_method", "sha", "commit_title", "commit_message"}, exclude_none=True)
    path = f"{params.path}/pulls/{params.number}/merge"
    return api.parse(Merge, await api.json("PUT", path, body=body))


# -- look-ups (see the module docstring)


class _User(Output):
    login: str
    id: int


def _since(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def _marked(api: Api, path: str, query: dict[str, Any]) -> list[Json]:
    """The items of a list (every page, up to MAX_PAGES) whose body carries the call's marker, keyed or not."""
    markers = _markers_of(api.correlation_id)

    def carries(item: Json) -> bool:
        return isinstance(item, dict) and markers.search(item.get("body") or "") is not None

    found, _ = await api.pages(path, params={**query, "per_page": 100}, limit=100 * MAX_PAGES, keep=carries)
    return found


def _refuted(api: Api, item: Json, me: _User, window: Window, *, place: str, named: str) -> list[str]:
    """What refutes that the call made `item`: its marker's tag, its creator, its place (the URL in its field
    `named` must end with `place`, the call's API path), its creation time."""
    refuted = []
    tags = [match.group(1) for match in _markers_of(api.correlation_id).finditer(item.get("body") or "")]
    if not any(api.verifies(tag) for tag in tags):
        refuted.append(
            "its marker is not keyed by this Bastion (the old unkeyed form, or a forged tag): anyone who knows the "
            "invocation id can write it"
        )
    user = _user_of(item)
    if user.get("id") != me.id:
        refuted.append(f"it was made by {user.get('login') or 'an unknown user'}, not by the token's user {me.login}")
    url = item.get(named)
    if not (isinstance(url, str) and url.lower().endswith(place.lower())):
        refuted.append(
            f"it is at {url or 'an unknown place'}, not in {place.removeprefix('/repos/')} as the call named"
        )
    if "pull_request" in item:
        refuted.append("it is a pull request, which no call of Bastion makes")
    elsewhen = window.refutes(moment(item.get("created_at")), item.get("created_at"))
    if elsewhen is not None:
        refuted.append(elsewhen)
    return refuted


def _user_of(item: Json) -> dict[str, Any]:
    user = item.get("user")
    return user if isinstance(user, dict) else {}


async def _judged(
    api: Api,
    items: Sequence[Json],
    window: Window,
    *,
    place: str,
    named: str,
    read: Callable[[Json], tuple[str, dict[str, Any]]],
) -> Found | None:
    """The verdict on the marked items (`evidence.verdict`), each `read` as where it is and what the call would
    have returned; the token's user is asked only when there are any."""
    if not items:
        return None
    me = api.parse(_User, await api.json("GET", "/user"))
    candidates = []
    for item in items:
        where, result = read(item)
        refuted = _refuted(api, item, me, window, place=place, named=named)
        candidates.append(Candidate(where, result, _user_of(item).get("login"), item.get("created_at"), refuted))
    return verdict(candidates)


async def find_issue(api: Api, arguments: Mapping[str, Any], window: Window) -> Found | None:
    """The issue a `create_issue` call opened, by its marker among the repository's issues updated since the call
    began, judged as the module docstring says."""
    repo = arguments_for(api, RepoParams, arguments)
    query = {"state": "all", "sort": "created", "direction": "desc", "since": _since(window.start)}
    items = await _marked(api, f"{repo.path}/issues", query)

    def read(item: Json) -> tuple[str, dict[str, Any]]:
        issue = api.parse(CreatedIssue, item)
        return f"issue {repo.owner}/{repo.repo}#{issue.number} ({issue.url})", issue.model_dump()

    return await _judged(api, items, window, place=repo.path, named="repository_url", read=read)


async def find_comment(api: Api, arguments: Mapping[str, Any], window: Window) -> Found | None:
    """The comment a `comment_on_issue` call added, by its marker among the issue's comments since the call began,
    judged as the module docstring says."""
    issue = arguments_for(api, GetIssue, arguments)
    path = f"{issue.path}/issues/{issue.number}"
    items = await _marked(api, f"{path}/comments", {"since": _since(window.start)})

    def read(item: Json) -> tuple[str, dict[str, Any]]:
        comment = api.parse(Comment, item)
        return f"comment {comment.id} ({comment.url})", comment.model_dump()

    return await _judged(api, items, window, place=path, named="issue_url", read=read)


ACTIONS: Final[tuple[ProviderAction[Any], ...]] = (
    ProviderAction(
        "list_issues",
        "List GitHub issues",
        "List a repository's issues (pull requests left out), most recently updated first, with their number, "
        "title, state, author, labels and comment count. Use get_issue for one issue's body.",
        "read",
        ListIssues,
        IssueList,
        list_issues,
    ),
    ProviderAction(
        "get_issue",
        "Get a GitHub issue",
        f"One issue with its body (the first {BODY_CHARS} characters), labels, assignees and state.",
        "read",
        GetIssue,
        Issue,
        get_issue,
    ),
    ProviderAction(
        "create_issue",
        "Create a GitHub issue",
        "Open a new issue in a repository. Returns its number and URL. Needs approval by default.",
        "write",
        CreateIssue,
        CreatedIssue,
        create_issue,
        look_up=find_issue,
    ),
    ProviderAction(
        "comment_on_issue",
        "Comment on a GitHub issue or pull request",
        "Add a comment (Markdown) to an issue or pull request, by its number.",
        "write",
        CommentOnIssue,
        Comment,
        comment_on_issue,
        look_up=find_comment,
    ),
    ProviderAction(
        "close_issue",
        "Close a GitHub issue",
        'Close an issue as "completed" (default) or "not_planned". It can be reopened.',
        "write",
        CloseIssue,
        ClosedIssue,
        close_issue,
        idempotency_key=True,
    ),
    ProviderAction(
        "list_pull_requests",
        "List GitHub pull requests",
        "List a repository's pull requests, most recently updated first, with their head and base branches.",
        "read",
        ListPullRequests,
        PullList,
        list_pull_requests,
    ),
    ProviderAction(
        "get_pull_request",
        "Get a GitHub pull request",
        "One pull request with its head commit (head_sha), whether it is merged or mergeable, its size and body.",
        "read",
        GetPullRequest,
        Pull,
        get_pull_request,
    ),
    ProviderAction(
        "merge_pull_request",
        "Merge a GitHub pull request",
        "Merge a pull request into its base branch (merge, squash or rebase). Pass sha (head_sha from "
        "get_pull_request) so that only the reviewed commit is merged. Denied unless a policy allows it.",
        "danger",
        MergePullRequest,
        Merge,
        merge_pull_request,
        idempotency_key=True,
    ),
)


def auth_headers(token: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": API_VERSION,
    }


def definition(config: ProviderConfig) -> ProviderDefinition:
    return ProviderDefinition("github", DEFAULT_BASE_URL, auth_headers, ACTIONS)
