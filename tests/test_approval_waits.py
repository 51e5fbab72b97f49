"""How long a host waits for an approver, and what the agent is told while it waits.

A host that sends a progress token is kept waiting with heartbeats; one that sends none (and so would time out)
gets `approval_pending` after `wait_without_progress_seconds`. Nothing the agent is told names a command that
decides: an agent with a shell could run it.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import anyio
import mcp_types as types
import pytest

from bastion.config import ApprovalSettings
from bastion.models import Invocation, Status, utcnow
from bastion.pipeline.listings import INVOCATION_TOOL
from bastion.server import inline
from tests.harness import Harness, harness
from tests.test_approvals import wait_pending
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

IMPATIENT = ApprovalSettings(heartbeat_seconds=0.05, expiry_seconds=300, wait_without_progress_seconds=0.2)
DECIDING = re.compile(r"approvals\s+(approve|deny|watch)|pins\s+accept|tokens\s+(create|revoke)|/(approve|deny)\b")
"""A command (or API route) that decides a call, re-pins or makes a token: never told to the agent."""


async def reaches(h: Harness, invocation_id: str, status: Status) -> Invocation:
    with anyio.fail_after(10):
        while (found := await h.ledger.invocations.get(invocation_id)) is None or found.status != status:
            with anyio.move_on_after(0.1):
                await h.ledger.changes.next(h.ledger.changes.cursor)
    return found


def text_of(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_host_without_a_progress_token_gets_approval_pending_and_the_outcome_later(
    tmp_path: Path, mode: str
) -> None:
    async with harness(tmp_path, approvals=IMPATIENT, mode=mode) as h:
        with anyio.fail_after(10):
            result = await h.call("fx__progress")
        error = error_of(result)
        assert (error["class"], error["retriable"]) == ("approval_pending", False)
        invocation_id = error["invocation_id"]
        assert invocation_id in error["message"]
        assert "bastion__invocation" in error["message"]
        assert (await h.only_invocation()).status == "pending"
        assert h.fixture.calls == []

        lookup = await h.call("bastion__invocation", {"invocation_id": invocation_id})
        assert lookup.structured_content is not None
        assert lookup.structured_content["status"] == "pending"

        await h.ledger.invocations.decide(invocation_id, approve=True, principal="alice", note=None, now=utcnow())
        await reaches(h, invocation_id, "completed")
        lookup = await h.call("bastion__invocation", {"invocation_id": invocation_id})
        assert lookup.structured_content is not None
        assert lookup.structured_content["status"] == "completed"
        assert lookup.structured_content["result"]["content"][0]["text"] == "done"
        assert [c.name for c in h.fixture.calls] == ["progress"]


async def test_a_host_with_a_progress_token_keeps_waiting_with_heartbeats_past_that_bound(tmp_path: Path) -> None:
    beats: list[str] = []
    many = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        beats.append(message or "")
        if len(beats) >= 3 * round(IMPATIENT.wait_without_progress_seconds / IMPATIENT.heartbeat_seconds):
            many.set()

    outcome: list[types.CallToolResult] = []
    async with harness(tmp_path, approvals=IMPATIENT, mode="legacy") as h, anyio.create_task_group() as tg:

        async def call() -> None:
            outcome.append(await h.call("fx__progress", progress=on_progress))

        tg.start_soon(call)
        (pending,) = await wait_pending(h)
        with anyio.fail_after(10):
            await many.wait()
        assert outcome == []
        await h.ledger.invocations.decide(pending.id, approve=True, principal="alice", note=None, now=utcnow())
    (result,) = outcome
    assert not result.is_error
    assert text_of(result) == "done"


async def test_nothing_the_agent_is_told_names_a_command_that_decides(tmp_path: Path) -> None:
    beats: list[str] = []
    heard = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        beats.append(message or "")
        heard.set()

    told: list[str] = []
    async with harness(tmp_path, approvals=IMPATIENT, mode="legacy") as h:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(h.call, "fx__progress", progress=on_progress))
            (waiting,) = await wait_pending(h)
            with anyio.fail_after(10):
                await heard.wait()
            await h.ledger.invocations.decide(waiting.id, approve=False, principal="bob", note=None, now=utcnow())
        pending = await h.call("fx__progress", {"again": True})  # other arguments: not a retry of the denied call
        pending_id = error_of(pending)["invocation_id"]
        lookup = await h.call("bastion__invocation", {"invocation_id": pending_id})
        told += [beats[0], text_of(pending), error_of(pending)["message"], text_of(lookup)]
        held = await h.ledger.invocations.get(pending_id)
        assert held is not None
        told += [INVOCATION_TOOL.description or "", inline.prompt(held, {}), h.client.instructions or ""]
    for text in told:
        assert DECIDING.search(text) is None, text
    for text in (beats[0], text_of(pending), text_of(lookup)):
        assert "human approver" in text and "bastion " not in text, text
    assert waiting.id in beats[0]
    assert pending_id in text_of(pending) and pending_id in text_of(lookup)
