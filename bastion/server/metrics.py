"""Prometheus metrics at `/metrics`, in the text format, with the maintained client library.

An observer of the gateway (bastion.pipeline.observer) counts calls as they end and times the approvals; what is a
state rather than an event (calls pending, sources up) is read when the scrape comes, so every instance sharing a
ledger reports the same pending count. The ledger's commit times come from the ledger itself (it tells its
listeners, see bastion.ledger.timing). `/metrics` is open like `/healthz`: it carries counts, modes, statuses and
source ids, never arguments, results or principals.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from bastion.models import Invocation, utcnow
from bastion.pipeline.gateway import Gateway
from bastion.server.express import ExpressCounts

METRICS_PATH: Final = "/metrics"
_ENDED_AT_DECISION: Final = frozenset({"denied", "expired"})
"""Statuses a call ends in when it is decided (it never executes): counted then, not when finished."""
_WAIT_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0)
_COMMIT_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """The gateway's metrics: an observer of its calls, and the `/metrics` endpoint."""

    def __init__(self, gateway: Gateway, express: ExpressCounts | None = None) -> None:
        self._gateway = gateway
        self.registry = CollectorRegistry()
        if express is not None:
            self.registry.register(_ExpressCollector(express))
        self._calls = Counter(
            "bastion_calls",
            "Calls that ended, by source, mode and final status.",
            ["source", "mode", "status"],
            registry=self.registry,
        )
        self._counters: dict[tuple[str, str, str], Counter] = {}
        self._waits = Histogram(
            "bastion_approval_wait_seconds",
            "From a call held for approval to its decision.",
            ["decision"],
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        commits = Histogram(
            "bastion_ledger_commit_seconds",
            "From a ledger write's start to its commit (waiting for the write lock or a connection included).",
            ["backend"],
            buckets=_COMMIT_BUCKETS,
            registry=self.registry,
        )
        gateway.ledger.commits.listen(commits.labels(backend=gateway.ledger.commits.backend).observe)
        self._pending = Gauge("bastion_pending_calls", "Calls waiting for an approver now.", registry=self.registry)
        self._up = Gauge(
            "bastion_source_up", "1 when the source is ready, else 0 (with its state).", ["source", "state"],
            registry=self.registry,
        )  # fmt: skip
        gateway.observers.add(self)

    async def planned(self, invocation: Invocation) -> None:
        """Nothing to count yet."""

    async def decided(self, invocation: Invocation) -> None:
        if invocation.mode == "require_approval" and invocation.status != "pending":
            decision = "denied" if invocation.status in _ENDED_AT_DECISION else "approved"
            waited = (utcnow() - invocation.created_at).total_seconds()
            self._waits.labels(decision=decision).observe(max(waited, 0.0))
        if invocation.status in _ENDED_AT_DECISION:
            self._count(invocation)

    async def executing(self, invocation: Invocation) -> None:
        """Nothing to count yet."""

    async def finished(self, invocation: Invocation) -> None:
        self._count(invocation)

    def _count(self, invocation: Invocation) -> None:
        labels = (invocation.source_id, invocation.mode, invocation.status)
        counter = self._counters.get(labels)
        if counter is None:  # a child per label set, kept: `labels()` checks and locks on every call
            counter = self._counters[labels] = self._calls.labels(*labels)
        counter.inc()

    async def endpoint(self, request: Request) -> Response:
        """The scrape: the counters so far, and the pending calls and sources as they are now."""
        self._pending.set(await self._gateway.invocations.count("pending"))
        self._up.clear()
        for status in self._gateway.statuses():
            self._up.labels(source=status.source_id, state=status.state).set(1 if status.state == "ready" else 0)
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class _ExpressCollector(Collector):
    """The express lane's counts (bastion.server.express), read when the scrape comes."""

    def __init__(self, counts: ExpressCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "bastion_express_calls",
            "Tool calls the express lane took: answered by it, or handed back to the SDK's server (held for approval).",
            labels=["outcome"],
        )
        family.add_metric(["answered"], self._counts.answered)
        family.add_metric(["handed_back"], self._counts.handed_back)
        yield family
