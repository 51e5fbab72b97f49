"""The rate limit's arithmetic, shared by every backend: admissions are counted per key in
one-second buckets, and a key may have at most `per_minute` admissions in the last `WINDOW_SECONDS + 1` buckets.

Counting the whole current second and the 60 before it makes the limit hold in every 60-second window (an
admission counts for at least 60 and at most 61 seconds), whatever the instant it came in; a backend keeps one
row per key and second, so its work per admission does not grow with the limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Final

WINDOW_SECONDS: Final = 60


def second_of(moment: datetime) -> int:
    """The bucket of `moment`: whole seconds since the epoch."""
    return math.floor(moment.timestamp())


def oldest_counted(moment: datetime) -> int:
    """The oldest bucket that still counts at `moment`; older ones can be forgotten."""
    return second_of(moment) - WINDOW_SECONDS


def retry_after(buckets: Iterable[tuple[int, int]], *, per_minute: int, now: datetime) -> float | None:
    """Seconds until one more admission fits, given the counted `(second, count)` buckets oldest first; None when
    one fits now."""
    counted = list(buckets)
    excess = sum(count for _, count in counted) - per_minute + 1
    if excess <= 0:
        return None
    for second, count in counted:
        excess -= count
        if excess <= 0:
            # This bucket stops counting once `oldest_counted` passes it.
            return max(0.0, second + WINDOW_SECONDS + 1 - now.timestamp())
    raise AssertionError("unreachable: the buckets hold the whole excess")


class ProcessLimits:
    """The rate limit of the keys only this process counts against: the sessions no other process serves (a stdio
    host's own, a handshake-era HTTP session held in this process's memory). The same buckets and window as the
    ledger's table, counted in memory, so such a session's calls write no count to the ledger (the count
    was a statement and a page of every call's first transaction). Satisfies `bastion.pipeline.seams.RateLimits`.

    Once a second at most, the seconds that left the window are dropped, and the keys left with none forgotten:
    sessions that end leave nothing behind."""

    def __init__(self) -> None:
        self._buckets: dict[str, dict[int, int]] = {}
        """Per key, the admissions in each second that still counts."""
        self._swept = 0
        """The second whose window the buckets were last cut to."""

    def __len__(self) -> int:
        """How many keys have admissions that may still count."""
        return len(self._buckets)

    async def admit(self, key: str, *, per_minute: int, now: datetime) -> float | None:
        """Count one admission of `key` at `now` unless it had `per_minute` in the window. None when admitted;
        else the seconds until one more fits (nothing counted)."""
        if per_minute < 1:
            raise ValueError(f"per_minute must be at least 1, got {per_minute}")
        oldest, second = oldest_counted(now), second_of(now)
        if second != self._swept:
            self._swept = second
            self._buckets = {
                k: window
                for k, counted in self._buckets.items()
                if (window := {at: n for at, n in counted.items() if at >= oldest})
            }
        buckets = self._buckets.setdefault(key, {})
        if sum(buckets.values()) < per_minute:
            buckets[second] = buckets.get(second, 0) + 1
            return None
        return retry_after(sorted(buckets.items()), per_minute=per_minute, now=now) or 0.0
