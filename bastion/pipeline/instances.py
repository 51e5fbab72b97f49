"""Which Bastion instances are alive: this one's identity and lease, and everyone else's.

Each instance registers in the ledger under `host:pid:start` and renews a lease while it runs. Another instance
is alive while its lease holds. On this very host a stopped process is known at once (its pid is gone or reused),
so a restart recovers the work of the process it replaces without waiting for the lease to lapse; on another
host only the lease can tell.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Final

import anyio
from anyio.abc import TaskStatus

from bastion.models import utcnow
from bastion.pipeline.seams import InstanceRegistry

logger = logging.getLogger(__name__)

LEASE_SECONDS: Final = 30.0
"""How long an instance counts as alive after its last renewal (it renews every third of that)."""


def process_identity() -> str:
    """`host:pid:start`: who owns an invocation, precise enough to tell later whether it is still alive."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def owner_alive(owner: str | None, leases: Mapping[str, datetime], now: datetime) -> bool:
    """Whether the instance `owner` still runs: not if its lease lapsed or (on this host) its process is gone;
    on another host, only while it holds a lease."""
    if not owner:
        return False
    lease = leases.get(owner)
    if lease is not None and lease <= now:
        return False
    local = _local_process_alive(owner)
    if local is not None:
        return local
    return lease is not None


def _local_process_alive(owner: str) -> bool | None:
    """Whether `owner` (a process identity) runs on this host; None when it names another host."""
    host, _, rest = owner.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname():
        return None
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return _start_time(int(pid)) == started


def _start_time(pid: int) -> str:
    """The process start time in clock ticks since boot (guards against a reused pid); '' where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


class Instance:
    """This Bastion instance in the ledger: it holds a lease while `run` runs and lets go when it ends."""

    def __init__(
        self, registry: InstanceRegistry, instance_id: str | None = None, *, lease_seconds: float = LEASE_SECONDS
    ):
        self._registry = registry
        self.id = instance_id or process_identity()
        self._lease = timedelta(seconds=lease_seconds)

    async def register(self) -> None:
        now = utcnow()
        await self._registry.renew(self.id, now=now, until=now + self._lease)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Renew the lease every third of its length until cancelled; then release it."""
        task_status.started()
        try:
            while True:
                await anyio.sleep(self._lease.total_seconds() / 3)
                try:
                    await self.register()
                except Exception:  # supervisor: a ledger hiccup must not stop the heartbeat
                    logger.exception("could not renew this instance's lease")
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._registry.release(self.id, now=utcnow())

    async def gone(self, owners: Sequence[str]) -> set[str]:
        """Which of `owners` (instances owning invocations) are gone, by the leases as they are now."""
        leases = await self._registry.leases()
        now = utcnow()
        return {owner for owner in owners if owner != self.id and not owner_alive(owner, leases, now)}
