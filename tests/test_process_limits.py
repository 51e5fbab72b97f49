"""A session only this process serves (a stdio host's, a handshake-era HTTP session) counts its rate limit in
memory (`ProcessLimits`): for any sequence of admissions it decides as the ledger's count does, with the
same waits, and writes nothing to the ledger."""

from __future__ import annotations

import random
import sqlite3
from contextlib import closing
from datetime import timedelta
from pathlib import Path

import pytest

from bastion.ledger import Redactor, open_ledger
from bastion.ledger.limits import ProcessLimits
from tests.harness import harness
from tests.ledger_contract.samples import T0
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

STEPS_MS = (0, 1, 250, 700, 999, 1000, 1001, 5000, 30_000, 59_000, 61_000)
"""Gaps between admissions: at once, within a second, across seconds, across the window's edge."""


async def test_it_decides_as_the_ledger_counts_with_the_same_waits(tmp_path: Path) -> None:
    rng = random.Random(17)
    limits = {"a": 1, "b": 3, "c": 7}
    process = ProcessLimits()
    async with await open_ledger(tmp_path / "l.db", redactor=Redactor()) as ledger:
        now = T0
        for step in range(1500):
            now += timedelta(milliseconds=rng.choice(STEPS_MS))
            key = rng.choice(sorted(limits))
            counted = await ledger.limits.admit(key, per_minute=limits[key], now=now)
            here = await process.admit(key, per_minute=limits[key], now=now)
            assert (here is None) == (counted is None), (step, key, now, here, counted)
            if here is not None and counted is not None:
                assert here == pytest.approx(counted, abs=1e-6), (step, key, now)


async def test_keys_whose_admissions_all_left_the_window_are_forgotten() -> None:
    limits = ProcessLimits()
    for session in range(100):  # sessions that came and went
        assert await limits.admit(f"session-{session}", per_minute=5, now=T0) is None
    assert len(limits) == 100
    assert await limits.admit("session-0", per_minute=5, now=T0 + timedelta(seconds=60)) is None
    assert len(limits) == 100, "a second ago's admissions still count"
    assert await limits.admit("another", per_minute=5, now=T0 + timedelta(seconds=61)) is None
    assert len(limits) == 2, "only the keys admitted within the window are kept"
    assert await limits.admit("session-0", per_minute=2, now=T0 + timedelta(seconds=61)) is None
    assert await limits.admit("session-0", per_minute=2, now=T0 + timedelta(seconds=61)) is not None


async def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="per_minute"):
        await ProcessLimits().admit("a", per_minute=0, now=T0)


def rate_counts(ledger_file: Path) -> list[tuple[str, int]]:
    with closing(sqlite3.connect(ledger_file)) as db:
        return [(str(key), int(count)) for key, count in db.execute("SELECT key, count FROM rate_counts")]


async def test_a_session_only_this_process_serves_is_limited_without_a_count_in_the_ledger(tmp_path: Path) -> None:
    async with harness(tmp_path, per_minute=2, mode="legacy") as h:  # a session minted for its connection
        for _ in range(2):
            assert not (await h.call("fx__echo", {"text": "x"})).is_error
        error = error_of(await h.call("fx__echo", {"text": "x"}))
        assert (error["class"], error["retriable"]) == ("rate_limited", True)
        refused = await h.ledger.invocations.get(error["invocation_id"])
        assert refused is not None
        assert (refused.status, refused.error_class) == ("denied", "rate_limited")
        assert [i.status for i in await h.ledger.invocations.list()].count("completed") == 2
    assert rate_counts(tmp_path / "ledger.db") == []


async def test_a_session_other_instances_may_serve_is_counted_in_the_ledger(tmp_path: Path) -> None:
    async with harness(tmp_path, per_minute=2) as h:  # 2026-07-28: the caller's identity, shared by instances
        for _ in range(2):
            assert not (await h.call("fx__echo", {"text": "x"})).is_error
        assert error_of(await h.call("fx__echo", {"text": "x"}))["class"] == "rate_limited"
    assert sum(count for _, count in rate_counts(tmp_path / "ledger.db")) == 2
