"""Standing grants: stored with the approval that makes them (or not at all), found for the calls they cover, ended
by expiry and revocation (seen at once through another connection), never deleted."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from bastion.errors import ApprovalExpired, Conflict, NotFound
from bastion.ledger import OpenLedger
from bastion.models import Grant
from tests.ledger_contract.samples import BEFORE_EXPIRY, EXPIRY, T0, add_pending

pytestmark = pytest.mark.anyio


def make_grant(number: int = 1, **overrides: Any) -> Grant:
    fields: dict[str, Any] = {
        "id": f"always_{number:012x}",
        "policy_key": "fs:write_file",
        "scope": "always",
        "grantor": "alice",
        "invocation_id": "inv-0001",
        "created_at": T0 + timedelta(seconds=number),
        "expires_at": T0 + timedelta(days=90),
    }
    return Grant(**(fields | overrides))


async def covering(ledger: OpenLedger, *, session: str = "session-a", who: str | None = None, **at: Any) -> list[str]:
    now = at.get("now", BEFORE_EXPIRY)
    return [g.id for g in await ledger.grants.covering("fs:write_file", session_id=session, principal=who, now=now)]


async def test_an_approval_stores_its_grant_and_its_event_names_the_scope_and_the_grant(ledger: OpenLedger) -> None:
    invocation_id = await add_pending(ledger)
    grant = make_grant(rule="normpath(args.path).startsWith('/tmp/')")

    await ledger.invocations.decide(
        invocation_id, approve=True, principal="alice", note=None, now=BEFORE_EXPIRY, grant=grant
    )

    assert await ledger.grants.grants() == [grant]
    assert await ledger.grants.grants(standing_at=BEFORE_EXPIRY) == [grant]
    last = (await ledger.invocations.events(invocation_id))[-1]
    assert set(last.detail.pop("signed")) == {"key", "signature"}
    assert last.detail == {"by": "alice", "note": None, "scope": "always", "grant": grant.id}


@pytest.mark.parametrize("late", [False, True], ids=["already-decided", "expired"])
async def test_an_approval_that_does_not_hold_leaves_no_grant(ledger: OpenLedger, late: bool) -> None:
    invocation_id = await add_pending(ledger)
    if not late:
        await ledger.invocations.decide(invocation_id, approve=False, principal="bob", note=None, now=BEFORE_EXPIRY)
    with pytest.raises(ApprovalExpired if late else Conflict):
        await ledger.invocations.decide(
            invocation_id,
            approve=True,
            principal="alice",
            note=None,
            now=EXPIRY if late else BEFORE_EXPIRY,
            grant=make_grant(),
        )
    assert await ledger.grants.grants() == []


async def test_a_grant_covers_the_calls_of_its_scope_only(ledger: OpenLedger) -> None:
    await ledger.grants.add(make_grant(1, id="session_1", scope="session", session_id="session-a"))
    await ledger.grants.add(make_grant(2, id="hour_anon", scope="hour", principal=None))
    await ledger.grants.add(make_grant(3, id="hour_bot", scope="hour", principal="ci-bot"))
    await ledger.grants.add(make_grant(4, id="other_key", policy_key="fs:read_file"))

    assert await covering(ledger, session="session-a") == ["session_1", "hour_anon"]
    assert await covering(ledger, session="session-b") == ["hour_anon"]
    assert await covering(ledger, session="session-b", who="ci-bot") == ["hour_bot"]
    assert await covering(ledger, session="session-a", who="someone") == ["session_1"]

    await ledger.grants.add(make_grant(5, id="always_5"))
    assert await covering(ledger, session="session-b", who="someone") == ["always_5"]


async def test_an_expired_grant_covers_nothing_and_is_no_longer_standing(ledger: OpenLedger) -> None:
    grant = make_grant(expires_at=T0 + timedelta(hours=1))
    await ledger.grants.add(grant)

    assert await covering(ledger, now=T0 + timedelta(minutes=59)) == [grant.id]
    assert await covering(ledger, now=T0 + timedelta(hours=1)) == []
    assert await ledger.grants.grants(standing_at=T0 + timedelta(hours=1)) == []
    assert await ledger.grants.grants() == [grant]
    with pytest.raises(NotFound, match="bastion grants list"):
        await ledger.grants.revoke(grant.id, by="alice", now=T0 + timedelta(hours=2))


async def test_a_revoked_grant_is_kept_with_who_revoked_it_and_ends_at_once_for_every_connection(
    ledger: OpenLedger, another: OpenLedger
) -> None:
    grant = make_grant()
    await ledger.grants.add(grant)
    assert await covering(another) == [grant.id]

    revoked = await another.grants.revoke(grant.id, by="bob", now=BEFORE_EXPIRY + timedelta(minutes=1))

    assert (revoked.revoked_by, revoked.revoked_at) == ("bob", BEFORE_EXPIRY + timedelta(minutes=1))
    assert not revoked.standing(BEFORE_EXPIRY + timedelta(minutes=1))
    assert await covering(ledger, now=BEFORE_EXPIRY + timedelta(minutes=2)) == []
    assert await ledger.grants.grants() == [revoked]
    with pytest.raises(NotFound):
        await ledger.grants.revoke(grant.id, by="bob", now=BEFORE_EXPIRY + timedelta(minutes=3))


async def test_a_drifted_action_ends_every_grant_standing_on_it(ledger: OpenLedger) -> None:
    for number in (1, 2):
        await ledger.grants.add(make_grant(number))
    await ledger.grants.add(make_grant(3, policy_key="fs:read_file"))
    await ledger.grants.add(make_grant(4, expires_at=T0))  # already ended: left as it was

    ended = await ledger.grants.revoke_key("fs:write_file", by="drift", now=BEFORE_EXPIRY)

    assert sorted(g.id for g in ended) == [make_grant(1).id, make_grant(2).id]
    assert {g.revoked_by for g in ended} == {"drift"}
    assert [g.id for g in await ledger.grants.grants(standing_at=BEFORE_EXPIRY)] == [make_grant(3).id]
