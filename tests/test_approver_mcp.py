"""`/approver/mcp` and scoped approvals (issue 14): approvers decide from their own MCP host; "session" and
"always" approvals; an "always" approval is an org entry in the policy file Bastion owns, revoked by drift."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest

from bastion.config.approved import APPROVED_FILE
from bastion.models import CallContext, ModeDecision
from tests.approvers import OPERATOR_POLICY, Bastion, Ticks, live, structured
from tests.test_api import WAIT

pytestmark = pytest.mark.anyio

APPROVER = "/approver/mcp"


async def _call_in_background(bastion: Bastion, agent: dict[str, str], results: list[types.CallToolResult]) -> None:
    async with bastion.client(agent) as client:
        results.append(await client.call_tool("fx__echo", {"text": "hello"}))


async def test_an_agent_token_and_no_token_are_refused_on_the_approver_endpoint(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        async with httpx2.AsyncClient(base_url=bastion.url, timeout=WAIT) as http:
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            anonymous = await http.post(APPROVER, json=body)
            assert anonymous.status_code == 401
            refused = await http.post(APPROVER, json=body, headers=agent)
            assert refused.status_code == 403
            assert refused.json()["error"]["class"] == "forbidden"


async def test_an_approver_lists_shows_and_denies_with_a_reason_from_its_mcp_host(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call_in_background, bastion, agent, results)
                (waiting,) = await bastion.pending(1)
                async with bastion.client(admin, APPROVER) as approver:
                    names = {tool.name for tool in (await approver.list_tools()).tools}
                    assert names == {"list_pending", "show_invocation", "approve", "deny"}
                    listed = structured(await approver.call_tool("list_pending", {}))
                    assert [a["id"] for a in listed["approvals"]] == [waiting.id]
                    shown = structured(await approver.call_tool("show_invocation", {"invocation_id": waiting.id}))
                    assert [e["kind"] for e in shown["events"]] == ["planned", "pending"]
                    denied = await approver.call_tool("deny", {"invocation_id": waiting.id, "reason": "not today"})
                    assert structured(denied)["status"] == "denied"
        (result,) = results
        assert result.is_error
        assert structured(result)["error"]["class"] == "approval_denied"


async def test_an_approver_may_not_approve_its_own_call_on_the_approver_endpoint(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion:
        admin = await bastion.token("alice", "admin")
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call_in_background, bastion, admin, [])
                (waiting,) = await bastion.pending(1)
                async with bastion.client(admin, APPROVER) as approver:
                    refused = await approver.call_tool("approve", {"invocation_id": waiting.id})
                    assert refused.is_error
                    assert structured(refused)["error"]["class"] == "forbidden"
                other = await bastion.token("bob", "admin")
                async with bastion.client(other, APPROVER) as approver:
                    await approver.call_tool("deny", {"invocation_id": waiting.id, "reason": "cleanup"})


async def test_always_writes_an_org_entry_that_the_next_call_resolves_and_a_drift_revokes(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        approved_file = bastion.directory / "policies" / APPROVED_FILE
        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call_in_background, bastion, agent, results)
                (waiting,) = await bastion.pending(1)
                async with bastion.client(admin, APPROVER) as approver:
                    answer = await approver.call_tool("approve", {"invocation_id": waiting.id, "scope": "always"})
                    assert structured(answer)["status"] == "approved"
        assert not results[0].is_error

        text = approved_file.read_text()
        assert '"fx:echo" = "allow"' in text
        assert f"approved by alice for invocation {waiting.id}" in text
        assert (bastion.directory / "policies" / "default.toml").read_text() == OPERATOR_POLICY
        approved_file.write_text("# kept: a person's note\n" + text)

        async with bastion.client(agent) as client:
            again = await client.call_tool("fx__echo", {"text": "again"})
        assert not again.is_error
        (latest, *_) = await bastion.ledger.invocations.list()
        assert (latest.status, latest.mode, latest.mode_source) == ("completed", "allow", "always")

        changed = types.Tool(
            name="echo",
            description="Echo the text back (now also stores it)",
            input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
            annotations=types.ToolAnnotations(read_only_hint=True),
        )
        await bastion.fixture.set_tools([changed])

        async def revoked() -> bool:
            return '"fx:echo"' not in approved_file.read_text()

        await bastion.wait_until(revoked)
        assert approved_file.read_text().startswith("# kept: a person's note\n")
        assert "fx:echo" not in bastion.gateway.grants.approved.modes


async def test_an_always_approval_and_its_revocation_reach_another_running_instance_on_the_same_config_directory(
    tmp_path: Path,
) -> None:
    ticks = Ticks()
    async with live(tmp_path, clock=ticks) as one, live(tmp_path, clock=ticks) as two:
        agent = await one.token("ci-agent", "agent")
        admin = await one.token("alice", "admin")
        echo = two.gateway.catalog.entries["fx__echo"]
        elsewhere = CallContext(session_id="another-session")
        held_by_org = ModeDecision(mode="require_approval", source="org")
        assert two.gateway.mode_of(echo, elsewhere) == held_by_org

        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call_in_background, one, agent, results)
                (waiting,) = await one.pending(1)
                async with one.client(admin, APPROVER) as approver:
                    await approver.call_tool("approve", {"invocation_id": waiting.id, "scope": "always"})
        assert not results[0].is_error
        assert two.gateway.mode_of(echo, elsewhere) == held_by_org, "the file is looked at once a second at most"

        ticks.now += 1
        with anyio.fail_after(WAIT):
            async with two.client(agent) as client:
                assert not (await client.call_tool("fx__echo", {"text": "on the other instance"})).is_error
        (latest, *_) = await two.ledger.invocations.list()
        assert (latest.status, latest.mode, latest.mode_source) == ("completed", "allow", "always")

        one.gateway.grants.revoke("fx", "echo")  # as a drift of fx:echo seen by the first instance does
        assert two.gateway.mode_of(echo, elsewhere).mode == "allow"
        ticks.now += 1
        assert two.gateway.mode_of(echo, elsewhere) == held_by_org


async def test_a_session_approval_allows_that_session_only(tmp_path: Path) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        with anyio.fail_after(WAIT):
            async with bastion.client(agent) as session:
                async with anyio.create_task_group() as tg:

                    async def first_call() -> None:
                        assert not (await session.call_tool("fx__echo", {"text": "one"})).is_error

                    tg.start_soon(first_call)
                    (waiting,) = await bastion.pending(1)
                    async with bastion.client(admin, APPROVER) as approver:
                        await approver.call_tool("approve", {"invocation_id": waiting.id, "scope": "session"})
                assert not (await session.call_tool("fx__echo", {"text": "two"})).is_error
                (latest, *_) = await bastion.ledger.invocations.list()
                assert (latest.mode, latest.mode_source) == ("allow", "session")
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call_in_background, bastion, agent, [])
                (held,) = await bastion.pending(1)
                assert held.session_id != waiting.session_id
                async with bastion.client(admin, APPROVER) as approver:
                    await approver.call_tool("deny", {"invocation_id": held.id})


async def test_a_session_approval_keeps_the_operators_rules_on_arguments(tmp_path: Path) -> None:
    """The operator allows fx:echo but holds any echo of a secret: approving one such call "for this session" does
    not let the session's next secret through (it used to: a session grant lifted every hold of its key)."""
    secret = {"key": "fx:echo", "when": 'args.text.contains("secret")', "mode": "require_approval"}
    async with live(tmp_path, {"fx:echo": "allow"}, rules=[secret]) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        with anyio.fail_after(WAIT):
            async with bastion.client(agent) as session, bastion.client(admin, APPROVER) as approver:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(session.call_tool, "fx__echo", {"text": "secret one"})
                    (first,) = await bastion.pending(1)
                    await approver.call_tool("approve", {"invocation_id": first.id, "scope": "session"})
                async with anyio.create_task_group() as tg:
                    tg.start_soon(session.call_tool, "fx__echo", {"text": "secret two"})
                    (second,) = await bastion.pending(1)
                    await approver.call_tool("deny", {"invocation_id": second.id, "reason": "no"})
        assert second.session_id == first.session_id
        assert second.mode_source == "org_rule"


async def test_an_always_approval_never_lets_through_a_call_that_an_operators_wildcard_rule_denies(
    tmp_path: Path,
) -> None:
    """The operator holds fx:echo and denies, on every fx action, arguments with `..`; an approver approves one
    harmless echo "always": later harmless echoes run (mode source `always`), and one with `..` still does not."""
    dots = {"key": "fx:*", "when": 'args.text.contains("..")', "mode": "deny"}
    async with live(tmp_path, rules=[dots]) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call_in_background, bastion, agent, results)
                (waiting,) = await bastion.pending(1)
                async with bastion.client(admin, APPROVER) as approver:
                    await approver.call_tool("approve", {"invocation_id": waiting.id, "scope": "always"})
            async with bastion.client(agent) as client:
                assert not (await client.call_tool("fx__echo", {"text": "harmless"})).is_error
                (latest, *_) = await bastion.ledger.invocations.list()
                assert (latest.status, latest.mode_source) == ("completed", "always")
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, "fx__echo", {"text": "../../etc/passwd"})
                    (dotted,) = await bastion.pending(1)  # held for an approver, as without the grant
                    async with bastion.client(admin, APPROVER) as approver:
                        await approver.call_tool("deny", {"invocation_id": dotted.id, "reason": "no"})
        assert "../../etc/passwd" in str(dotted.args)
        assert dotted.mode_source == "org"


async def test_an_always_approval_that_cannot_be_recorded_is_refused_before_anything_is_decided(
    tmp_path: Path,
) -> None:
    """On the embedded default there is no policy file to write an "always" approval to: the approver is told so,
    and the call stays pending (it used to be approved anyway, the approver seeing only the error)."""
    async with live(tmp_path, embedded=True) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call_in_background, bastion, agent, results)
                (waiting,) = await bastion.pending(1)
                async with bastion.client(admin, APPROVER) as approver:
                    refused = await approver.call_tool("approve", {"invocation_id": waiting.id, "scope": "always"})
                    assert refused.is_error and structured(refused)["error"]["class"] == "config_error"
                    still = await bastion.ledger.invocations.get(waiting.id)
                    assert still is not None and still.status == "pending"
                    await approver.call_tool("deny", {"invocation_id": waiting.id, "reason": "cleanup"})
        assert results[0].is_error
