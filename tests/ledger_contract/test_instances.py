"""Instance leases: an instance registers and renews a lease while it runs, ends it when it stops,
and every instance sharing the store sees everyone's leases."""

from __future__ import annotations

from datetime import timedelta, timezone

import pytest

from bastion.ledger import OpenLedger
from tests.ledger_contract.samples import T0

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=30)


async def test_an_instance_is_registered_by_its_first_renewal_and_its_lease_extended_by_the_next(
    ledger: OpenLedger,
) -> None:
    assert await ledger.instances.leases() == {}
    await ledger.instances.renew("host:1:100", now=T0, until=T0 + LEASE)
    assert await ledger.instances.leases() == {"host:1:100": T0 + LEASE}
    later = T0 + timedelta(seconds=10)
    await ledger.instances.renew("host:1:100", now=later, until=later + LEASE)
    assert await ledger.instances.leases() == {"host:1:100": later + LEASE}


async def test_a_released_lease_ends_at_once_and_the_instance_stays_listed(ledger: OpenLedger) -> None:
    await ledger.instances.renew("host:1:100", now=T0, until=T0 + LEASE)
    await ledger.instances.renew("host:2:200", now=T0, until=T0 + LEASE)
    stopped = T0 + timedelta(seconds=5)
    await ledger.instances.release("host:1:100", now=stopped)
    assert await ledger.instances.leases() == {"host:1:100": stopped, "host:2:200": T0 + LEASE}
    await ledger.instances.release("never-registered", now=stopped)
    assert set(await ledger.instances.leases()) == {"host:1:100", "host:2:200"}


async def test_leases_are_in_utc_whatever_zone_they_were_given_in(ledger: OpenLedger) -> None:
    await ledger.instances.renew("host:1:100", now=T0, until=(T0 + LEASE).astimezone(timezone(timedelta(hours=5))))
    (lease,) = (await ledger.instances.leases()).values()
    assert lease == T0 + LEASE
    assert lease.utcoffset() == timedelta(0)


async def test_every_connection_sees_every_instances_lease(ledger: OpenLedger, another: OpenLedger) -> None:
    await ledger.instances.renew("host:1:100", now=T0, until=T0 + LEASE)
    await another.instances.renew("host:2:200", now=T0, until=T0 + 2 * LEASE)
    expected = {"host:1:100": T0 + LEASE, "host:2:200": T0 + 2 * LEASE}
    assert await ledger.instances.leases() == expected
    assert await another.instances.leases() == expected
    await another.instances.release("host:1:100", now=T0)
    assert (await ledger.instances.leases())["host:1:100"] == T0
