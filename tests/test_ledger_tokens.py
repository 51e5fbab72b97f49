"""The tokens table of the SQLite ledger: secrets shown once and stored only as their SHA-256."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiosqlite
import pytest

from bastion.errors import Conflict, NotFound
from bastion.ledger import OpenLedger, Redactor, open_ledger, sqlite_path
from bastion.ledger.sqlite import tokens as token_table
from bastion.ledger.sqlite.schema import SCHEMA_VERSION, migrate
from bastion.models import Principal, TokenInfo

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[OpenLedger]:
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as opened:
        yield opened


def ledger_bytes(ledger: OpenLedger) -> bytes:
    """Everything on disk for the ledger: the file, its WAL and its shared-memory index."""
    files = [
        file for file in sqlite_path(ledger.url).parent.iterdir() if file.name.startswith(sqlite_path(ledger.url).name)
    ]
    return b"".join(file.read_bytes() for file in files)


@pytest.mark.anyio
async def test_a_created_token_authenticates_as_its_principal(ledger: OpenLedger) -> None:
    secret = await ledger.tokens.create_token("ci-agent", role="agent", profile="nightly", now=T0)
    owner = await ledger.tokens.create_token("alice@example.com", role="owner", profile=None, now=T0)

    assert secret.startswith("bst_")
    assert len(secret) == 47
    assert await ledger.tokens.authenticate(secret) == Principal(name="ci-agent", role="agent", profile="nightly")
    assert await ledger.tokens.authenticate(owner) == Principal(name="alice@example.com", role="owner")


@pytest.mark.anyio
async def test_the_secret_is_stored_only_as_its_hash(ledger: OpenLedger) -> None:
    secret = await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)

    stored = ledger_bytes(ledger)
    assert secret.encode() not in stored
    assert secret.removeprefix("bst_").encode() not in stored
    assert hashlib.sha256(secret.encode()).hexdigest().encode() in stored


@pytest.mark.anyio
async def test_unknown_and_malformed_secrets_do_not_authenticate(ledger: OpenLedger) -> None:
    secret = await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)
    digest = hashlib.sha256(secret.encode()).hexdigest()

    for candidate in ["", "bst_", secret[:-1], secret + "x", secret.upper(), digest, f"Bearer {secret}", "x" * 10_000]:
        assert await ledger.tokens.authenticate(candidate) is None
    assert await ledger.tokens.authenticate("bst_" + "A" * 43) is None


@pytest.mark.anyio
async def test_a_revoked_token_no_longer_authenticates(ledger: OpenLedger) -> None:
    secret = await ledger.tokens.create_token("ci-agent", role="agent", profile="nightly", now=T0)

    revoked = await ledger.tokens.revoke_token("ci-agent", now=T0 + timedelta(hours=1))

    assert revoked == TokenInfo(
        name="ci-agent", role="agent", profile="nightly", created_at=T0, revoked_at=T0 + timedelta(hours=1)
    )
    assert not revoked.active
    assert await ledger.tokens.authenticate(secret) is None
    with pytest.raises(NotFound, match="ci-agent"):
        await ledger.tokens.revoke_token("ci-agent", now=T0 + timedelta(hours=2))
    with pytest.raises(NotFound):
        await ledger.tokens.revoke_token("never-created", now=T0)


@pytest.mark.anyio
async def test_an_active_name_cannot_be_taken_twice_but_a_revoked_one_can(ledger: OpenLedger) -> None:
    first = await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)
    with pytest.raises(Conflict, match="ci-agent"):
        await ledger.tokens.create_token("ci-agent", role="admin", profile=None, now=T0 + timedelta(minutes=1))
    assert len(await ledger.tokens.tokens()) == 1

    await ledger.tokens.revoke_token("ci-agent", now=T0 + timedelta(minutes=2))
    second = await ledger.tokens.create_token("ci-agent", role="admin", profile=None, now=T0 + timedelta(minutes=3))

    assert await ledger.tokens.authenticate(first) is None
    assert await ledger.tokens.authenticate(second) == Principal(name="ci-agent", role="admin")
    assert [(token.role, token.active) for token in await ledger.tokens.tokens()] == [("admin", True), ("agent", False)]


@pytest.mark.anyio
async def test_tokens_lists_active_and_revoked_newest_first(ledger: OpenLedger) -> None:
    await ledger.tokens.create_token("old", role="owner", profile=None, now=T0)
    await ledger.tokens.create_token("new", role="agent", profile="nightly", now=T0 + timedelta(minutes=2))
    await ledger.tokens.create_token("middle", role="admin", profile=None, now=T0 + timedelta(minutes=1))
    await ledger.tokens.revoke_token("old", now=T0 + timedelta(minutes=3))

    assert await ledger.tokens.tokens() == [
        TokenInfo(name="new", role="agent", profile="nightly", created_at=T0 + timedelta(minutes=2)),
        TokenInfo(name="middle", role="admin", created_at=T0 + timedelta(minutes=1)),
        TokenInfo(name="old", role="owner", created_at=T0, revoked_at=T0 + timedelta(minutes=3)),
    ]


@pytest.mark.anyio
async def test_has_tokens_counts_only_active_ones(ledger: OpenLedger) -> None:
    assert not await ledger.tokens.has_tokens()
    await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)
    assert await ledger.tokens.has_tokens()
    await ledger.tokens.revoke_token("ci-agent", now=T0)
    assert not await ledger.tokens.has_tokens()


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["", "has space", "a" * 65, "new\nline", "naïve", "semi;colon", "ci-agent\n"])
async def test_unreadable_names_are_refused(ledger: OpenLedger, name: str) -> None:
    with pytest.raises(ValueError, match="token name"):
        await ledger.tokens.create_token(name, role="agent", profile=None, now=T0)
    assert await ledger.tokens.tokens() == []


@pytest.mark.anyio
async def test_only_agent_tokens_take_a_profile(ledger: OpenLedger) -> None:
    with pytest.raises(ValueError, match="profile"):
        await ledger.tokens.create_token("alice", role="owner", profile="nightly", now=T0)
    await ledger.tokens.create_token("a" * 64, role="agent", profile="nightly", now=T0)
    await ledger.tokens.create_token("alice@example.com:laptop_1.x", role="admin", profile=None, now=T0)
    assert len(await ledger.tokens.tokens()) == 2


@pytest.mark.anyio
async def test_a_version_2_file_upgrades_keeping_its_rows_and_gains_tokens(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        await migrate(db, to_version=2)
        await db.execute(
            "INSERT INTO invocations (id, status, policy_key, tool, source_id, action_id, risk, mode, mode_source,"
            " session_id, args, args_hash, created_at, updated_at)"
            " VALUES ('old-1', 'completed', 'fs:read', 'fs__read', 'fs', 'read', 'read', 'allow', 'org',"
            " 'session-a', '{\"path\":\"/x\"}', ?, '2026-11-21T10:00:00.000000+00:00',"
            " '2026-11-21T10:00:01.000000+00:00')",
            ("0" * 64,),
        )
        tables = {row[0] for row in await db.execute_fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "tokens" not in tables
    finally:
        await db.close()

    async with await open_ledger(path, redactor=Redactor()) as ledger:
        old = await ledger.invocations.get("old-1")
        assert old is not None
        assert (old.status, old.args) == ("completed", {"path": "/x"})
        assert not await ledger.tokens.has_tokens()
        secret = await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)
        assert await ledger.tokens.authenticate(secret) == Principal(name="ci-agent", role="agent")

    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        rows = list(await db.execute_fetchall("PRAGMA user_version"))
    finally:
        await db.close()
    assert rows[0][0] == SCHEMA_VERSION


@pytest.mark.anyio
async def test_authenticate_is_one_lookup_on_the_secret_hash_index(ledger: OpenLedger) -> None:
    db = await aiosqlite.connect(sqlite_path(ledger.url))
    try:
        plan = list(await db.execute_fetchall("EXPLAIN QUERY PLAN " + token_table.AUTHENTICATE, ("0" * 64,)))
    finally:
        await db.close()
    assert len(plan) == 1
    assert "USING INDEX tokens_secret_hash" in plan[0][3]
