"""OpenTelemetry spans of the data plane: router -> version -> engine (queue, prefill, decode).

Off unless the replica's environment names an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; the portal passes its own OTEL_* variables to every replica
through the Serve config's runtime_env): then each replica process exports its spans over
OTLP/HTTP in batches. With tracing off the API's no-op tracer costs next to nothing.

The router's span continues the client's `traceparent` (or starts a trace) and the version's
continues the router's (the `traceparent` of the handle call). The engine's phases are recorded
after the request ends, with their real start and end times: `queue` (submitted until the
engine first scheduled it; the built-in engine says when), `prefill` (until the first token)
and `decode` (first token to the last).
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_PROPAGATOR = TraceContextTextMapPropagator()
_configured = threading.Lock()
_done = False


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(env.get(name, "").strip() for name in ENDPOINT_VARS)


def configure(service_name: str = "portal-dataplane") -> None:
    """Install an OTLP-exporting tracer provider once per process, when an endpoint is set
    (and no provider was installed by someone else, e.g. a test's in-memory one)."""
    global _done
    with _configured:
        if _done or not enabled():
            return
        _done = True
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if isinstance(trace.get_tracer_provider(), TracerProvider):
            return
        name = os.environ.get("OTEL_SERVICE_NAME", "").strip() or service_name
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)


def tracer() -> trace.Tracer:
    return trace.get_tracer("serving.dataplane")


def parent(traceparent: str | None) -> Context:
    """The context a `traceparent` header names (an empty one when absent or malformed)."""
    return _PROPAGATOR.extract({"traceparent": traceparent} if traceparent else {})


def header(span: trace.Span) -> str | None:
    """The `traceparent` that makes `span` the parent of the next hop (None: not recording)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def ids(span: trace.Span) -> tuple[str, str] | None:
    """(trace id, span id) in hex, when the span is a real one."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def router_span(traceparent: str | None, attributes: dict[str, Any]) -> trace.Span:
    """The router's span for one request, continuing the client's trace; the caller ends it."""
    return tracer().start_span(
        "router", context=parent(traceparent), kind=SpanKind.SERVER, attributes=attributes
    )


def finish(span: trace.Span, status: int) -> None:
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))
    span.end()


async def ending(body: AsyncIterable[Any], span: trace.Span, status: int) -> AsyncIterator[Any]:
    """A streamed body that ends the router's span when the stream does."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        finish(span, status)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def version_spans(
    request: Mapping[str, Any],
    attributes: dict[str, Any],
    *,
    started: float,
    submitted: float | None,
    queued_s: float | None,
    first_at: float | None,
    last_at: float | None,
    ended: float,
    error: str | None,
) -> None:
    """Record the version's span of one request and its engine phases, after the fact."""
    span = tracer().start_span(
        "version",
        context=parent(request.get("traceparent")),
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        start_time=_ns(started),
    )
    if not span.is_recording():
        return
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    inside = trace.set_span_in_context(span)
    phases: list[tuple[str, float, float]] = []
    if submitted is not None:
        scheduled = submitted + queued_s if queued_s is not None else None
        if scheduled is not None:
            phases.append(("queue", submitted, min(scheduled, first_at or ended)))
        if first_at is not None:
            phases.append(("prefill", scheduled or submitted, first_at))
            phases.append(("decode", first_at, max(first_at, last_at or first_at)))
    for name, begin, end in phases:
        child = tracer().start_span(name, context=inside, start_time=_ns(begin))
        child.end(end_time=_ns(max(begin, end)))
    span.end(end_time=_ns(ended))
