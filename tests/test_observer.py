"""The observer hook: what the pipeline tells observers at each moment of an invocation, in every path."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from bastion.models import Invocation, utcnow
from tests.harness import Harness, harness
from tests.test_approvals import FAST, wait_pending

pytestmark = pytest.mark.anyio


class Recording:
    """An observer that writes down (moment, tool, status) as the pipeline tells it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        self.done = anyio.Event()

    def _note(self, moment: str, invocation: Invocation) -> None:
        self.seen.append((moment, invocation.action_id, invocation.status))

    async def planned(self, invocation: Invocation) -> None:
        self._note("planned", invocation)

    async def decided(self, invocation: Invocation) -> None:
        self._note("decided", invocation)

    async def executing(self, invocation: Invocation) -> None:
        self._note("executing", invocation)

    async def finished(self, invocation: Invocation) -> None:
        self._note("finished", invocation)
        self.done.set()


class Broken:
    """An observer that fails at every moment: it must change nothing."""

    async def planned(self, invocation: Invocation) -> None:
        raise RuntimeError("broken observer")

    decided = executing = finished = planned


async def observed(h: Harness) -> Recording:
    recording = Recording()
    h.gateway.observers.add(Broken())
    h.gateway.observers.add(recording)
    return recording


async def test_an_allowed_call_is_planned_decided_executing_and_finished_with_its_result(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        recording = await observed(h)
        assert not (await h.call("fx__echo", {"text": "hi"})).is_error
        assert recording.seen == [
            ("planned", "echo", "executing"),
            ("decided", "echo", "executing"),
            ("executing", "echo", "executing"),
            ("finished", "echo", "completed"),
        ]


async def test_a_refused_call_is_planned_and_decided_denied_and_never_executes(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        recording = await observed(h)
        assert (await h.call("fx__fail")).is_error  # destructive: denied by inferred policy
        assert recording.seen == [("planned", "fail", "denied"), ("decided", "fail", "denied")]


async def test_a_failed_call_finishes_failed(tmp_path: Path) -> None:
    async with harness(tmp_path, modes={"fx:fail": "allow"}) as h:
        recording = await observed(h)
        assert (await h.call("fx__fail")).is_error
        assert recording.seen[-1] == ("finished", "fail", "failed")


async def test_an_approved_call_is_planned_pending_then_decided_executing_and_finished(tmp_path: Path) -> None:
    async with harness(tmp_path, approvals=FAST) as h:
        recording = await observed(h)
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.call, "fx__progress")
            (pending,) = await wait_pending(h)
            await h.ledger.invocations.decide(pending.id, approve=True, principal="alice", note=None, now=utcnow())
            with anyio.fail_after(10):
                await recording.done.wait()
        assert recording.seen == [
            ("planned", "progress", "pending"),
            ("decided", "progress", "approved"),
            ("executing", "progress", "executing"),
            ("finished", "progress", "completed"),
        ]


async def test_a_denied_approval_is_decided_denied(tmp_path: Path) -> None:
    async with harness(tmp_path, approvals=FAST) as h:
        recording = await observed(h)
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.call, "fx__progress")
            (pending,) = await wait_pending(h)
            await h.ledger.invocations.decide(pending.id, approve=False, principal="alice", note="no", now=utcnow())
        assert recording.seen == [("planned", "progress", "pending"), ("decided", "progress", "denied")]
