"""The pipeline's observer hook: whoever wants to know what happens to calls — the event stream,
webhooks, metrics, tracing — registers an `Observer` instead of editing the pipeline.

The pipeline calls every observer at four moments of an invocation's life, with the invocation as it is then:
- `planned`: its intent is recorded (any mode; a refused call is planned and decided at once);
- `decided`: allowed by policy, approved, or refused (denied by policy or an approver, expired, over a limit);
- `executing`: it is about to be sent to its source;
- `finished`: its outcome is recorded (completed, failed or unknown), result included (as the source answered).

Observers run inline, in the order registered, and must be quick: a slow one slows every call. One that
raises is logged and skipped; it never changes what happens to the call.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from bastion.models import Invocation

logger = logging.getLogger(__name__)


class Observer(Protocol):
    """Told what happens to each invocation; every method is optional in spirit (implement it as a no-op)."""

    async def planned(self, invocation: Invocation) -> None: ...

    async def decided(self, invocation: Invocation) -> None: ...

    async def executing(self, invocation: Invocation) -> None: ...

    async def finished(self, invocation: Invocation) -> None: ...


class Observers:
    """The registered observers, told in turn; a failing one is logged and the others are still told."""

    def __init__(self) -> None:
        self._observers: list[Observer] = []

    def add(self, observer: Observer) -> None:
        self._observers.append(observer)

    async def planned(self, invocation: Invocation) -> None:
        await self._tell("planned", invocation)

    async def decided(self, invocation: Invocation) -> None:
        await self._tell("decided", invocation)

    async def executing(self, invocation: Invocation) -> None:
        await self._tell("executing", invocation)

    async def finished(self, invocation: Invocation) -> None:
        await self._tell("finished", invocation)

    async def _tell(self, moment: str, invocation: Invocation) -> None:
        for observer in self._observers:
            hook: Callable[[Invocation], Awaitable[None]] = getattr(observer, moment)
            try:
                await hook(invocation)
            except Exception:  # supervisor: an observer must never change what happens to a call
                logger.exception("observer %r failed when invocation %s was %s", observer, invocation.id, moment)
