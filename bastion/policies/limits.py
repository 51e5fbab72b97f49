"""Per-session rate limiting (DESIGN.md §6): pure bookkeeping, the caller passes the clock in."""

from __future__ import annotations

from collections import deque


class RateLimiter:
    """At most `per_minute` admissions per key in any sliding 60-second window."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._admitted: dict[str, deque[float]] = {}

    def admit(self, key: str, now: float) -> bool:
        """Record and allow one more for `key` at monotonic time `now`, or refuse it (nothing recorded)."""
        window = self._admitted.setdefault(key, deque())
        while window and window[0] <= now - 60.0:
            window.popleft()
        if len(window) >= self.per_minute:
            return False
        window.append(now)
        return True

    def retry_after(self, key: str, now: float) -> float:
        """Seconds until `key` may be admitted again (0 when it may be now)."""
        window = self._admitted.get(key)
        if not window or len(window) < self.per_minute:
            return 0.0
        return max(0.0, window[0] + 60.0 - now)
