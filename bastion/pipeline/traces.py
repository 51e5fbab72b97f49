"""The span of each call the gateway serves, kept while its invocation lives.

The gateway opens one span per call, from the host's intent to its outcome (`bastion.tracing.span`), and follows
its invocation here. As an observer of the pipeline, `CallTraces` keeps the span's status the ledger's, opens a
child span for the wait for an approver (held, then decided) and marks the span failed with the error class of
an outcome that failed. An approved call runs in `HeldCalls`' task: `within` makes the call's span current
there, so its downstream call continues the host's trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Final

from bastion import tracing
from bastion.models import Invocation

_ENDED_AT_DECISION: Final = frozenset({"denied", "expired"})
_FAILED: Final = frozenset({"failed", "unknown"})


class CallTraces:
    """The spans of the calls in flight, by invocation id; an `Observer` of the pipeline."""

    def __init__(self) -> None:
        self._spans: dict[str, tracing.Span] = {}
        self._waits: dict[str, tracing.Span] = {}
        """Invocation id -> the span of its wait for an approver, until it is decided."""

    @contextmanager
    def following(self, invocation: Invocation, span: tracing.Span) -> Iterator[None]:
        """Follow `invocation` in `span` while its call runs, and after it while the invocation still waits for
        an approver or runs (a host that stopped waiting): until it is decided or finished."""
        if not span.is_recording():
            yield  # no tracer provider: nothing to keep
            return
        span.set_attributes(tracing.invocation_attributes(invocation))
        self._spans[invocation.id] = span
        try:
            yield
        finally:
            if invocation.id not in self._waits:
                self._spans.pop(invocation.id, None)

    def within(self, invocation_id: str) -> AbstractContextManager[None]:
        """The invocation's span current for the block (see `tracing.within`)."""
        return tracing.within(self._spans.get(invocation_id))

    def _live(self, invocation_id: str) -> tracing.Span | None:
        """The invocation's span, unless it ended (its host stopped waiting): an ended span takes no more."""
        span = self._spans.get(invocation_id)
        return span if span is not None and span.is_recording() else None

    async def planned(self, invocation: Invocation) -> None:
        span = self._live(invocation.id)
        if span is None:
            return
        span.set_attribute(tracing.STATUS, invocation.status)
        if invocation.status == "pending":
            attributes = {tracing.INVOCATION_ID: invocation.id, tracing.POLICY_KEY: invocation.policy_key}
            self._waits[invocation.id] = tracing.start("bastion.approval", parent=span, attributes=attributes)

    async def decided(self, invocation: Invocation) -> None:
        wait = self._waits.pop(invocation.id, None)
        if wait is not None:
            wait.set_attribute(tracing.STATUS, invocation.status)
            wait.end()
        span = self._live(invocation.id)
        if span is not None:
            span.set_attribute(tracing.STATUS, invocation.status)
        if invocation.status in _ENDED_AT_DECISION:
            self._spans.pop(invocation.id, None)

    async def executing(self, invocation: Invocation) -> None:
        span = self._live(invocation.id)
        if span is not None:
            span.set_attribute(tracing.STATUS, invocation.status)

    async def finished(self, invocation: Invocation) -> None:
        span = self._live(invocation.id)
        self._spans.pop(invocation.id, None)
        if span is None:
            return
        span.set_attribute(tracing.STATUS, invocation.status)
        if invocation.status in _FAILED:
            tracing.fail(span, invocation.error_class or invocation.status)
