"""End to end: a real MCP client, a real `bastion serve` process, and a fake GitHub API on loopback.

A read runs at once; a write waits for an approver (deciding from another process) and is sent once, with the
invocation id as its Idempotency-Key and in its marker, tagged with the marker key of the ledger the process
opened; a danger action is refused without a request; a provider whose
token is not bound is `unavailable` and its calls `binding_required`. The token (a canary) reaches the API and
nothing else: not the ledger's bytes, not a result, not a log line, not a status, even though the API echoes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion.sources.providers.evidence import tag_of
from bastion.sources.providers.github import marker
from tests.processes import bastion_env, bastion_http, run_cli
from tests.providers import CANARY
from tests.test_api import serving
from tests.test_e2e_approvals import decide_from_another_process, one, watching
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class FakeGitHub:
    """Just enough of GitHub's REST API: list and create issues, merge a pull request. It echoes the token it gets
    back in an issue title, as a careless or hostile API might."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.app = Starlette(
            routes=[
                Route("/repos/{owner}/{repo}/issues", self.issues, methods=["GET", "POST"]),
                Route("/repos/{owner}/{repo}/pulls/{number}/merge", self.merge, methods=["PUT"]),
            ]
        )

    async def _record(self, request: Request) -> Any:
        raw = await request.body()
        body = json.loads(raw) if raw else None
        self.seen.append(Seen(request.method, request.url.path, dict(request.headers), body))
        return body

    def sent(self, method: str) -> list[Seen]:
        return [s for s in self.seen if s.method == method]

    async def issues(self, request: Request) -> Response:
        body = await self._record(request)
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if request.method == "GET":
            return JSONResponse([_issue(1, f"token seen: {token}")])
        return JSONResponse(_issue(2, body["title"]), status_code=201)

    async def merge(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse({"merged": True, "sha": "c" * 40, "message": "merged"})


def _issue(number: int, title: str) -> dict[str, Any]:
    return {
        "number": number,
        "title": title,
        "state": "open",
        "user": {"login": "octocat"},
        "labels": [],
        "assignees": [],
        "comments": 0,
        "html_url": f"https://github.com/acme/app/issues/{number}",
        "created_at": "2025-01-01T00:00:00Z",
        "updated_at": "2025-01-01T00:00:00Z",
    }


def _write_config(directory: Path, api_url: str) -> Path:
    (directory / "policies").mkdir(parents=True)
    (directory / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///state/ledger.db"\n[approvals]\nheartbeat_seconds = 0.2\n\n'
        f'[providers.github]\ntoken = "${{env:E2E_GITHUB_TOKEN}}"\nbase_url = "{api_url}"\n\n'
        '[providers.slack]\ntoken = "${env:E2E_SLACK_TOKEN}"\n'
    )
    return directory


def _dump(result: types.CallToolResult) -> str:
    return result.model_dump_json(by_alias=True)


async def test_a_provider_through_a_real_bastion_reads_waits_for_approval_refuses_danger_and_never_leaks_its_token(
    tmp_path: Path,
) -> None:
    fake = FakeGitHub()
    env = bastion_env(tmp_path / "home", E2E_GITHUB_TOKEN=CANARY, BASTION_LOG_LEVEL="debug")
    outputs: list[str] = []
    async with serving(fake.app) as api_url:
        config = _write_config(tmp_path / "config", api_url)
        async with bastion_http(["--config", str(config)], env=env) as bastion, watching(config) as ledger:
            async with Client(bastion.mcp_url, cache=None) as client:
                tools = {tool.name for tool in (await client.list_tools()).tools}
                assert {"github__list_issues", "github__create_issue", "github__merge_pull_request"} <= tools
                assert not any(name.startswith("slack__") for name in tools)

                read = await client.call_tool("github__list_issues", {"owner": "acme", "repo": "app"})
                assert not read.is_error, read
                assert read.structured_content is not None
                assert read.structured_content["issues"][0]["title"] == "token seen: [REDACTED]"

                created: list[types.CallToolResult] = []

                async def create() -> None:
                    arguments = {"owner": "acme", "repo": "app", "title": "Crash on save", "body": "Steps: save."}
                    created.append(await client.call_tool("github__create_issue", arguments))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(create)
                    pending = await one(ledger, "pending")
                    assert (pending.policy_key, pending.mode_source) == ("github:create_issue", "inferred")
                    assert fake.sent("POST") == [], "nothing is sent before the approval"
                    code, output = await decide_from_another_process(config, env, "approve", pending.id)
                    assert code == 0, output
                    outputs.append(output)
                (posted,) = fake.sent("POST")
                assert posted.headers["idempotency-key"] == pending.id
                assert posted.body == {
                    "title": "Crash on save",
                    "body": f"Steps: save.\n\n{marker(pending.id, tag_of(ledger.marker_key, pending.id))}",
                }
                assert not created[0].is_error and created[0].structured_content == {
                    "number": 2,
                    "title": "Crash on save",
                    "state": "open",
                    "url": "https://github.com/acme/app/issues/2",
                }

                merge = await client.call_tool(
                    "github__merge_pull_request", {"owner": "acme", "repo": "app", "number": 5}
                )
                assert error_of(merge)["class"] == "policy_denied"
                assert fake.sent("PUT") == []

                unbound = await client.call_tool("slack__post_message", {"channel": "C1", "text": "hi"})
                assert error_of(unbound)["class"] == "binding_required"
                outputs += [_dump(r) for r in (read, created[0], merge, unbound)]

            async with httpx2.AsyncClient() as http:
                health = (await http.get(f"{bastion.base_url}/healthz")).json()
            assert health["status"] == "degraded"
            assert {s["id"]: s["state"] for s in health["sources"]} == {"github": "ready", "slack": "unavailable"}
            outputs.append(json.dumps(health))
            statuses = {i.policy_key: i.status for i in await ledger.invocations.list()}
            assert statuses == {
                "github:list_issues": "completed",
                "github:create_issue": "completed",
                "github:merge_pull_request": "denied",
            }
        outputs += bastion.stderr
    assert all(seen.headers["authorization"] == f"Bearer {CANARY}" for seen in fake.seen), "the API got the token"
    assert len(fake.seen) == 2

    doctor = run_cli("doctor", "--config", str(config), env=env)
    assert doctor.returncode == 2 and "binding_required" in doctor.stdout, "doctor names the unbound provider"
    outputs += [doctor.stdout, doctor.stderr]
    for command in (("invocations", "list", "--json"), ("connectors", "list", "--json")):
        done = run_cli(*command, "--config", str(config), env=env)
        outputs += [done.stdout, done.stderr]
    state = config / "state"
    ledger_bytes = b"".join(path.read_bytes() for path in state.iterdir() if path.is_file())
    assert ledger_bytes, "the ledger was written"
    assert CANARY.encode() not in ledger_bytes
    leaks = [output for output in outputs if CANARY in output]
    assert leaks == []
