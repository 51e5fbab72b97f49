"""Linear's GraphQL API (`POST {base_url}/graphql`).

Risks: listing issues is `read`; creating and updating an issue are `write` (a person can edit, move or delete
them). A created issue gets an id derived from the invocation id by a keyed HMAC (`issue_id_for`, under the
marker key of `evidence.py`; a UUID in the v4 format Linear asks for), so Linear refuses a second creation of the
same call and an `unknown` outcome can be settled by asking for that id (`bastion invocations reconcile ID
--check`); an update sets values, so it is safe to repeat. Mutations also send the invocation id as
`Idempotency-Key`.

The look-up asks for the issue with that id, and with the id the invocation would have had before ids were keyed
(`unkeyed_issue_id_for`: anyone who knows the invocation id can create that one), archived and trashed issues
included, together with the token's own user (`viewer`). The issue is accepted, and the call completed, only when
it has the keyed id, its creator is the token's user, it is in the team the call named, and it was made within
the call's window; any other is answered not accepted, saying why, and the call stays unknown. Not found is
authoritative: nobody without the key can create an issue with the keyed id before the call does, so the call
failed (it never created its issue). Only an issue deleted for good from the trash would read as never created;
check by hand (`--outcome`) if someone may have done that.

GraphQL answers errors in the body (often with HTTP 200): an error with code `RATELIMITED` is `rate_limited`,
any other is `upstream_error`.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping
from typing import Any, Final

from pydantic import AliasPath, Field

from bastion.actions import Found
from bastion.config import ProviderConfig
from bastion.errors import RateLimited, UpstreamError
from bastion.sources.providers.api import Api, Json, check_status, retry_after
from bastion.sources.providers.base import Output, Params, ProviderAction, ProviderDefinition, arguments_for
from bastion.sources.providers.evidence import Candidate, Window, keyed_digest, moment, verdict

DEFAULT_BASE_URL: Final = "https://api.linear.app"
GRAPHQL_PATH: Final = "/graphql"
ISSUE_ID_PURPOSE: Final = b"bastion linear issue id"
"""What the keyed HMAC of an invocation id is taken for when it becomes the id of the issue it creates."""
UNKEYED_ISSUE_ID_SALT: Final = b"bastion:linear-issue:"
"""Hashed before an invocation id into the id of the issue it created, before ids were keyed."""
PAGE_SIZE: Final = 50

_UUID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
_ISSUE_FIELDS: Final = "id identifier title url priority updatedAt state { name } assignee { name } team { key }"


def issue_id_for(marker_key: bytes, invocation_id: str) -> str:
    """The id of the issue an invocation creates: the same for every attempt of the same call, and a valid UUID v4
    (Linear checks the version), its random bits taken from a keyed HMAC of the invocation id (nobody without the
    marker key can tell it in advance)."""
    digest = keyed_digest(marker_key, ISSUE_ID_PURPOSE, invocation_id)
    return str(uuid.UUID(bytes=digest[:16], version=4))


def unkeyed_issue_id_for(invocation_id: str) -> str:
    """The id an invocation's issue got before ids were keyed: a public hash of the invocation id. A look-up still
    reads it, to say what it found, but never accepts it."""
    digest = hashlib.sha256(UNKEYED_ISSUE_ID_SALT + invocation_id.encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


# -- results


class Issue(Output):
    id: str
    identifier: str = Field(description='Its key, e.g. "ENG-123".')
    title: str
    url: str
    state: str | None = Field(default=None, validation_alias=AliasPath("state", "name"))
    assignee: str | None = Field(default=None, validation_alias=AliasPath("assignee", "name"))
    team: str | None = Field(default=None, validation_alias=AliasPath("team", "key"))
    priority: int | None = Field(default=None, description="0 none, 1 urgent, 2 high, 3 medium, 4 low.")
    updated_at: str | None = Field(default=None, validation_alias="updatedAt")


class IssueList(Output):
    issues: list[Issue]
    truncated: bool = Field(description="More matched than were returned: narrow the filters or raise limit.")


class _Node(Output):
    id: str


class _Nodes(Output):
    nodes: list[_Node]


class _Issues(Output):
    nodes: list[Issue]


class _IssueStates(Output):
    states: _Nodes = Field(validation_alias=AliasPath("team", "states"))


# -- params


class ListIssues(Params):
    team: str | None = Field(default=None, description='Only this team, by key (e.g. "ENG").')
    state: str | None = Field(default=None, description='Only issues in this workflow state (e.g. "In Progress").')
    assignee_email: str | None = Field(default=None, description="Only issues assigned to this person.")
    title_contains: str | None = Field(default=None, description="Only issues whose title contains this text.")
    limit: int = Field(default=30, ge=1, le=250, description="At most this many, most recently updated first.")


class CreateIssue(Params):
    team: str = Field(min_length=1, description='The team, by key (e.g. "ENG") or id.')
    title: str = Field(min_length=1, max_length=255)
    description: str | None = Field(default=None, description="Markdown.")
    priority: int | None = Field(default=None, ge=0, le=4, description="0 none, 1 urgent, 2 high, 3 medium, 4 low.")
    assignee_id: str | None = None
    label_ids: list[str] = Field(default_factory=list)


class UpdateIssue(Params):
    issue: str = Field(min_length=1, description='The issue, by identifier (e.g. "ENG-123") or id.')
    title: str | None = Field(default=None, min_length=1, max_length=255)
    description: str | None = Field(default=None, description="Markdown; replaces the description.")
    state: str | None = Field(default=None, description='Move it to this workflow state of its team (e.g. "Done").')
    priority: int | None = Field(default=None, ge=0, le=4, description="0 none, 1 urgent, 2 high, 3 medium, 4 low.")
    assignee_id: str | None = None


# -- execution


async def graphql(api: Api, query: str, variables: dict[str, Any], *, mutation: bool = False) -> dict[str, Any]:
    """Run one GraphQL operation; its `data`, or the error its answer carries."""
    body = {"query": query, "variables": variables}
    response = await api.request("POST", GRAPHQL_PATH, body=body, mutating=mutation, check=False)
    data: Json = api.decode(response) if response.headers.get("content-type", "").startswith("application/json") else {}
    errors = data.get("errors") if isinstance(data, dict) else None
    if isinstance(errors, list) and errors:
        first = errors[0] if isinstance(errors[0], dict) else {}
        message = str(first.get("message", "an error"))
        extensions = first.get("extensions")
        code = extensions.get("code") if isinstance(extensions, dict) else None
        if code == "RATELIMITED" or response.status_code == 429:
            wait = retry_after(response)
            after = f"retry in {wait:.0f} s" if wait is not None else "retry later"
            raise RateLimited(f"{api.name}: Linear's rate limit is reached ({message}); {after}", retry_after=wait)
        hint = "" if not mutation else "; nothing was changed"
        raise UpstreamError(f"{api.name}: Linear refused it ({code or response.status_code}: {message}){hint}")
    check_status(response, api.name, mutating=mutation)
    found = data.get("data") if isinstance(data, dict) else None
    if not isinstance(found, dict):
        raise api.unreadable("its answer has no data")
    return found


async def list_issues(api: Api, params: ListIssues) -> IssueList:
    conditions: dict[str, Any] = {}
    if params.team:
        conditions["team"] = {"key": {"eq": params.team}}
    if params.state:
        conditions["state"] = {"name": {"eqIgnoreCase": params.state}}
    if params.assignee_email:
        conditions["assignee"] = {"email": {"eq": params.assignee_email}}
    if params.title_contains:
        conditions["title"] = {"containsIgnoreCase": params.title_contains}
    query = (
        "query Issues($first: Int!, $after: String, $filter: IssueFilter) {"
        " issues(first: $first, after: $after, filter: $filter, orderBy: updatedAt) {"
        f" nodes {{ {_ISSUE_FIELDS} }} pageInfo {{ hasNextPage endCursor }} }} }}"
    )
    nodes: list[Json] = []
    after: str | None = None
    more = True
    while more and len(nodes) < params.limit:
        variables = {"first": min(PAGE_SIZE, params.limit - len(nodes)), "after": after, "filter": conditions or None}
        page = (await graphql(api, query, variables)).get("issues") or {}
        nodes.extend(page.get("nodes") or [])
        info = page.get("pageInfo") or {}
        more, after = bool(info.get("hasNextPage")), info.get("endCursor")
    return api.parse(IssueList, {"issues": nodes[: params.limit], "truncated": more})


async def _team_id(api: Api, team: str) -> str:
    if _UUID.match(team):
        return team
    query = "query Team($key: String!) { teams(filter: { key: { eq: $key } }) { nodes { id } } }"
    found = api.parse(_Nodes, (await graphql(api, query, {"key": team})).get("teams"))
    if not found.nodes:
        raise UpstreamError(f"{api.name}: Linear has no team with key {team!r} visible to this token; nothing was sent")
    return found.nodes[0].id


async def create_issue(api: Api, params: CreateIssue) -> Issue:
    issue_id = issue_id_for(api.marker_key, api.correlation_id)  # first: without the key nothing is sent
    fields = {
        "id": issue_id,
        "teamId": await _team_id(api, params.team),
        "title": params.title,
        "description": params.description,
        "priority": params.priority,
        "assigneeId": params.assignee_id,
        "labelIds": params.label_ids or None,
    }
    mutation = (
        "mutation IssueCreate($input: IssueCreateInput!) {"
        f" issueCreate(input: $input) {{ success issue {{ {_ISSUE_FIELDS} }} }} }}"
    )
    input_ = {k: v for k, v in fields.items() if v is not None}
    return _issue(api, (await graphql(api, mutation, {"input": input_}, mutation=True)).get("issueCreate"))


async def _state_id(api: Api, issue: str, state: str) -> str:
    query = (
        "query States($id: String!, $name: String!) { issue(id: $id) {"
        " team { states(filter: { name: { eqIgnoreCase: $name } }) { nodes { id } } } } }"
    )
    found = api.parse(_IssueStates, (await graphql(api, query, {"id": issue, "name": state})).get("issue"))
    if not found.states.nodes:
        raise UpstreamError(f"{api.name}: issue {issue}'s team has no workflow state {state!r}; nothing was changed")
    return found.states.nodes[0].id


async def update_issue(api: Api, params: UpdateIssue) -> Issue:
    fields = {
        "title": params.title,
        "description": params.description,
        "stateId": await _state_id(api, params.issue, params.state) if params.state else None,
        "priority": params.priority,
        "assigneeId": params.assignee_id,
    }
    input_ = {k: v for k, v in fields.items() if v is not None}
    if not input_:
        raise UpstreamError(f"{api.name}: nothing to update; give at least one of title, description, state...")
    mutation = (
        "mutation IssueUpdate($id: String!, $input: IssueUpdateInput!) {"
        f" issueUpdate(id: $id, input: $input) {{ success issue {{ {_ISSUE_FIELDS} }} }} }}"
    )
    answer = await graphql(api, mutation, {"id": params.issue, "input": input_}, mutation=True)
    return _issue(api, answer.get("issueUpdate"))


class _Made(Output):
    """What a look-up reads of an issue besides what the call returns: who made it, when, and in which team."""

    id: str
    created_at: str | None = Field(default=None, validation_alias="createdAt")
    creator_id: str | None = Field(default=None, validation_alias=AliasPath("creator", "id"))
    creator: str | None = Field(default=None, validation_alias=AliasPath("creator", "name"))
    team_id: str | None = Field(default=None, validation_alias=AliasPath("team", "id"))
    team_key: str | None = Field(default=None, validation_alias=AliasPath("team", "key"))


class _Viewer(Output):
    id: str
    name: str | None = None


class _Created(Output):
    viewer: _Viewer
    issues: list[dict[str, Any]] = Field(validation_alias=AliasPath("issues", "nodes"))


class IssuePlace(Params):
    """Where a `create_issue` call created: what its look-up needs of the call's arguments."""

    team: str = Field(min_length=1)


def _refuted(made: _Made, keyed: str, me: _Viewer, place: IssuePlace, window: Window) -> list[str]:
    """What refutes that the call made the issue `made`: its id, its creator, its team, its creation time."""
    refuted = []
    if made.id != keyed:
        refuted.append(
            f"its id {made.id} is derived from the invocation id without a key (the old way): anyone who knows the "
            "invocation id can create it"
        )
    if made.creator_id != me.id:
        who = made.creator or made.creator_id or "an unknown user"
        refuted.append(f"it was made by {who}, not by the token's user {me.name or me.id}")
    if place.team != made.team_id and place.team.upper() != (made.team_key or "").upper():
        refuted.append(f"it is in team {made.team_key or made.team_id}, not in {place.team} as the call named")
    elsewhen = window.refutes(moment(made.created_at), made.created_at)
    if elsewhen is not None:
        refuted.append(elsewhen)
    return refuted


async def find_issue(api: Api, arguments: Mapping[str, Any], window: Window) -> Found:
    """The issue a `create_issue` call created, by the keyed id derived from its invocation id (and the unkeyed one
    of old), judged as the module docstring says; `failed` when there is none."""
    place = arguments_for(api, IssuePlace, arguments)
    keyed, unkeyed = issue_id_for(api.marker_key, api.correlation_id), unkeyed_issue_id_for(api.correlation_id)
    query = (
        "query Created($ids: [ID!]!) { viewer { id name }"
        " issues(filter: { id: { in: $ids } }, includeArchived: true, first: 2) {"
        f" nodes {{ {_ISSUE_FIELDS} createdAt creator {{ id name }} team {{ id key }} }} }} }}"
    )
    answer = api.parse(_Created, await graphql(api, query, {"ids": [keyed, unkeyed]}))
    candidates = []
    for node in answer.issues:
        issue, made = api.parse(Issue, node), api.parse(_Made, node)
        refuted = _refuted(made, keyed, answer.viewer, place, window)
        where = f"issue {issue.identifier} ({issue.url})"
        candidates.append(
            Candidate(where, issue.model_dump(), made.creator or made.creator_id, made.created_at, refuted)
        )
    found = verdict(candidates)
    if found is None:
        return Found("failed", f"Linear has no issue with the call's id {keyed} (archived and trashed included)")
    return found


def _issue(api: Api, payload: Any) -> Issue:
    if isinstance(payload, dict) and payload.get("success") is False:
        raise UpstreamError(f"{api.name}: Linear answered that it did not succeed; nothing was changed")
    if not isinstance(payload, dict) or not isinstance(payload.get("issue"), dict):
        raise api.unreadable("its answer has no issue")
    return api.parse(Issue, payload["issue"])


ACTIONS: Final[tuple[ProviderAction[Any], ...]] = (
    ProviderAction(
        "list_issues",
        "List Linear issues",
        "List issues, most recently updated first, filtered by team key, workflow state, assignee or title text; "
        "each with its identifier (ENG-123), title, state, assignee, priority and URL.",
        "read",
        ListIssues,
        IssueList,
        list_issues,
    ),
    ProviderAction(
        "create_issue",
        "Create a Linear issue",
        "Create an issue in a team (by key, e.g. ENG). Returns its identifier and URL. Needs approval by default.",
        "write",
        CreateIssue,
        Issue,
        create_issue,
        idempotency_key=True,
        look_up=find_issue,
    ),
    ProviderAction(
        "update_issue",
        "Update a Linear issue",
        "Change an issue's title, description, workflow state (by name, e.g. Done), priority or assignee. Only "
        "the fields given change.",
        "write",
        UpdateIssue,
        Issue,
        update_issue,
        idempotency_key=True,
    ),
)


def auth_headers(token: str) -> dict[str, str]:
    """A personal API key (`lin_api_...`) goes as it is; an OAuth access token as a bearer token."""
    return {"Authorization": token if token.startswith("lin_api_") else f"Bearer {token}"}


def definition(config: ProviderConfig) -> ProviderDefinition:
    return ProviderDefinition("linear", DEFAULT_BASE_URL, auth_headers, ACTIONS)
