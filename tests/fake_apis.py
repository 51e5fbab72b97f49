"""Stateful fakes of the provider APIs that can be looked up (GitHub, Linear, Slack), over `httpx2.MockTransport`.

Each keeps what it was asked to make (issues, comments, messages), with its creator: the user of the token that
asked (`users`: Bastion's token, `CANARY`, and an agent's own, `AGENT_TOKEN`), and answers the reads a look-up
makes from that state, "who am I" included (GitHub `GET /user`, Linear `viewer`, Slack `auth.test`). `lose` sets
what happens to the next write: `"answer"` applies it and drops the connection before the answer (the call's
outcome is unknown, yet it acted), `"request"` drops it before anything is applied (unknown too, but nothing
happened). Every request is kept in `requests`; `client(token)` is anyone else using the same API.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal

import httpx2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from bastion.models import utcnow
from tests.providers import CANARY

Loss = Literal["answer", "request"] | None

AGENT_TOKEN = "agent-token-5e8a1b"
"""The token of an agent with access of its own to the same API: what it makes there is recorded as its own."""


def stamp(at: datetime | None = None) -> str:
    """Now (or `at`), as GitHub writes times."""
    return (at or utcnow()).strftime("%Y-%m-%dT%H:%M:%SZ")


def token_of(request: httpx2.Request) -> str:
    return request.headers.get("authorization", "").removeprefix("Bearer ")


def _json(data: Any, status: int = 200) -> httpx2.Response:
    return httpx2.Response(status, json=data)


@dataclass
class FakeApi(ABC):
    """What every fake shares: the requests it got, how its next write is lost, who each token is."""

    requests: list[httpx2.Request] = field(default_factory=list)
    lose: Loss = None
    base_url: ClassVar[str]
    users: ClassVar[dict[str, dict[str, Any]]]
    """Each token's user, as the API describes it."""

    @property
    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self._handle)

    def client(self, token: str) -> httpx2.AsyncClient:
        """Someone else using the same API with `token` (the agent with its own, or a person with Bastion's)."""
        return httpx2.AsyncClient(
            transport=self.transport, base_url=self.base_url, headers={"Authorization": f"Bearer {token}"}
        )

    def user_of(self, request: httpx2.Request) -> dict[str, Any]:
        user = self.users.get(token_of(request))
        if user is None:
            raise AssertionError(f"{type(self).__name__} got a token it does not know")
        return user

    async def _handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        return self.answer(request)

    @abstractmethod
    def answer(self, request: httpx2.Request) -> httpx2.Response:
        """The fake's answer to one request (or the exception the transport raises)."""

    def write(self, request: httpx2.Request, apply: Any) -> Any:
        """Apply a write as `lose` says: its result, or the dropped connection (before or after applying it)."""
        loss, self.lose = self.lose, None
        if loss == "request":
            raise httpx2.RemoteProtocolError("peer closed before answering", request=request)
        made = apply()
        if loss == "answer":
            raise httpx2.RemoteProtocolError("peer closed before answering", request=request)
        return made

    def reads(self) -> list[httpx2.Request]:
        return [r for r in self.requests if r.method == "GET"]

    def asgi(self) -> ASGIApp:
        """The fake served over real HTTP (a `bastion` process reaches it on loopback); writes are not lost there."""

        async def endpoint(request: Request) -> Response:
            forwarded = httpx2.Request(
                request.method, str(request.url), headers=request.headers.raw, content=await request.body()
            )
            answer = await self._handle(forwarded)
            return Response(answer.content, answer.status_code, media_type="application/json")

        return Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST", "PATCH"])])


@dataclass
class FakeGitHub(FakeApi):
    """Issues and comments of any repository, each with its creator; lists honour `since` (by update time) and
    nothing else."""

    base_url: ClassVar[str] = "https://api.github.com"
    users: ClassVar[dict[str, dict[str, Any]]] = {
        CANARY: {"login": "bastion-bot", "id": 1},
        AGENT_TOKEN: {"login": "agent", "id": 2},
    }
    issues: list[dict[str, Any]] = field(default_factory=list)
    comments: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, request: httpx2.Request) -> httpx2.Response:
        user = self.user_of(request)
        parts = request.url.path.strip("/").split("/")  # repos/OWNER/REPO/issues[/N/comments], or user
        if parts == ["user"]:
            return _json(user)
        repo, since = "/".join(parts[1:3]), request.url.params.get("since", "")
        if parts[3:] == ["issues"] and request.method == "POST":
            body = json.loads(request.content)
            return _json(self.write(request, lambda: self._add_issue(repo, body, user)), 201)
        if parts[3:] == ["issues"]:
            return _json([i for i in reversed(self.issues) if i["repository_url"].endswith(f"/repos/{repo}")
                          and i["updated_at"] >= since])  # fmt: skip
        if parts[3] == "issues" and parts[5:] == [] and request.method == "PATCH":
            issue = self.issues[int(parts[4]) - 1]
            return _json(self.write(request, lambda: issue.update(json.loads(request.content)) or issue))
        if parts[3] == "issues" and parts[5:] == ["comments"] and request.method == "POST":
            body = json.loads(request.content)["body"]
            return _json(self.write(request, lambda: self._add_comment(repo, int(parts[4]), body, user)), 201)
        if parts[3] == "issues" and parts[5:] == ["comments"]:
            wanted = f"/repos/{repo}/issues/{parts[4]}"
            return _json([c for c in self.comments if c["issue_url"].endswith(wanted) and c["updated_at"] >= since])
        return _json({"message": "Not Found"}, 404)

    def _add_issue(
        self, repo: str, body: dict[str, Any], user: dict[str, Any], *, created: str | None = None
    ) -> dict[str, Any]:
        at = stamp()
        number = len(self.issues) + 1
        issue = {
            "number": number,
            "title": body["title"],
            "body": body.get("body"),
            "state": "open",
            "user": user,
            "repository_url": f"{self.base_url}/repos/{repo}",
            "html_url": f"https://github.com/{repo}/issues/{number}",
            "created_at": created or at,
            "updated_at": at,
        }
        self.issues.append(issue)
        return issue

    def _add_comment(self, repo: str, issue: int, body: str, user: dict[str, Any]) -> dict[str, Any]:
        number = len(self.comments) + 100
        url = f"https://github.com/{repo}/issues/{issue}#issuecomment-{number}"
        at = stamp()
        comment = {
            "id": number,
            "body": body,
            "user": user,
            "issue_url": f"{self.base_url}/repos/{repo}/issues/{issue}",
            "html_url": url,
            "created_at": at,
            "updated_at": at,
        }
        self.comments.append(comment)
        return comment

    def seed_issue(
        self, title: str, body: str | None, *, repo: str = "acme/app", by: str = CANARY, created: str | None = None
    ) -> dict[str, Any]:
        """An issue made outside Bastion (or by an earlier call) with the token `by`, now (last updated now but
        made at `created`, when given: an old issue edited since)."""
        return self._add_issue(repo, {"title": title, "body": body}, self.users[by], created=created)


@dataclass
class FakeLinear(FakeApi):
    """Teams by key, and issues by the id their creator chose, each with its creator and team (GraphQL: the
    operations Bastion sends)."""

    base_url: ClassVar[str] = "https://api.linear.app"
    users: ClassVar[dict[str, dict[str, Any]]] = {
        CANARY: {"id": "user-bastion", "name": "Bastion"},
        AGENT_TOKEN: {"id": "user-agent", "name": "Agent"},
    }
    teams: dict[str, str] = field(default_factory=lambda: {"ENG": "team-eng", "OPS": "team-ops"})
    issues: dict[str, dict[str, Any]] = field(default_factory=dict)

    def answer(self, request: httpx2.Request) -> httpx2.Response:
        user = self.user_of(request)
        body = json.loads(request.content)
        query, variables = body["query"], body["variables"]
        if "teams(" in query:
            found = [{"id": self.teams[variables["key"]]}] if variables["key"] in self.teams else []
            return _json({"data": {"teams": {"nodes": found}}})
        if "issueCreate" in query:
            issue = self.write(request, lambda: self._create(variables["input"], user))
            return _json({"data": {"issueCreate": {"success": True, "issue": issue}}})
        if "viewer { id name } issues(filter: { id: { in: $ids } }, includeArchived: true" in query:
            found = [self.issues[id_] for id_ in variables["ids"] if id_ in self.issues]
            return _json({"data": {"viewer": user, "issues": {"nodes": found}}})
        return _json({"errors": [{"message": f"unexpected query {query}"}]}, 400)

    def _create(self, fields: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
        if fields["id"] in self.issues:
            raise AssertionError(f"Linear refuses a second issue with id {fields['id']}")
        identifier = f"ENG-{len(self.issues) + 1}"
        key = next(key for key, team_id in self.teams.items() if team_id == fields["teamId"])
        issue = {
            "id": fields["id"],
            "identifier": identifier,
            "title": fields["title"],
            "url": f"https://linear.app/acme/issue/{identifier}",
            "createdAt": utcnow().isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "creator": user,
            "team": {"id": fields["teamId"], "key": key},
        }
        self.issues[fields["id"]] = issue
        return issue

    async def create(self, token: str, issue_id: str, *, team: str = "ENG") -> dict[str, Any]:
        """Someone creates an issue with the id they chose, with `token`, through the API."""
        mutation = "mutation IssueCreate($input: IssueCreateInput!) { issueCreate(input: $input) { success } }"
        fields = {"id": issue_id, "teamId": self.teams[team], "title": "Made elsewhere"}
        async with self.client(token) as http:
            answer = await http.post("/graphql", json={"query": mutation, "variables": {"input": fields}})
        return dict(answer.json()["data"]["issueCreate"]["issue"])


@dataclass
class FakeSlack(FakeApi):
    """Channels by id and name, messages with their poster and metadata (shown only when the read asks for it);
    reads honour `oldest`, a thread's replies start with its parent, and the history shows thread replies only
    when they were also sent to the channel (`reply_broadcast`), as Slack's do."""

    base_url: ClassVar[str] = "https://slack.com/api"
    users: ClassVar[dict[str, dict[str, Any]]] = {
        CANARY: {"user_id": "U0BASTION", "user": "bastion", "bot_id": "B0BASTION"},
        AGENT_TOKEN: {"user_id": "U0AGENT", "user": "agent"},
    }
    channels: dict[str, str] = field(default_factory=lambda: {"C1": "general", "C2": "random"})
    messages: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, request: httpx2.Request) -> httpx2.Response:
        user = self.user_of(request)
        method, query = request.url.path.rsplit("/", 1)[1], request.url.params
        if method == "auth.test":
            return _json({"ok": True, "team": "acme", **user})
        if method == "chat.postMessage":
            posted = self.write(request, lambda: self._post(json.loads(request.content), user))
            return _json({"ok": True, **posted})
        if method == "conversations.list":
            channels = [{"id": cid, "name": name} for cid, name in self.channels.items()]
            return _json({"ok": True, "channels": channels})
        if method in ("conversations.history", "conversations.replies"):
            thread, oldest = query.get("ts"), float(query.get("oldest", "0"))
            with_metadata = query.get("include_all_metadata") == "true"
            shown = [
                m["message"] if with_metadata else {k: v for k, v in m["message"].items() if k != "metadata"}
                for m in self.messages
                if m["channel"] == query["channel"] and float(m["message"]["ts"]) >= oldest
                and _read_in(m["message"], thread)
            ]  # fmt: skip
            return _json({"ok": True, "messages": shown if thread is not None else list(reversed(shown))})
        return _json({"ok": False, "error": "unknown_method"})

    def _post(self, body: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
        channel = next((cid for cid, name in self.channels.items() if body["channel"] in (cid, f"#{name}")), None)
        if channel is None:
            raise AssertionError(f"no channel {body['channel']}")
        ts = f"{utcnow().timestamp():.0f}.{len(self.messages) + 1:06d}"
        message = {"ts": ts, "text": body["text"], "user": user["user_id"]}
        if "bot_id" in user:
            message["bot_id"] = user["bot_id"]
        for key in ("metadata", "thread_ts", "reply_broadcast"):
            if key in body:
                message[key] = body[key]
        self.messages.append({"channel": channel, "message": message})
        return {"channel": channel, "ts": ts, "message": message}

    async def post(self, token: str, body: dict[str, Any]) -> dict[str, Any]:
        """Someone posts a message with `token`, through the API."""
        async with self.client(token) as http:
            answer = await http.post("/chat.postMessage", json=body)
        return dict(answer.json()["message"])


def _read_in(message: dict[str, Any], thread: str | None) -> bool:
    """Whether a read shows `message`: a thread's replies (`thread`) show its parent and replies, the channel's
    history (None) its messages and the replies also sent to the channel."""
    if thread is not None:
        return thread in (message["ts"], message.get("thread_ts"))
    return message.get("thread_ts") in (None, message["ts"]) or message.get("reply_broadcast") is True
