"""Pins: saved whole, listed in order, drift accepted for one action or a whole source, and tool
definitions kept verbatim (never redacted: they are not secrets, and a scrubbed copy would make diffs lie)."""

from __future__ import annotations

from datetime import datetime

import pytest

from bastion.errors import NotFound
from bastion.ledger import OpenLedger
from bastion.models import Pin
from tests.ledger_contract.samples import CANARY, make_pin, observation

pytestmark = pytest.mark.anyio


async def test_a_saved_pin_round_trips_with_its_definitions_verbatim(ledger: OpenLedger) -> None:
    definition = {
        "inputSchema": {"type": "object", "properties": {"token": {"type": "string", "default": CANARY}}},
        "annotations": {"password": "is a field name here", "ü": ["ß", 1, None]},
    }
    pin = Pin(
        source_id="fs",
        action_id="write_file",
        pinned=observation(1, **definition),
        pinned_by="config",
        drift=observation(2, **definition),
    )
    await ledger.pins.save_pin(pin)
    assert await ledger.pins.pins() == [pin]


async def test_saving_a_pin_again_replaces_the_whole_row(ledger: OpenLedger) -> None:
    await ledger.pins.save_pin(make_pin("fs", "write_file", drifted=True))
    replacement = Pin(source_id="fs", action_id="write_file", pinned=observation(7), pinned_by=None)
    await ledger.pins.save_pin(replacement)
    assert await ledger.pins.pins() == [replacement]


async def test_pins_are_sorted_by_source_and_action_and_filtered_by_source(ledger: OpenLedger) -> None:
    for source_id, action_id in [("notes", "b"), ("fs", "write"), ("notes", "a"), ("fs", "read")]:
        await ledger.pins.save_pin(make_pin(source_id, action_id))
    assert [pin.key for pin in await ledger.pins.pins()] == ["fs:read", "fs:write", "notes:a", "notes:b"]
    assert [pin.key for pin in await ledger.pins.pins("notes")] == ["notes:a", "notes:b"]
    assert await ledger.pins.pins("nowhere") == []


async def test_a_drifted_pin_saved_through_one_connection_is_accepted_through_another(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    await ledger.pins.save_pin(make_pin("fs", "write", drifted=True))
    accepted = await another.pins.accept_drift(source_id="fs", action_id="write", principal="alice")
    assert [(pin.pinned, pin.pinned_by, pin.drift) for pin in accepted] == [(observation(2), "alice", None)]
    assert await ledger.pins.pins() == accepted


async def test_accepting_the_drift_of_one_action_repins_only_it(ledger: OpenLedger) -> None:
    await ledger.pins.save_pin(make_pin("fs", "read", drifted=True))
    await ledger.pins.save_pin(make_pin("fs", "write", drifted=True))

    accepted = await ledger.pins.accept_drift(source_id="fs", action_id="write", principal="alice")

    expected = Pin(source_id="fs", action_id="write", pinned=observation(2), pinned_by="alice", drift=None)
    assert accepted == [expected]
    assert await ledger.pins.pins("fs") == [make_pin("fs", "read", drifted=True), expected]


async def test_accepting_the_drift_of_a_source_repins_every_drifted_action_of_it(ledger: OpenLedger) -> None:
    await ledger.pins.save_pin(make_pin("fs", "write", drifted=True))
    await ledger.pins.save_pin(make_pin("fs", "read"))
    await ledger.pins.save_pin(make_pin("fs", "delete", drifted=True))
    await ledger.pins.save_pin(make_pin("notes", "add", drifted=True))

    accepted = await ledger.pins.accept_drift(source_id="fs", action_id=None, principal="alice")

    assert [(pin.action_id, pin.pinned, pin.pinned_by, pin.drift) for pin in accepted] == [
        ("delete", observation(2), "alice", None),
        ("write", observation(2), "alice", None),
    ]
    stored = {pin.key: pin for pin in await ledger.pins.pins()}
    assert stored["fs:read"] == make_pin("fs", "read")
    assert stored["notes:add"] == make_pin("notes", "add", drifted=True)
    assert await ledger.pins.accept_drift(source_id="fs", action_id=None, principal="alice") == []


async def test_accepting_without_drift_returns_nothing_and_an_unknown_action_is_not_found(
    ledger: OpenLedger,
) -> None:
    await ledger.pins.save_pin(make_pin("fs", "read"))
    assert await ledger.pins.accept_drift(source_id="fs", action_id="read", principal="alice") == []
    assert await ledger.pins.pins() == [make_pin("fs", "read")]
    assert await ledger.pins.accept_drift(source_id="nowhere", action_id=None, principal="alice") == []
    with pytest.raises(NotFound, match="fs:missing"):
        await ledger.pins.accept_drift(source_id="fs", action_id="missing", principal="alice")


async def test_a_tool_name_once_kept_stays_with_its_action(ledger: OpenLedger) -> None:
    assert await ledger.pins.tool_names() == {}
    now = datetime.fromisoformat("2026-11-28T10:00:00+00:00")
    await ledger.pins.keep_tool_names({"ops__echo": ("ops", "echo"), "fs__read": ("fs", "read")}, now=now)
    await ledger.pins.keep_tool_names({"ops__echo": ("aaa", "ops__echo"), "aaa__x": ("aaa", "x")}, now=now)

    assert await ledger.pins.tool_names() == {
        "ops__echo": ("ops", "echo"),
        "fs__read": ("fs", "read"),
        "aaa__x": ("aaa", "x"),
    }
