"""Sending Bastion's spans to an OpenTelemetry collector over OTLP, when the standard environment asks.

`bastion serve` exports when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, unless
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. The exporter reads the other `OTEL_EXPORTER_OTLP_*`
variables itself (headers, timeout, certificates, compression), and the provider `OTEL_TRACES_SAMPLER`,
`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`. Otherwise no provider is set up: every span is the API's no-op.
The provider is global, so the MCP SDK's own spans (the server span of each request, the client span of each
downstream request) are exported with Bastion's, in one trace.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from bastion import __version__, tracing
from bastion.config.models import display_url

logger = logging.getLogger(__name__)

ENDPOINTS: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""The variables that turn the export on (the first one set is where spans go)."""
DEFAULT_SERVICE_NAME: Final = "bastion"


def export_endpoint(environ: Mapping[str, str]) -> str | None:
    """Where the environment asks spans to be sent, or None when it asks for no export."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    return next((environ[name] for name in ENDPOINTS if environ.get(name, "").strip()), None)


@contextmanager
def exporting_traces(environ: Mapping[str, str] = os.environ) -> Iterator[TracerProvider | None]:
    """Set up the global tracer provider and its OTLP exporter if `environ` asks for it; on leaving, shut it down,
    sending the spans not sent yet (bounded by the exporter's timeout)."""
    endpoint = export_endpoint(environ)
    if endpoint is None:
        yield None
        return
    resource = Resource.create({SERVICE_VERSION: __version__})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol.strip().lower() != "http/protobuf":
        logger.warning("OTLP protocol %r is not offered: Bastion sends traces over http/protobuf", protocol)
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)  # the MCP SDK's spans too
    tracing.use_provider(provider)
    logger.info("exporting traces over OTLP/HTTP to %s", display_url(endpoint))
    try:
        yield provider
    finally:
        tracing.use_provider(None)
        provider.shutdown()
