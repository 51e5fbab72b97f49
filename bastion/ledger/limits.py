"""The rate limit's arithmetic (DESIGN.md §6), shared by every backend: admissions are counted per key in
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
