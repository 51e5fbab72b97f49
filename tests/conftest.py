"""Shared fixtures. The anyio backend is pinned to asyncio (aiosqlite is asyncio-only)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
