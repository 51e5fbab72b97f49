"""OpenTelemetry spans of Bastion's calls: the attribute names, named once, and the spans the pipeline
and the connectors open.

Only the OpenTelemetry API is used here. Until `use_provider` gives a tracer provider (`bastion serve` does when the
OTLP environment variables ask for it, see `bastion.server.tracing`) no span is opened at all: an API no-op span
still costs microseconds on every call, and the MCP SDK's own no-op spans already carry a host's trace context
through to the downstreams. Spans carry ids, keys, modes and statuses with the values the ledger records,
never arguments or results (they may hold secrets), nor error messages (they may quote a downstream).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Span, SpanKind, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from bastion import __version__
from bastion.errors import BastionError
from bastion.models import Invocation

__all__ = [
    "ACTION",
    "ERROR_CLASS",
    "INVOCATION_ID",
    "MODE",
    "MODE_SOURCE",
    "PARENT_ID",
    "POLICY_KEY",
    "SOURCE",
    "STATUS",
    "TOOL",
    "Span",
    "SpanKind",
    "downstream_attributes",
    "fail",
    "inject_context",
    "inject_headers",
    "invocation_attributes",
    "recording",
    "span",
    "start",
    "use_provider",
    "within",
]

INVOCATION_ID: Final = "bastion.invocation.id"
PARENT_ID: Final = "bastion.invocation.parent_id"
"""The composite invocation a step's invocation belongs to."""
TOOL: Final = "bastion.tool"
"""The tool name the host called (namespaced)."""
POLICY_KEY: Final = "bastion.policy.key"
SOURCE: Final = "bastion.source"
ACTION: Final = "bastion.action"
MODE: Final = "bastion.mode"
MODE_SOURCE: Final = "bastion.mode.source"
STATUS: Final = "bastion.status"
ERROR_CLASS: Final = "bastion.error.class"
"""The stable error class of `bastion.errors` (`policy_denied`, `unknown_outcome`, ...), as the ledger records it."""

_TRACER_NAME: Final = "bastion"
_tracer: trace.Tracer = trace.NoOpTracer()
_enabled = False


def use_provider(provider: TracerProvider | None) -> None:
    """Open spans with `provider` (`bastion serve`'s, a test's own, an embedder's global one); None: open none."""
    global _tracer, _enabled
    _tracer = trace.NoOpTracer() if provider is None else provider.get_tracer(_TRACER_NAME, __version__)
    _enabled = provider is not None


def recording() -> bool:
    """Whether Bastion opens spans (a tracer provider was given)."""
    return _enabled


def invocation_attributes(invocation: Invocation) -> dict[str, AttributeValue]:
    """An invocation's attributes, with the values of its ledger fields."""
    attributes: dict[str, AttributeValue] = {
        INVOCATION_ID: invocation.id,
        TOOL: invocation.tool,
        POLICY_KEY: invocation.policy_key,
        SOURCE: invocation.source_id,
        ACTION: invocation.action_id,
        MODE: invocation.mode,
        MODE_SOURCE: invocation.mode_source,
        STATUS: invocation.status,
    }
    if invocation.parent_id is not None:
        attributes[PARENT_ID] = invocation.parent_id
    if invocation.error_class is not None:
        attributes[ERROR_CLASS] = invocation.error_class
    return attributes


def downstream_attributes(invocation: Invocation) -> dict[str, AttributeValue]:
    """The attributes of a call to a downstream: what it runs for (its status is the invocation's span's)."""
    return {
        INVOCATION_ID: invocation.id,
        POLICY_KEY: invocation.policy_key,
        SOURCE: invocation.source_id,
        ACTION: invocation.action_id,
    }


def span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, AttributeValue] | None = None,
    not_failures: tuple[type[BaseException], ...] = (),
) -> AbstractContextManager[Span]:
    """A span, current for the block (a child of the current span); an exception leaving the block marks it
    failed (see `fail`), unless it is one of `not_failures`. Without a tracer provider: the invalid span, which
    records nothing (one shared block: no work per call)."""
    if not _enabled:
        return _NO_SPAN
    return _recorded_span(name, kind, attributes, not_failures)


_NO_SPAN: Final = nullcontext(trace.INVALID_SPAN)
_NOTHING: Final = nullcontext()


@contextmanager
def _recorded_span(
    name: str,
    kind: SpanKind,
    attributes: Mapping[str, AttributeValue] | None,
    not_failures: tuple[type[BaseException], ...],
) -> Iterator[Span]:
    with _tracer.start_as_current_span(
        name, kind=kind, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except not_failures:
            raise
        except BaseException as exc:
            fail(current, exc)
            raise


def start(name: str, *, parent: Span, attributes: Mapping[str, AttributeValue] | None = None) -> Span:
    """A child span of `parent` that is not made current: the caller ends it (e.g. a wait that ends elsewhere)."""
    return _tracer.start_span(name, context=trace.set_span_in_context(parent), attributes=attributes)


def fail(current: Span, error: BaseException | str) -> None:
    """Mark `current` failed with a Bastion error class (or the exception's type), never a message."""
    if isinstance(error, str):
        error_class = error
    elif isinstance(error, BastionError):
        error_class = error.error_class
    else:
        error_class = type(error).__name__
    current.set_attribute(ERROR_CLASS, error_class)
    current.set_attribute("error.type", error_class)
    current.set_status(StatusCode.ERROR, error_class)


def within(current: Span | None) -> AbstractContextManager[None]:
    """Make `current` the current span for the block (None: leave the context as it is): work another task does
    for a call (an approved call run by `HeldCalls`) continues the call's trace."""
    return _NOTHING if current is None else _attached(trace.set_span_in_context(current))


@contextmanager
def _attached(context: otel_context.Context) -> Iterator[None]:
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


TRACE_CONTEXT_KEYS: Final = ("traceparent", "tracestate")
"""The `_meta` keys a host's W3C trace context comes in (the MCP SDK's server extracts them from each request)."""


def continuing(meta: Mapping[str, Any]) -> AbstractContextManager[None]:
    """The trace context a host sent in a request's `_meta`, current for the block, as the MCP SDK's server makes it
    for its handler: what the call sends on (`inject_context`) continues the host's trace, spans or not."""
    if not any(key in meta for key in TRACE_CONTEXT_KEYS):
        return _NOTHING
    return _attached(extract(meta))


def inject_context(meta: dict[str, Any]) -> None:
    """Add the current trace context to a request's `_meta` (W3C `traceparent`, `tracestate`), as the MCP SDK's
    client does: with no tracer provider, the context a host sent still reaches the downstream. An empty current
    context (no host trace, no span, no baggage) has nothing to add: the propagators are not asked."""
    if otel_context.get_current():
        inject(meta)


def inject_headers(headers: dict[str, str]) -> dict[str, str]:
    """`headers` with the current trace context added (W3C `traceparent`, `tracestate`), for an HTTP API."""
    inject(headers)
    return headers
