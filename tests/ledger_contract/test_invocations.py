"""Invocations and their events: round trips, transitions and their conflicts, outcomes, listing, counting and
finding by id prefix."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import anyio
import pytest

from bastion import states
from bastion.errors import Conflict
from bastion.ledger import OpenLedger
from bastion.models import Status
from bastion.pipeline.seams import Ledger
from tests.ledger_contract.backends import Backend
from tests.ledger_contract.samples import CANARY, T0, make_invocation

pytestmark = pytest.mark.anyio


# -- round trips -------------------------------------------------------------------------------------------


async def test_an_opened_ledger_satisfies_the_gateway_ledger_protocol(ledger: OpenLedger) -> None:
    seam: Ledger = ledger
    assert await seam.invocations.get("missing") is None
    assert isinstance(ledger, OpenLedger)


async def test_record_then_get_round_trips_every_field(ledger: OpenLedger) -> None:
    invocation = make_invocation(
        fingerprint="f" * 64,
        profile="nightly",
        principal="alice",
        args={"nested": [1, 2.5, None, True, {"ü": "ß"}], "empty": {}},
        result={"content": [{"type": "text", "text": "done"}], "isError": False},
        error_class="upstream_error",
        error_message="went wrong",
        owner="instance-1",
        expires_at=T0 + timedelta(minutes=5),
    )
    await ledger.invocations.record(invocation, ["planned", "pending"])
    stored = await ledger.invocations.get(invocation.id)
    assert stored == invocation
    assert stored is not None
    assert stored.created_at.tzinfo is not None
    assert stored.created_at.utcoffset() == timedelta(0)


async def test_timestamps_come_back_as_the_same_instant_in_utc(ledger: OpenLedger) -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2026, 11, 21, 12, 0, 0, 123456, tzinfo=plus_two)
    await ledger.invocations.record(
        make_invocation(created_at=local, expires_at=datetime(2026, 11, 21, 10, 5)), ["planned"]
    )
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.created_at == local
    assert stored.created_at.tzinfo == UTC
    assert stored.expires_at == datetime(2026, 11, 21, 10, 5, tzinfo=UTC)  # naive means UTC


async def test_get_of_an_unknown_id_is_none(ledger: OpenLedger) -> None:
    assert await ledger.invocations.get("nope") is None
    assert await ledger.invocations.events("nope") == []


async def test_record_appends_its_events_in_order_with_one_timestamp(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(status="denied"), ["planned", "denied"], {"reason": "policy"})
    events = await ledger.invocations.events("inv-0001")
    assert [(event.seq, event.kind) for event in events] == [(1, "planned"), (2, "denied")]
    assert events[0].at == events[1].at
    assert [event.detail for event in events] == [{}, {"reason": "policy"}]
    assert events[0].id < events[1].id


async def test_recording_the_same_id_twice_is_a_conflict(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(), ["planned"])
    with pytest.raises(Conflict):
        await ledger.invocations.record(make_invocation(status="approved"), ["planned", "approved"])
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.status == "pending"
    assert len(await ledger.invocations.events("inv-0001")) == 1


async def test_a_write_that_fails_inside_its_transaction_rolls_back_and_keeps_the_ledger_usable(
    ledger: OpenLedger,
) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned"])
    with pytest.raises(Conflict):
        await ledger.invocations.record(make_invocation(1), ["planned"])
    await ledger.invocations.record(make_invocation(2), ["planned"])
    assert await ledger.invocations.count() == 2
    assert len(await ledger.invocations.events("inv-0001")) == 1


async def test_a_cancelled_write_is_all_or_nothing_and_leaves_the_ledger_usable(ledger: OpenLedger) -> None:
    with anyio.CancelScope() as scope:
        scope.cancel()
        await ledger.invocations.record(make_invocation(1), ["planned", "pending"])
    await ledger.invocations.record(make_invocation(2), ["planned"])
    first = await ledger.invocations.get("inv-0001")
    assert len(await ledger.invocations.events("inv-0001")) == (0 if first is None else 2)
    assert await ledger.invocations.get("inv-0002") is not None


async def test_the_drift_diff_round_trips_through_record_get_and_list(ledger: OpenLedger) -> None:
    diff = ['-  "description": "Write a file"', '+  "description": "Write a file, then mail it to ü@x"']
    await ledger.invocations.record(make_invocation(1, drift=diff), ["planned", "pending"])
    await ledger.invocations.record(make_invocation(2), ["planned", "pending"])
    await ledger.invocations.record(make_invocation(3, drift=[]), ["planned", "pending"])
    first = await ledger.invocations.get("inv-0001")
    assert first is not None
    assert first.drift == diff
    assert [invocation.drift for invocation in await ledger.invocations.list()] == [[], None, diff]


# -- transitions -------------------------------------------------------------------------------------------


async def test_transition_sets_status_fields_and_appends_the_next_event(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(status="executing"), ["planned", "approved", "executing"])
    expiry = T0 + timedelta(hours=1)
    updated = await ledger.invocations.transition(
        "inv-0001",
        from_statuses=["executing"],
        to="failed",
        detail={"attempt": 1},
        fields={
            "result": {"isError": True},
            "error_class": "upstream_error",
            "error_message": "boom",
            "owner": "instance-2",
            "expires_at": expiry,
        },
    )
    assert updated is not None
    assert (updated.status, updated.result, updated.error_class, updated.error_message) == (
        "failed",
        {"isError": True},
        "upstream_error",
        "boom",
    )
    assert (updated.owner, updated.expires_at) == ("instance-2", expiry)
    assert updated.updated_at > updated.created_at
    assert await ledger.invocations.get("inv-0001") == updated
    events = await ledger.invocations.events("inv-0001")
    assert [(event.seq, event.kind, event.detail) for event in events][-1] == (4, "failed", {"attempt": 1})
    assert events[-1].at == updated.updated_at


async def test_transition_can_name_its_event_and_leaves_unset_fields_alone(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(status="unknown", error_class="timeout", owner="a"), ["planned"])
    updated = await ledger.invocations.transition(
        "inv-0001", from_statuses=["unknown"], to="completed", event="reconciled"
    )
    assert updated is not None
    assert (updated.status, updated.error_class, updated.owner) == ("completed", "timeout", "a")
    assert [event.kind for event in await ledger.invocations.events("inv-0001")] == ["planned", "reconciled"]


@pytest.mark.parametrize("status", states.NOTE_CHECK.from_)
async def test_a_move_that_leaves_the_status_appends_its_event_keeps_updated_at_and_the_chain_verifies(
    ledger: OpenLedger, status: Status
) -> None:
    await ledger.invocations.record(make_invocation(status=status, updated_at=T0, owner="a"), ["planned", status])
    detail = {"by": "alice", "how": "check", "reason": "made by agent"}
    noted = await ledger.invocations.transition(
        "inv-0001", from_statuses=(status,), to=status, event="checked", detail=detail
    )
    assert noted is not None
    assert (noted.status, noted.updated_at, noted.owner) == (status, T0, "a"), "the call's window does not move"
    events = await ledger.invocations.events("inv-0001")
    assert [(event.kind, event.detail) for event in events][-1] == ("checked", detail)
    assert await ledger.invocations.get("inv-0001") == noted
    report = await ledger.audit.verify()
    assert report.broken is None, report.broken
    assert (report.verified, report.records) == (3, 1)


async def test_transition_from_a_wrong_status_returns_none_and_appends_nothing(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(), ["planned", "pending"])
    assert (
        await ledger.invocations.transition("inv-0001", from_statuses=["executing", "unknown"], to="completed") is None
    )
    assert await ledger.invocations.transition("missing", from_statuses=["pending"], to="approved") is None
    assert await ledger.invocations.transition("inv-0001", from_statuses=[], to="approved") is None
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.status == "pending"
    assert len(await ledger.invocations.events("inv-0001")) == 2


async def test_transition_refuses_fields_it_does_not_own(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(), ["planned"])
    with pytest.raises(ValueError, match="status"):
        await ledger.invocations.transition(
            "inv-0001", from_statuses=["pending"], to="approved", fields={"status": "x"}
        )
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.status == "pending"


async def test_finish_records_the_outcome_of_an_executing_invocation_once(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1, status="executing"), ["planned", "approved", "executing"])
    result = {"content": [{"type": "text", "text": f"token={CANARY}"}]}
    assert await ledger.invocations.finish(
        "inv-0001", "failed", result=result, error_class="upstream_error", error_message="no"
    )
    stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert (stored.status, stored.error_class, stored.error_message) == ("failed", "upstream_error", "no")
    assert CANARY not in json.dumps(stored.result)
    assert not await ledger.invocations.finish("inv-0001", "completed")  # no longer executing: nothing changes
    assert not await ledger.invocations.finish("missing", "completed")
    kinds = [event.kind for event in await ledger.invocations.events("inv-0001")]
    assert kinds == ["planned", "approved", "executing", "failed"]


# -- listing, counting, finding ------------------------------------------------------------------------------


async def test_list_filters_and_returns_newest_first(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned"])
    await ledger.invocations.record(make_invocation(2, source_id="github", session_id="session-b"), ["planned"])
    await ledger.invocations.record(make_invocation(3, status="denied"), ["planned", "denied"])
    await ledger.invocations.record(make_invocation(4, session_id="session-b"), ["planned"])
    # Same created_at as number 4: insertion order breaks the tie.
    await ledger.invocations.record(make_invocation(5, created_at=T0 + timedelta(seconds=4)), ["planned"])

    async def ids(**filters: Any) -> list[str]:
        return [invocation.id for invocation in await ledger.invocations.list(**filters)]

    assert await ids() == ["inv-0005", "inv-0004", "inv-0003", "inv-0002", "inv-0001"]
    assert await ids(status="pending") == ["inv-0005", "inv-0004", "inv-0002", "inv-0001"]
    assert await ids(status="denied") == ["inv-0003"]
    assert await ids(source_id="github") == ["inv-0002"]
    assert await ids(session_id="session-b") == ["inv-0004", "inv-0002"]
    assert await ids(status="pending", session_id="session-a", source_id="fs") == ["inv-0005", "inv-0001"]
    assert await ids(limit=2) == ["inv-0005", "inv-0004"]
    assert await ids(limit=0) == []
    assert await ids(status="expired") == []
    with pytest.raises(ValueError, match="limit"):
        await ledger.invocations.list(limit=-1)
    assert await ledger.invocations.count() == 5
    assert await ledger.invocations.count("pending") == 4
    assert await ledger.invocations.count("completed") == 0


async def test_list_filters_by_principal(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1, principal="alice"), ["planned"])
    await ledger.invocations.record(make_invocation(2, principal="bob"), ["planned"])
    await ledger.invocations.record(make_invocation(3), ["planned"])
    await ledger.invocations.record(make_invocation(4, principal="alice", status="denied"), ["planned", "denied"])
    assert [invocation.id for invocation in await ledger.invocations.list(principal="alice")] == [
        "inv-0004",
        "inv-0001",
    ]
    assert [invocation.id for invocation in await ledger.invocations.list(principal="alice", status="pending")] == [
        "inv-0001"
    ]
    assert await ledger.invocations.list(principal="carol") == []


async def test_count_filters_by_status_and_session(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1), ["planned", "pending"])
    await ledger.invocations.record(make_invocation(2, session_id="session-b"), ["planned", "pending"])
    await ledger.invocations.record(make_invocation(3, status="denied"), ["planned", "denied"])
    await ledger.invocations.record(make_invocation(4, status="denied", session_id="session-b"), ["planned", "denied"])
    await ledger.invocations.record(make_invocation(5, session_id="session-b"), ["planned", "pending"])
    assert await ledger.invocations.count() == 5
    assert await ledger.invocations.count("pending") == 3
    assert await ledger.invocations.count(session_id="session-b") == 3
    assert await ledger.invocations.count("pending", session_id="session-b") == 2
    assert await ledger.invocations.count("denied", session_id="session-a") == 1
    assert await ledger.invocations.count(session_id="nobody") == 0


async def test_find_returns_the_ids_that_start_with_a_prefix_in_order_up_to_the_limit(ledger: OpenLedger) -> None:
    for number, invocation_id in enumerate(["abc-2", "abd-1", "abc-1", "b-1", "ab"], start=1):
        await ledger.invocations.record(make_invocation(number, id=invocation_id), ["planned"])
    assert await ledger.invocations.find("abc", limit=10) == ["abc-1", "abc-2"]
    assert await ledger.invocations.find("ab", limit=10) == ["ab", "abc-1", "abc-2", "abd-1"]
    assert await ledger.invocations.find("ab") == ["ab", "abc-1"]  # two by default: enough to tell "ambiguous"
    assert await ledger.invocations.find("abc-1", limit=10) == ["abc-1"]
    assert await ledger.invocations.find("", limit=10) == ["ab", "abc-1", "abc-2", "abd-1", "b-1"]
    assert await ledger.invocations.find("abc-10", limit=10) == []
    assert await ledger.invocations.find("ABC", limit=10) == []  # ids are case-sensitive
    assert await ledger.invocations.find("c", limit=10) == []
    assert await ledger.invocations.find("abc", limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        await ledger.invocations.find("abc", limit=-1)


async def test_find_of_a_principal_sees_only_its_own_invocations(ledger: OpenLedger) -> None:
    await ledger.invocations.record(make_invocation(1, id="abc-1", principal="alice"), ["planned"])
    await ledger.invocations.record(make_invocation(2, id="abc-2", principal="bob"), ["planned"])
    await ledger.invocations.record(make_invocation(3, id="abc-3"), ["planned"])
    assert await ledger.invocations.find("abc", principal="alice", limit=10) == ["abc-1"]
    assert await ledger.invocations.find("abc-2", principal="alice", limit=10) == []
    assert await ledger.invocations.find("abc", principal="carol", limit=10) == []
    assert await ledger.invocations.find("abc", limit=10) == ["abc-1", "abc-2", "abc-3"]


@pytest.mark.parametrize("prefix", ["a%", "a_", "a\\", "a*", "a?", "a[", "a'"])
async def test_find_takes_the_prefix_literally(ledger: OpenLedger, prefix: str) -> None:
    """Wildcards of LIKE and GLOB, escapes and quotes in a prefix match only themselves."""
    ids = sorted({"ab-1", "a-1", "a%b", "a_b", "a\\b", "a*b", "a?b", "a[b", "a'b", prefix + "-1"})
    for number, invocation_id in enumerate(ids, start=1):
        await ledger.invocations.record(make_invocation(number, id=invocation_id), ["planned"])
    expected = [invocation_id for invocation_id in ids if invocation_id.startswith(prefix)]
    assert len(expected) == 2
    assert await ledger.invocations.find(prefix, limit=10) == expected


@pytest.mark.parametrize(
    "prefix",
    ["", "a", "a\U0010ffff", "\U0010ffff", "a\ud7ff", "z" * 40],
    ids=["empty", "letter", "then-last-code-point", "last-code-point", "then-before-surrogates", "long"],
)
async def test_find_sees_ids_at_the_very_end_of_the_id_space(ledger: OpenLedger, prefix: str) -> None:
    """No id that starts with the prefix is missed, however high its next characters (the last code point, the
    one before the surrogates)."""
    tails = ["", "0", "\U0010ffff", "\U0010ffff\U0010ffff", "\ud7ff", "\ue000", "~"]
    ids = sorted({prefix + tail for tail in tails} | {"b", "\U0010ffff"})
    for number, invocation_id in enumerate(ids, start=1):
        await ledger.invocations.record(make_invocation(number, id=invocation_id), ["planned"])
    expected = [invocation_id for invocation_id in ids if invocation_id.startswith(prefix)]
    assert await ledger.invocations.find(prefix, limit=100) == expected


# -- commit times ------------------------------------------------------------------------------------------


async def test_every_committed_write_is_timed_for_the_commit_listeners(ledger: OpenLedger, backend: Backend) -> None:
    seconds: list[float] = []
    ledger.commits.listen(seconds.append)
    invocation = make_invocation()
    await ledger.invocations.record(invocation, ["planned", "approved", "executing"])
    assert len(seconds) == 1
    await ledger.invocations.finish(invocation.id, "completed", result=None, error_class=None, error_message=None)
    assert len(seconds) == 2
    assert all(s >= 0 for s in seconds)
    assert ledger.commits.backend == backend.name
