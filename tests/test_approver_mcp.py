"""`/approver/mcp` and scoped approvals: approvers decide from their own MCP host; an approval "for this session",
"for an hour" or "always" leaves a grant in the ledger, offered only where it can work, narrowed by a condition if
the approver gives one, listed and revoked there, ended by drift, and never above the operator's rules."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import mcp_types as types
import pytest

from bastion.models import CallContext, Invocation, ModeDecision, utcnow
from tests.approvers import OPERATOR_POLICY, Bastion, live, structured
from tests.ledger_contract.samples import unsigned
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
                    assert names == {
                        "list_pending", "show_invocation", "approve", "deny", "list_grants", "revoke_grant"
                    }  # fmt: skip
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


async def _held_then_approved(
    bastion: Bastion,
    agent: dict[str, str],
    admin: dict[str, str],
    approval: dict[str, Any],
    text: str = "hello",
    era: Literal["legacy", "2026-07-28"] = "legacy",
) -> tuple[Invocation, dict[str, Any]]:
    """An agent's call of fx__echo, held, then approved with `approval` (scope, when...): the pending invocation
    and the approver's answer. The call must run."""
    results: list[types.CallToolResult] = []

    async def call() -> None:
        async with bastion.client(agent, era=era) as client:
            results.append(await client.call_tool("fx__echo", {"text": text}))

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            (waiting,) = await bastion.pending(1)
            async with bastion.client(admin, APPROVER) as approver:
                answer = structured(await approver.call_tool("approve", {"invocation_id": waiting.id, **approval}))
    assert not results[0].is_error, results[0].content
    return waiting, answer


async def _echo(bastion: Bastion, agent: dict[str, str], text: str, **era: Any) -> Invocation:
    """Call fx__echo as `agent`; when it is held, deny it. The call's invocation as it ended."""
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                async with bastion.client(agent, **era) as client:
                    await client.call_tool("fx__echo", {"text": text})
                tg.cancel_scope.cancel()

            tg.start_soon(call)
            held = await bastion.pending(1)
            admin = await bastion.token(f"denier-{held[0].id[:8]}", "admin")
            async with bastion.client(admin, APPROVER) as approver:
                await approver.call_tool("deny", {"invocation_id": held[0].id, "reason": "held, as it should"})
    (latest, *_) = await bastion.ledger.invocations.list()
    return latest


async def test_always_leaves_a_grant_in_the_ledger_that_lets_the_next_call_through_until_the_tool_drifts(
    tmp_path: Path,
) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        waiting, answer = await _held_then_approved(bastion, agent, admin, {"scope": "always"})
        assert answer["status"] == "approved"

        (grant,) = await bastion.ledger.grants.grants()
        assert (grant.policy_key, grant.scope, grant.grantor, grant.invocation_id) == (
            "fx:echo", "always", "alice", waiting.id
        )  # fmt: skip
        assert grant.expires_at == grant.created_at + timedelta(days=90)
        (approved,) = [e for e in await bastion.ledger.invocations.events(waiting.id) if e.kind == "approved"]
        assert unsigned(approved.detail) == {"by": "alice", "note": None, "scope": "always", "grant": grant.id}
        assert (bastion.directory / "policies" / "default.toml").read_text() == OPERATOR_POLICY

        async with bastion.client(agent) as client:
            assert not (await client.call_tool("fx__echo", {"text": "again"})).is_error
        (latest, *_) = await bastion.ledger.invocations.list()
        assert (latest.status, latest.mode, latest.mode_source) == ("completed", "allow", f"grant:{grant.id}")
        async with bastion.client(admin, APPROVER) as approver:
            listed = structured(await approver.call_tool("list_grants", {}))
        assert [(g["id"], g["active"]) for g in listed["grants"]] == [(grant.id, True)]

        changed = types.Tool(
            name="echo",
            description="Echo the text back (now also stores it)",
            input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
            annotations=types.ToolAnnotations(read_only_hint=True),
        )
        await bastion.fixture.set_tools([changed])

        async def revoked() -> bool:
            return not await bastion.ledger.grants.grants(standing_at=utcnow())

        await bastion.wait_until(revoked)
        (ended,) = await bastion.ledger.grants.grants()
        assert ended.revoked_by == "drift"


async def test_a_grant_and_its_revocation_reach_another_instance_on_the_same_ledger_at_once(tmp_path: Path) -> None:
    async with live(tmp_path) as one, live(tmp_path) as two:
        agent = await one.token("ci-agent", "agent")
        admin = await one.token("alice", "admin")
        echo = two.gateway.catalog.entries["fx__echo"]
        elsewhere = CallContext(session_id="another-session")
        assert two.gateway.mode_of(echo, elsewhere) == ModeDecision(mode="require_approval", source="org")

        await _held_then_approved(one, agent, admin, {"scope": "always"})
        (grant,) = await one.ledger.grants.grants()
        with anyio.fail_after(WAIT):
            async with two.client(agent) as client:
                assert not (await client.call_tool("fx__echo", {"text": "on the other instance"})).is_error
        (latest, *_) = await two.ledger.invocations.list()
        assert (latest.status, latest.mode_source) == ("completed", f"grant:{grant.id}")

        async with two.client(admin, APPROVER) as approver:
            revoked = structured(await approver.call_tool("revoke_grant", {"grant_id": grant.id}))
            assert (revoked["active"], revoked["revoked_by"]) == (False, "alice")
            again = await approver.call_tool("revoke_grant", {"grant_id": grant.id})
            assert again.is_error and structured(again)["error"]["class"] == "not_found"
        held = await _echo(one, agent, "after the revocation")
        assert held.mode_source == "org"


async def test_a_session_grant_covers_that_session_only(tmp_path: Path) -> None:
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
                        (offered,) = structured(await approver.call_tool("list_pending", {}))["approvals"]
                        assert offered["scopes"] == ["once", "session", "hour", "always"]
                        await approver.call_tool("approve", {"invocation_id": waiting.id, "scope": "session"})
                assert not (await session.call_tool("fx__echo", {"text": "two"})).is_error
                (grant,) = await bastion.ledger.grants.grants()
                assert (grant.scope, grant.session_id) == ("session", waiting.session_id)
                (latest, *_) = await bastion.ledger.invocations.list()
                assert (latest.mode, latest.mode_source) == ("allow", f"grant:{grant.id}")
        held = await _echo(bastion, agent, "from another session")
        assert held.session_id != waiting.session_id and held.mode_source == "org"


async def test_a_host_without_sessions_is_offered_an_hour_for_its_caller_instead(tmp_path: Path) -> None:
    """A 2026-07-28 host has no session (its calls are counted by caller): "for this session" would last as long as
    its token, so it is refused before anything is decided, and "for an hour" covers that caller only."""
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        other_agent = await bastion.token("other-agent", "agent")
        admin = await bastion.token("alice", "admin")
        results: list[types.CallToolResult] = []

        async def call() -> None:
            async with bastion.client(agent, era="2026-07-28") as client:
                results.append(await client.call_tool("fx__echo", {"text": "one"}))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                (waiting,) = await bastion.pending(1)
                async with bastion.client(admin, APPROVER) as approver:
                    (offered,) = structured(await approver.call_tool("list_pending", {}))["approvals"]
                    assert offered["scopes"] == ["once", "hour", "always"]
                    refused = await approver.call_tool("approve", {"invocation_id": waiting.id, "scope": "session"})
                    assert refused.is_error
                    error = structured(refused)["error"]
                    assert error["class"] == "invalid_arguments" and '"hour"' in error["message"]
                    still = await bastion.ledger.invocations.get(waiting.id)
                    assert still is not None and still.status == "pending"
                    await approver.call_tool("approve", {"invocation_id": waiting.id, "scope": "hour"})
        assert not results[0].is_error
        (grant,) = await bastion.ledger.grants.grants()
        assert (grant.scope, grant.principal, grant.session_id) == ("hour", "ci-agent", None)
        assert grant.expires_at == grant.created_at + timedelta(hours=1)

        with anyio.fail_after(WAIT):
            async with bastion.client(agent, era="2026-07-28") as client:  # another connection, the same caller
                assert not (await client.call_tool("fx__echo", {"text": "two"})).is_error
        (latest, *_) = await bastion.ledger.invocations.list()
        assert latest.mode_source == f"grant:{grant.id}"
        held = await _echo(bastion, other_agent, "another caller", era="2026-07-28")
        assert held.mode_source == "org"


async def test_a_grants_condition_covers_only_the_calls_it_holds_for_and_a_bad_one_decides_nothing(
    tmp_path: Path,
) -> None:
    async with live(tmp_path) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call_in_background, bastion, agent, results)
                (waiting,) = await bastion.pending(1)
                async with bastion.client(admin, APPROVER) as approver:
                    for when, problem in [
                        ("args.text.startsWith(", "not a valid CEL expression"),
                        ("args.file_path.startsWith('/srv/')", "normpath(args.file_path)"),
                    ]:
                        refused = await approver.call_tool(
                            "approve", {"invocation_id": waiting.id, "scope": "always", "when": when}
                        )
                        assert structured(refused)["error"]["class"] == "invalid_arguments"
                        assert problem in structured(refused)["error"]["message"]
                    once = await approver.call_tool(
                        "approve", {"invocation_id": waiting.id, "when": "args.text == 'hello'"}
                    )
                    assert '"once" approves this call only' in structured(once)["error"]["message"]
                    assert not await bastion.ledger.grants.grants()
                    await approver.call_tool(
                        "approve",
                        {"invocation_id": waiting.id, "scope": "always", "when": "args.text.startsWith('safe ')"},
                    )
        assert not results[0].is_error
        (grant,) = await bastion.ledger.grants.grants()
        assert grant.rule == "args.text.startsWith('safe ')"
        with anyio.fail_after(WAIT):
            async with bastion.client(agent) as client:
                assert not (await client.call_tool("fx__echo", {"text": "safe words"})).is_error
        (latest, *_) = await bastion.ledger.invocations.list()
        assert latest.mode_source == f"grant:{grant.id}"
        held = await _echo(bastion, agent, "anything else")
        assert held.mode_source == "org"


async def test_a_session_grant_keeps_the_operators_rules_on_arguments(tmp_path: Path) -> None:
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


async def test_an_always_grant_never_lets_through_a_call_that_an_operators_wildcard_rule_denies(
    tmp_path: Path,
) -> None:
    """The operator holds fx:echo and denies, on every fx action, arguments with `..`; an approver approves one
    harmless echo "always": later harmless echoes run (by the grant), and one with `..` still does not."""
    dots = {"key": "fx:*", "when": 'args.text.contains("..")', "mode": "deny"}
    async with live(tmp_path, rules=[dots]) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        await _held_then_approved(bastion, agent, admin, {"scope": "always"})
        (grant,) = await bastion.ledger.grants.grants()
        with anyio.fail_after(WAIT):
            async with bastion.client(agent) as client:
                assert not (await client.call_tool("fx__echo", {"text": "harmless"})).is_error
                (latest, *_) = await bastion.ledger.invocations.list()
                assert (latest.status, latest.mode_source) == ("completed", f"grant:{grant.id}")
        dotted = await _echo(bastion, agent, "../../etc/passwd")  # held for an approver, as without the grant
        assert "../../etc/passwd" in str(dotted.args)
        assert dotted.mode_source == "org"


async def test_always_is_not_offered_on_the_embedded_default_and_is_refused_before_anything_is_decided(
    tmp_path: Path,
) -> None:
    """On the embedded default no operator chose the policy an "always" approval would widen: it is not offered,
    and asked for anyway it is refused with the fix while the call stays pending (it used to be approved anyway,
    the approver seeing only an error)."""
    async with live(tmp_path, embedded=True) as bastion:
        agent = await bastion.token("ci-agent", "agent")
        admin = await bastion.token("alice", "admin")
        results: list[types.CallToolResult] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_call_in_background, bastion, agent, results)
                (waiting,) = await bastion.pending(1)
                async with bastion.client(admin, APPROVER) as approver:
                    (offered,) = structured(await approver.call_tool("list_pending", {}))["approvals"]
                    assert "always" not in offered["scopes"]
                    refused = await approver.call_tool("approve", {"invocation_id": waiting.id, "scope": "always"})
                    error = structured(refused)["error"]
                    assert refused.is_error and error["class"] == "config_error" and "--config DIR" in error["message"]
                    still = await bastion.ledger.invocations.get(waiting.id)
                    assert still is not None and still.status == "pending"
                    await approver.call_tool("deny", {"invocation_id": waiting.id, "reason": "cleanup"})
        assert results[0].is_error
        assert not await bastion.ledger.grants.grants()
