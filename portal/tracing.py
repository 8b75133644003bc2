"""OpenTelemetry traces of the control plane (off unless an OTLP endpoint is configured).

With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, every portal
process (web, Celery worker, beat) exports spans over OTLP/HTTP (the SDK reads the usual
OTEL_* variables: headers, sampler, timeouts), and the same variables reach every Ray Serve
replica through the Serve config's runtime_env (`dataplane_env`), so one inference's trace runs
from the client's `traceparent` through the router, the version and the engine's phases.

Spans here: each HTTP request (`TracingMiddleware`, continuing the client's `traceparent`; the
JSON logs' trace_id is the span's), each Celery task (its publisher's context travels in the
message headers: the request that enqueued a reconcile is the reconcile's parent), and named
blocks (`span()`: a reconcile, a rollback).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from portal import logging as portal_logging
from serving.dataplane import tracing as dataplane_tracing

F = TypeVar("F", bound=Callable[..., Any])
PROPAGATOR = TraceContextTextMapPropagator()
# The OTEL_* variables handed on to the data plane's replicas (never OTEL_SERVICE_NAME: theirs).
DATAPLANE_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_BSP_SCHEDULE_DELAY",
)


def enabled() -> bool:
    return dataplane_tracing.enabled()


def configure(service_name: str) -> None:
    """Install the OTLP exporter in this process when an endpoint is configured."""
    dataplane_tracing.configure(service_name)


def dataplane_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tracing variables every replica gets (empty when tracing is off)."""
    env = os.environ if environ is None else environ
    if not dataplane_tracing.enabled(env):
        return {}
    return {name: env[name] for name in DATAPLANE_VARS if env.get(name, "").strip()}


def tracer() -> trace.Tracer:
    return trace.get_tracer("portal")


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[trace.Span]:
    """A span around a block of control-plane work (marked failed when the block raises)."""
    with tracer().start_as_current_span(name, attributes=attributes) as current:
        yield current


def traced(name: str) -> Callable[[F], F]:
    """Run the decorated function in a span of its own."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with span(name):
                return function(*args, **kwargs)

        return cast(F, inner)

    return wrap


def annotate(**attributes: Any) -> None:
    """Attributes on the current span (nothing when tracing is off)."""
    current = trace.get_current_span()
    for key, value in attributes.items():
        current.set_attribute(key, value)


class TracingMiddleware:
    """A server span per request, continuing the client's `traceparent`; the request's log
    lines then carry the span's trace id (portal.requestctx set the client's or a new one)."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        parent = PROPAGATOR.extract({"traceparent": request.headers.get("traceparent", "")})
        attributes = {"http.request.method": request.method, "url.path": request.path[:200]}
        with tracer().start_as_current_span(
            f"{request.method} {request.path[:80]}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
        ) as current:
            ids = dataplane_tracing.ids(current)
            if ids is not None:
                portal_logging.trace_id.set(ids[0])
            response = self.get_response(request)
            match = getattr(request, "resolver_match", None)
            if match is not None and match.route:
                current.update_name(f"{request.method} {match.route}")
                current.set_attribute("http.route", match.route)
            current.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                current.set_status(Status(StatusCode.ERROR))
            return response


# --- Celery: the publisher's context in the message, a span per task -----------------------

_task_spans: dict[str, tuple[trace.Span, object, tuple[Any, Any]]] = {}


def inject_headers(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """before_task_publish: the current trace context goes into the task message's headers
    (with tracing off, the request's trace id for the logs: the task's lines carry it too)."""
    if headers is None:
        return
    PROPAGATOR.inject(headers)
    logged = portal_logging.trace_id.get()
    if "traceparent" not in headers and len(logged) == 32:
        headers["traceparent"] = f"00-{logged}-{secrets.token_hex(8)}-00"


def start_task_span(task_id: str = "", task: Any = None, **_: Any) -> None:
    """task_prerun: a span for the task, child of the publisher's (when it sent one)."""
    if task is None:
        return
    request = getattr(task, "request", None)
    sent = str(getattr(request, "traceparent", "") or "")
    current = tracer().start_span(
        f"celery {task.name}",
        # The publisher's context; none sent (an eager task): the caller's, in this thread.
        context=PROPAGATOR.extract({"traceparent": sent}) if sent else None,
        kind=SpanKind.CONSUMER,
        attributes={"celery.task_name": task.name, "celery.task_id": task_id},
    )
    token = otel_context.attach(trace.set_span_in_context(current))
    # The task's log lines: its id as the request id, the trace it continues (or its own).
    ids = dataplane_tracing.ids(current)
    sent_trace = sent.split("-")[1] if sent.count("-") == 3 else ""
    logs = (
        portal_logging.request_id.set(task_id),
        portal_logging.trace_id.set(ids[0] if ids else sent_trace),
    )
    _task_spans[task_id] = (current, token, logs)


def end_task_span(task_id: str = "", state: str | None = None, **_: Any) -> None:
    """task_postrun: the task's span ends (failed unless the task succeeded)."""
    entry = _task_spans.pop(task_id, None)
    if entry is None:
        return
    current, token, (request_token, trace_token) = entry
    with contextlib.suppress(ValueError):  # set in another context (never seen; be safe)
        portal_logging.request_id.reset(request_token)
        portal_logging.trace_id.reset(trace_token)
    current.set_attribute("celery.state", str(state or ""))
    if state not in (None, "SUCCESS"):
        current.set_status(Status(StatusCode.ERROR, str(state)))
    current.end()
    with contextlib.suppress(Exception):
        otel_context.detach(token)  # type: ignore[arg-type]


def connect_celery() -> None:
    from celery import signals

    signals.before_task_publish.connect(inject_headers, weak=False)
    signals.task_prerun.connect(start_task_span, weak=False)
    signals.task_postrun.connect(end_task_span, weak=False)
