"""Which instances are alive: leases for every host, and this host's processes known at once."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path

import pytest

from bastion.ledger import Redactor, open_ledger
from bastion.models import utcnow
from bastion.pipeline.instances import Instance, owner_alive, process_identity

pytestmark = pytest.mark.anyio

NOW = utcnow()
LATER = NOW + timedelta(seconds=30)
EARLIER = NOW - timedelta(seconds=1)
ELSEWHERE = "another-host.example:4242:12345"


def test_an_instance_on_another_host_is_alive_while_its_lease_holds_and_only_then() -> None:
    assert owner_alive(ELSEWHERE, {ELSEWHERE: LATER}, NOW)
    assert not owner_alive(ELSEWHERE, {ELSEWHERE: EARLIER}, NOW), "its lease lapsed"
    assert not owner_alive(ELSEWHERE, {}, NOW), "it never held a lease: no longer assumed alive"


def test_a_stopped_process_of_this_host_is_gone_at_once_even_while_its_lease_holds() -> None:
    gone = f"{socket.gethostname()}:{2**22 + 7}:1"  # above any pid this machine hands out
    assert not owner_alive(gone, {gone: LATER}, NOW)
    me = process_identity()
    assert owner_alive(me, {me: LATER}, NOW)
    assert not owner_alive(me, {me: EARLIER}, NOW), "a lapsed lease wins, even for a live process"
    assert not owner_alive(f"{socket.gethostname()}:{os.getpid()}:not-my-start-time", {}, NOW), "a reused pid"
    assert not owner_alive(None, {}, NOW) and not owner_alive("", {}, NOW)


async def test_gone_is_judged_on_the_leases_as_they_are_when_asked(tmp_path: Path) -> None:
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
        me = Instance(ledger.instances)
        await me.register()
        # Another instance registers after this one started: it is judged by its lease when asked, not by a
        # snapshot taken before it registered.
        other = Instance(ledger.instances, ELSEWHERE)
        await other.register()
        assert await me.gone([me.id, ELSEWHERE, "never-registered-elsewhere:1:1"]) == {"never-registered-elsewhere:1:1"}
        await ledger.instances.release(ELSEWHERE, now=utcnow())
        assert await me.gone([ELSEWHERE]) == {ELSEWHERE}, "a released lease is gone at once"
