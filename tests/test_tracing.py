"""OpenTelemetry spans of calls, captured with the SDK's in-memory exporter from a real client's calls
through an in-process Bastion (tests/harness.py) to its downstream."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
import mcp_types as types
import pytest
from mcp import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bastion import tracing
from bastion.server.tracing import export_endpoint, exporting_traces
from tests.harness import harness
from tests.processes import bastion_env, bastion_http, write_config
from tests.providers import ScriptedApi, ok
from tests.test_api import WAIT, serving
from tests.test_approvals import FAST, approved_call
from tests.test_gateway_providers import LIST, bastion, github
from tests.test_inline_approval import LOCAL, Answers

pytestmark = pytest.mark.anyio

HOST_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HOST_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Bastion's spans, for this test only: its own provider, the global one left alone."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def named(exporter: InMemorySpanExporter, prefix: str) -> ReadableSpan:
    (found,) = [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]
    return found


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_an_allowed_call_has_a_span_with_the_ledgers_fields_and_a_child_span_for_its_downstream_call(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with harness(tmp_path, modes={"fx:echo": "allow"}, downstream="streams") as h:
        assert not (await h.call("fx__echo", {"text": "secret-argument-5d1"})).is_error
        invocation = await h.only_invocation()

    call = named(spans, "bastion.call fx__echo")
    assert call.attributes is not None
    assert dict(call.attributes) == {
        tracing.INVOCATION_ID: invocation.id,
        tracing.TOOL: invocation.tool,
        tracing.POLICY_KEY: invocation.policy_key,
        tracing.SOURCE: invocation.source_id,
        tracing.ACTION: invocation.action_id,
        tracing.MODE: invocation.mode,
        tracing.MODE_SOURCE: invocation.mode_source,
        tracing.STATUS: invocation.status,
    }
    assert (invocation.status, invocation.mode) == ("completed", "allow")
    assert call.status.status_code is StatusCode.UNSET

    downstream = named(spans, "bastion.downstream fx:echo")
    assert downstream.kind is SpanKind.CLIENT
    assert parent_of(downstream) == call.context.span_id
    assert downstream.attributes is not None
    assert downstream.attributes[tracing.INVOCATION_ID] == invocation.id
    # The downstream was sent the downstream span's trace context in `_meta`, so it can continue the trace.
    _, trace_id, span_id, _ = h.fixture.calls[0].meta["traceparent"].split("-")
    assert (trace_id, span_id) == (f"{call.context.trace_id:032x}", f"{downstream.context.span_id:016x}")
    every = [span for span in spans.get_finished_spans() if span.attributes]
    assert all("secret-argument-5d1" not in str(dict(span.attributes or {})) for span in every)


async def test_an_approved_call_has_a_span_for_its_wait_and_its_downstream_call_in_the_calls_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with harness(tmp_path, approvals=FAST) as h:
        pending, result = await approved_call(h, "fx__progress")
        assert not result.is_error

    call = named(spans, "bastion.call fx__progress")
    attributes = cast(dict[str, Any], call.attributes)
    assert (attributes[tracing.INVOCATION_ID], attributes[tracing.STATUS]) == (pending.id, "completed")
    assert (attributes[tracing.MODE], attributes[tracing.MODE_SOURCE]) == ("require_approval", "inferred")
    wait = named(spans, "bastion.approval")
    assert parent_of(wait) == call.context.span_id
    assert cast(dict[str, Any], wait.attributes)[tracing.STATUS] == "approved"
    # `HeldCalls` runs the approved call in its own task, still in the call's trace, after the wait.
    downstream = named(spans, "bastion.downstream fx:progress")
    assert parent_of(downstream) == call.context.span_id
    assert wait.end_time is not None and downstream.start_time is not None
    assert wait.end_time <= downstream.start_time


async def test_a_denied_call_sets_the_error_status_with_its_error_class(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with harness(tmp_path) as h:
        assert (await h.call("fx__fail")).is_error
    call = named(spans, "bastion.call fx__fail")
    assert call.status.status_code is StatusCode.ERROR
    attributes = cast(dict[str, Any], call.attributes)
    assert (attributes[tracing.STATUS], attributes[tracing.ERROR_CLASS]) == ("denied", "policy_denied")
    assert [span.name for span in spans.get_finished_spans() if span.name.startswith("bastion.")] == [call.name]


async def test_a_hosts_trace_context_in_meta_makes_bastions_spans_part_of_the_hosts_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    meta = cast(types.RequestParamsMeta, {"traceparent": f"00-{HOST_TRACE}-{HOST_SPAN}-01"})
    async with harness(tmp_path, modes={"fx:echo": "allow"}, mode="legacy") as h:
        assert not (await h.client.call_tool("fx__echo", {"text": "hi"}, meta=meta)).is_error

    call = named(spans, "bastion.call fx__echo")
    assert f"{call.context.trace_id:032x}" == HOST_TRACE
    assert parent_of(call) == int(HOST_SPAN, 16)
    assert f"{named(spans, 'bastion.downstream').context.trace_id:032x}" == HOST_TRACE


async def test_a_providers_http_request_has_a_span_under_the_downstream_call_and_sends_its_traceparent(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    api = ScriptedApi([ok([])])
    async with bastion(tmp_path, github(api), modes={"github:list_issues": "allow"}) as (client, _):
        assert not (await client.call_tool(*LIST)).is_error

    downstream = named(spans, "bastion.downstream github:list_issues")
    request = named(spans, "HTTP GET")
    assert request.kind is SpanKind.CLIENT
    assert parent_of(request) == downstream.context.span_id
    attributes = cast(dict[str, Any], request.attributes)
    assert (attributes["http.request.method"], attributes["http.response.status_code"]) == ("GET", 200)
    _, trace_id, span_id, _ = api.last.headers["traceparent"].split("-")
    assert (trace_id, span_id) == (f"{request.context.trace_id:032x}", f"{request.context.span_id:016x}")


# -- bastion serve: export over OTLP/HTTP --------------------------------------------------------------------


@dataclass
class Collector:
    """An OTLP/HTTP trace collector: keeps every span it is sent."""

    spans: list[Span] = field(default_factory=list)
    services: set[str] = field(default_factory=set)

    async def export(self, request: Request) -> Response:
        export = ExportTraceServiceRequest.FromString(await request.body())
        for resource in export.resource_spans:
            names = [a.value.string_value for a in resource.resource.attributes if a.key == "service.name"]
            self.services.update(names)
            for scope in resource.scope_spans:
                self.spans.extend(scope.spans)
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    def named(self, prefix: str) -> Span:
        (found,) = [span for span in self.spans if span.name.startswith(prefix)]
        return found


async def test_bastion_serve_exports_its_spans_and_the_sdks_in_the_hosts_trace_when_the_otlp_endpoint_is_set(
    tmp_path: Path,
) -> None:
    collector = Collector()
    app = Starlette(routes=[Route("/v1/traces", collector.export, methods=["POST"])])
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    meta = cast(types.RequestParamsMeta, {"traceparent": f"00-{HOST_TRACE}-{HOST_SPAN}-01"})
    async with serving(app) as endpoint:
        env = bastion_env(tmp_path / "home", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_SERVICE_NAME="gw-7")
        async with bastion_http(["--config", str(config)], env=env) as running:
            with anyio.fail_after(WAIT):
                async with Client(running.mcp_url, mode="legacy", cache=None) as client:
                    assert not (await client.call_tool("notes__list_notes", {}, meta=meta)).is_error
        # Stopped (SIGTERM): the spans not sent yet were sent before it exited.

    assert collector.services == {"gw-7"}
    call = collector.named("bastion.call notes__list_notes")
    assert call.trace_id.hex() == HOST_TRACE
    server = collector.named("tools/call notes__list_notes")  # the MCP SDK's span of the host's request
    assert (server.parent_span_id.hex(), call.parent_span_id) == (HOST_SPAN, server.span_id)
    downstream = collector.named("bastion.downstream notes:list_notes")
    assert downstream.parent_span_id == call.span_id
    sent = collector.named("MCP send tools/call list_notes")  # the SDK's span of the request to the downstream
    assert sent.parent_span_id == downstream.span_id
    attributes = {a.key: a.value.string_value for a in call.attributes}
    assert (attributes[tracing.POLICY_KEY], attributes[tracing.STATUS]) == ("notes:list_notes", "completed")


def test_no_export_is_set_up_without_an_endpoint_or_when_the_sdk_is_disabled() -> None:
    assert export_endpoint({}) is None
    assert export_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}) is None
    assert export_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}) is None
    both = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/v1/traces"}
    assert export_endpoint(both) == "http://t/v1/traces"
    with exporting_traces({}) as provider:
        assert provider is None


async def test_without_a_tracer_provider_no_span_is_opened_and_the_hosts_trace_context_still_reaches_the_downstream(
    tmp_path: Path,
) -> None:
    meta = cast(types.RequestParamsMeta, {"traceparent": f"00-{HOST_TRACE}-{HOST_SPAN}-01"})
    async with harness(tmp_path, modes={"fx:echo": "allow"}, mode="legacy", downstream="streams") as h:
        with tracing.span("bastion.call fx__echo") as span:
            assert not span.is_recording()
        assert not (await h.client.call_tool("fx__echo", {"text": "hi"}, meta=meta)).is_error
    assert h.fixture.calls[0].meta["traceparent"].split("-")[1] == HOST_TRACE


async def test_a_call_answered_with_an_input_request_is_not_a_failure_and_its_approved_run_stays_in_its_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    answers = Answers("accept", {"decision": "approve", "reason": "fine"})
    async with harness(tmp_path, profiles=LOCAL, profile="local", mode="auto", elicitation=answers) as h:
        assert not (await h.call("fx__progress")).is_error  # 2026-07-28: input required, then resumed

    call = named(spans, "bastion.call fx__progress")
    assert call.status.status_code is StatusCode.UNSET
    assert cast(dict[str, Any], named(spans, "bastion.approval").attributes)[tracing.STATUS] == "approved"
    assert parent_of(named(spans, "bastion.downstream fx:progress")) == call.context.span_id
