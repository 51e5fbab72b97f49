"""Secrets bound in the configuration, kept out of everything a source hands back.

A provider's token, a plugin's `[plugins] env` values: an API may echo a token back, a failing step may print its
environment on stderr. What a source returns or raises is scrubbed of them by value before it reaches a host, a log
line or the ledger (which redacts what looks like a credential, but cannot know these).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

SCRUBBED: Final = "[REDACTED]"
MIN_SECRET_CHARS: Final = 4
"""Shorter values are not scrubbed: no credential is that short, and replacing every `1` or `on` would garble the
output."""


def scrub(value: Any, secrets: str | Iterable[str]) -> Any:
    """`value` with every occurrence of each secret in its strings (keys included) replaced by `[REDACTED]`; longer
    secrets first, so one that contains another is replaced whole."""
    wanted = [secrets] if isinstance(secrets, str) else list(secrets)
    kept = sorted({secret for secret in wanted if len(secret) >= MIN_SECRET_CHARS}, key=len, reverse=True)
    return _scrub(value, kept) if kept else value


def _scrub(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, SCRUBBED)
        return value
    if isinstance(value, list):
        return [_scrub(item, secrets) for item in value]
    if isinstance(value, dict):
        return {_scrub(key, secrets): _scrub(item, secrets) for key, item in value.items()}
    return value
