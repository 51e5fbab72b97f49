"""Bearer tokens: a secret shown once that authenticates as its principal until revoked, names
unique among active tokens, and the questions the HTTP door asks (any tokens? any approver tokens?)."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import anyio
import pytest

from bastion.errors import Conflict, NotFound
from bastion.ledger import OpenLedger
from bastion.models import Principal, Role, TokenInfo
from tests.ledger_contract.samples import T0

pytestmark = pytest.mark.anyio


async def test_a_created_token_authenticates_as_its_principal(ledger: OpenLedger) -> None:
    secret = await ledger.tokens.create_token("ci-agent", role="agent", profile="nightly", now=T0)
    owner = await ledger.tokens.create_token("alice@example.com", role="owner", profile=None, now=T0)

    assert secret.startswith("bst_")
    assert len(secret) == 47
    assert await ledger.tokens.authenticate(secret) == Principal(name="ci-agent", role="agent", profile="nightly")
    assert await ledger.tokens.authenticate(owner) == Principal(name="alice@example.com", role="owner")


async def test_a_token_created_through_one_connection_authenticates_through_another(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    secret = await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)
    assert await another.tokens.authenticate(secret) == Principal(name="ci-agent", role="agent")
    await another.tokens.revoke_token("ci-agent", now=T0)
    assert await ledger.tokens.authenticate(secret) is None


async def test_unknown_and_malformed_secrets_do_not_authenticate(ledger: OpenLedger) -> None:
    secret = await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)
    digest = hashlib.sha256(secret.encode()).hexdigest()

    for candidate in ["", "bst_", secret[:-1], secret + "x", secret.upper(), digest, f"Bearer {secret}", "x" * 10_000]:
        assert await ledger.tokens.authenticate(candidate) is None
    assert await ledger.tokens.authenticate("bst_" + "A" * 43) is None


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


async def test_two_connections_creating_a_token_of_one_name_at_once_leave_exactly_one(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    outcomes: list[str | Conflict] = []

    async def create(connection: OpenLedger, role: Role) -> None:
        try:
            outcomes.append(await connection.tokens.create_token("ci-agent", role=role, profile=None, now=T0))
        except Conflict as conflict:
            outcomes.append(conflict)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(create, ledger, "agent")
            group.start_soon(create, another, "admin")

    secrets = [outcome for outcome in outcomes if isinstance(outcome, str)]
    assert (len(secrets), len(outcomes)) == (1, 2)
    (token,) = await another.tokens.tokens()
    assert await ledger.tokens.authenticate(secrets[0]) == Principal(name="ci-agent", role=token.role)


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


async def test_has_tokens_counts_only_active_ones(ledger: OpenLedger) -> None:
    assert not await ledger.tokens.has_tokens()
    await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)
    assert await ledger.tokens.has_tokens()
    await ledger.tokens.revoke_token("ci-agent", now=T0)
    assert not await ledger.tokens.has_tokens()


async def test_has_approver_tokens_counts_only_active_owners_and_admins(ledger: OpenLedger) -> None:
    assert not await ledger.tokens.has_approver_tokens()
    await ledger.tokens.create_token("ci-agent", role="agent", profile=None, now=T0)
    assert not await ledger.tokens.has_approver_tokens()
    approvers: tuple[tuple[str, Role], ...] = (("alice", "owner"), ("bob", "admin"))
    for name, role in approvers:
        await ledger.tokens.create_token(name, role=role, profile=None, now=T0)
        assert await ledger.tokens.has_approver_tokens()
        await ledger.tokens.revoke_token(name, now=T0)
        assert not await ledger.tokens.has_approver_tokens()
    assert await ledger.tokens.has_tokens()


@pytest.mark.parametrize("name", ["", "has space", "a" * 65, "new\nline", "naïve", "semi;colon", "ci-agent\n"])
async def test_unreadable_names_are_refused(ledger: OpenLedger, name: str) -> None:
    with pytest.raises(ValueError, match="token name"):
        await ledger.tokens.create_token(name, role="agent", profile=None, now=T0)
    assert await ledger.tokens.tokens() == []


async def test_only_agent_tokens_take_a_profile(ledger: OpenLedger) -> None:
    with pytest.raises(ValueError, match="profile"):
        await ledger.tokens.create_token("alice", role="owner", profile="nightly", now=T0)
    await ledger.tokens.create_token("a" * 64, role="agent", profile="nightly", now=T0)
    await ledger.tokens.create_token("alice@example.com:laptop_1.x", role="admin", profile=None, now=T0)
    assert len(await ledger.tokens.tokens()) == 2
