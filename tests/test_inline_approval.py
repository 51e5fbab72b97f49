"""Inline approval: the host's own user answers a form, in both protocol eras, beside the approver path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client.session import ClientRequestContext

from bastion.config import ApprovalSettings, Profile
from bastion.models import utcnow
from tests.harness import harness
from tests.test_approvals import wait_pending
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

LOCAL = {"local": Profile(inline_approval=True)}
FAST = ApprovalSettings(heartbeat_seconds=0.05)
ERAS = ["legacy", "auto"]


class Answers:
    """An elicitation callback that answers with a fixed form result and remembers what it was asked."""

    def __init__(self, action: str, content: dict[str, Any] | None = None) -> None:
        self.result = types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]
        self.asked: list[str] = []
        self.answered = anyio.Event()

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append(params.message)
        self.answered.set()
        return self.result


@pytest.mark.parametrize("mode", ERAS)
async def test_the_hosts_user_approves_inline_and_the_call_returns_its_result(tmp_path: Path, mode: str) -> None:
    answers = Answers("accept", {"decision": "approve", "reason": "looks right"})
    async with harness(tmp_path, profiles=LOCAL, profile="local", approvals=FAST, mode=mode, elicitation=answers) as h:
        result = await h.call("fx__progress")
        assert not result.is_error
        assert "fx__progress" in answers.asked[0]
        invocation = await h.only_invocation()
        assert invocation.status == "completed"
        approved = [e for e in await h.ledger.invocations.events(invocation.id) if e.kind == "approved"]
        assert approved[0].detail["by"].startswith("inline:")
        assert approved[0].detail["note"] == "looks right"


@pytest.mark.parametrize("mode", ERAS)
async def test_the_hosts_user_declines_inline(tmp_path: Path, mode: str) -> None:
    answers = Answers("decline")
    async with harness(tmp_path, profiles=LOCAL, profile="local", approvals=FAST, mode=mode, elicitation=answers) as h:
        error = error_of(await h.call("fx__progress"))
        assert error["class"] == "approval_denied"
        assert h.fixture.calls == []


@pytest.mark.parametrize("mode", ERAS)
async def test_a_cancelled_form_falls_back_to_the_approvers(tmp_path: Path, mode: str) -> None:
    answers = Answers("cancel")
    outcome: list[types.CallToolResult] = []
    async with harness(tmp_path, profiles=LOCAL, profile="local", approvals=FAST, mode=mode, elicitation=answers) as h:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                outcome.append(await h.call("fx__progress"))

            tg.start_soon(call)
            (pending,) = await wait_pending(h)
            with anyio.fail_after(10):
                await answers.answered.wait()
            await h.ledger.invocations.decide(pending.id, approve=True, principal="alice", note=None, now=utcnow())
        assert not outcome[0].is_error


async def test_a_host_without_elicitation_waits_for_the_approvers(tmp_path: Path) -> None:
    async with harness(tmp_path, profiles=LOCAL, profile="local", approvals=FAST) as h:
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.call, "fx__progress")
            (pending,) = await wait_pending(h)
            await h.ledger.invocations.decide(pending.id, approve=True, principal="alice", note=None, now=utcnow())
        assert (await h.ledger.invocations.get(pending.id)) is not None


async def test_an_authenticated_agent_is_never_offered_inline_approval(tmp_path: Path) -> None:
    answers = Answers("accept", {"decision": "approve"})
    async with harness(
        tmp_path, profiles=LOCAL, profile="local", approvals=FAST, principal="agent-1", elicitation=answers
    ) as h:
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.call, "fx__progress")
            (pending,) = await wait_pending(h)
            await h.ledger.invocations.decide(pending.id, approve=False, principal="alice", note=None, now=utcnow())
        assert answers.asked == []
