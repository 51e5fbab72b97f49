"""The test session's PostgreSQL server (tests/postgres.py), started the first time a test needs it and stopped
when the session ends (tests/conftest.py).

Without PostgreSQL the tests that need it are skipped, saying how to install it; with BASTION_REQUIRE_POSTGRES=1
(CI sets it) they fail instead, so CI never passes without them.
"""

from __future__ import annotations

import os
from typing import Final

import pytest

from tests.postgres import DEBIAN_BINARIES, PostgresServer, find_binaries, start_server

REQUIRE: Final = "BASTION_REQUIRE_POSTGRES"
"""Set to 1 to make a missing PostgreSQL an error instead of a skip."""

_shared: list[PostgresServer] = []


def shared_server() -> PostgresServer:
    """The test session's server, started on first use (`stop_shared_server` stops it when the session ends).

    Skips the calling test when PostgreSQL is not installed, or fails it under BASTION_REQUIRE_POSTGRES=1.
    """
    if _shared:
        return _shared[0]
    binaries = find_binaries()
    if binaries is None:
        reason = (
            f"PostgreSQL is not installed (no initdb/pg_ctl/postgres under {DEBIAN_BINARIES}/*/bin or on PATH): "
            "install Debian's package (apt-get install postgresql)"
        )
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{reason}; {REQUIRE}=1 requires it", pytrace=False)
        pytest.skip(f"{reason}, or set {REQUIRE}=1 to make this an error")
    _shared.append(start_server(binaries))
    return _shared[0]


def stop_shared_server() -> None:
    while _shared:
        _shared.pop().stop()
