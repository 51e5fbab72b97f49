"""Stateful fakes of the provider APIs that can be looked up (GitHub, Linear, Slack), over `httpx2.MockTransport`.

Each keeps what it was asked to make (issues, comments, messages) and answers the reads a look-up makes from that
state. `lose` sets what happens to the next write: `"answer"` applies it and drops the connection before the answer
(the call's outcome is unknown, yet it acted), `"request"` drops it before anything is applied (unknown too, but
nothing happened). Every request is kept in `requests`.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from bastion.models import utcnow

Loss = Literal["answer", "request"] | None


def stamp() -> str:
    """Now, as GitHub writes times."""
    return utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")


def _json(data: Any, status: int = 200) -> httpx2.Response:
    return httpx2.Response(status, json=data)


@dataclass
class FakeApi(ABC):
    """What every fake shares: the requests it got, and how its next write is lost."""

    requests: list[httpx2.Request] = field(default_factory=list)
    lose: Loss = None

    @property
    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self._handle)

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
    """Issues and comments of any repository; lists honour `since` (by update time) and nothing else."""

    issues: list[dict[str, Any]] = field(default_factory=list)
    comments: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, request: httpx2.Request) -> httpx2.Response:
        parts = request.url.path.strip("/").split("/")  # repos/OWNER/REPO/issues[/N/comments]
        since = request.url.params.get("since", "")
        if parts[3:] == ["issues"] and request.method == "POST":
            return _json(self.write(request, lambda: self._add_issue(json.loads(request.content))), 201)
        if parts[3:] == ["issues"]:
            return _json([i for i in reversed(self.issues) if i["updated_at"] >= since])
        if parts[3] == "issues" and parts[5:] == [] and request.method == "PATCH":
            issue = self.issues[int(parts[4]) - 1]
            return _json(self.write(request, lambda: issue.update(json.loads(request.content)) or issue))
        if parts[3] == "issues" and parts[5:] == ["comments"] and request.method == "POST":
            body = json.loads(request.content)["body"]
            return _json(self.write(request, lambda: self._add_comment(int(parts[4]), body)), 201)
        if parts[3] == "issues" and parts[5:] == ["comments"]:
            return _json([c for c in self.comments if c["issue"] == int(parts[4]) and c["updated_at"] >= since])
        return _json({"message": "Not Found"}, 404)

    def _add_issue(self, body: dict[str, Any], *, at: str | None = None) -> dict[str, Any]:
        at = at or stamp()
        number = len(self.issues) + 1
        issue = {
            "number": number,
            "title": body["title"],
            "body": body.get("body"),
            "state": "open",
            "html_url": f"https://github.com/acme/app/issues/{number}",
            "created_at": at,
            "updated_at": at,
        }
        self.issues.append(issue)
        return issue

    def _add_comment(self, issue: int, body: str) -> dict[str, Any]:
        number = len(self.comments) + 100
        url = f"https://github.com/acme/app/issues/{issue}#issuecomment-{number}"
        at = stamp()
        comment = {"id": number, "issue": issue, "body": body, "html_url": url, "created_at": at, "updated_at": at}
        self.comments.append(comment)
        return comment

    def seed_issue(self, title: str, body: str | None, *, at: str | None = None) -> dict[str, Any]:
        """An issue made outside Bastion (or by an earlier call)."""
        return self._add_issue({"title": title, "body": body}, at=at)


@dataclass
class FakeLinear(FakeApi):
    """Teams by key, and issues by the id their creator chose (GraphQL: the three operations Bastion sends)."""

    issues: dict[str, dict[str, Any]] = field(default_factory=dict)

    def answer(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        query, variables = body["query"], body["variables"]
        if "teams(" in query:
            return _json({"data": {"teams": {"nodes": [{"id": "team-eng"}]}}})
        if "issueCreate" in query:
            issue = self.write(request, lambda: self._create(variables["input"]))
            return _json({"data": {"issueCreate": {"success": True, "issue": issue}}})
        if "issues(filter: { id: { eq: $id } }, includeArchived: true" in query:
            found = [self.issues[variables["id"]]] if variables["id"] in self.issues else []
            return _json({"data": {"issues": {"nodes": found}}})
        return _json({"errors": [{"message": f"unexpected query {query}"}]}, 400)

    def _create(self, fields: dict[str, Any]) -> dict[str, Any]:
        identifier = f"ENG-{len(self.issues) + 1}"
        issue = {
            "id": fields["id"],
            "identifier": identifier,
            "title": fields["title"],
            "url": f"https://linear.app/acme/issue/{identifier}",
        }
        self.issues[fields["id"]] = issue
        return issue


@dataclass
class FakeSlack(FakeApi):
    """Channels by id and name, messages with their metadata (shown only when the read asks for it)."""

    channels: dict[str, str] = field(default_factory=lambda: {"C1": "general"})
    messages: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, request: httpx2.Request) -> httpx2.Response:
        method, query = request.url.path.rsplit("/", 1)[1], request.url.params
        if method == "chat.postMessage":
            posted = self.write(request, lambda: self._post(json.loads(request.content)))
            return _json({"ok": True, **posted})
        if method == "conversations.list":
            channels = [{"id": cid, "name": name} for cid, name in self.channels.items()]
            return _json({"ok": True, "channels": channels})
        if method in ("conversations.history", "conversations.replies"):
            with_metadata = query.get("include_all_metadata") == "true"
            shown = [
                m["message"] if with_metadata else {k: v for k, v in m["message"].items() if k != "metadata"}
                for m in self.messages
                if m["channel"] == query["channel"] and m["message"].get("thread_ts") == query.get("ts")
            ]
            return _json({"ok": True, "messages": list(reversed(shown))})
        return _json({"ok": False, "error": "unknown_method"})

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        channel = next((cid for cid, name in self.channels.items() if body["channel"] in (cid, f"#{name}")), None)
        if channel is None:
            raise AssertionError(f"no channel {body['channel']}")
        ts = f"1700000000.{len(self.messages) + 1:06d}"
        message = {"ts": ts, "text": body["text"], "metadata": body["metadata"]}
        if "thread_ts" in body:
            message["thread_ts"] = body["thread_ts"]
        self.messages.append({"channel": channel, "message": message})
        return {"channel": channel, "ts": ts, "message": message}
