"""Traces (portal.tracing, serving.dataplane.tracing), collected with the SDK's in-memory
exporter: one inference's tree (router -> version -> queue, prefill, decode) continuing the
client's traceparent, a portal request's server span, and a Celery task that continues the
context of whoever enqueued it. Across processes (Ray replicas exporting over OTLP) see
tests/serving/test_two_node_ray.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from portal import logging as portal_logging
from portal import tracing
from serving.dataplane.app import Router
from serving.dataplane.keys import hash_key
from serving.engine.testing import write_tiny_checkpoint

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


class _Gate(SpanProcessor):
    """Passes spans on only while a test collects them (the provider is process-wide)."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner, self.open = inner, False

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        if self.open:
            self.inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if self.open:
            self.inner.on_end(span)


_EXPORTER = InMemorySpanExporter()
_GATE = _Gate(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_GATE)
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    _GATE.open = True
    yield _EXPORTER
    _GATE.open = False
    _EXPORTER.clear()


def _hex(value: int, width: int) -> str:
    return f"{value:0{width}x}"


def _by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


async def _call(router: Any, traceparent: str) -> Any:
    from starlette.requests import Request

    async def receive() -> dict[str, Any]:
        raw = json.dumps({"prompt": "hello there", "max_tokens": 4, "temperature": 0}).encode()
        return {"type": "http.request", "body": raw, "more_body": False}

    headers = [(b"authorization", b"Bearer k"), (b"traceparent", traceparent.encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "",
             "headers": headers, "query_string": b""}  # fmt: skip
    return await router(Request(scope, receive))


def test_one_inference_is_one_tree_continuing_the_clients_trace(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    router = Router.func_or_class(local={"app": "acme.chat", "engine": {"num_blocks": 32}})
    local = {"version": "v1", "artifact": str(write_tiny_checkpoint(tmp_path / "tiny")),
             "tenants": {"7": {"salt": "ab" * 32}}}  # fmt: skip
    config = {"tenant": "7", "deployment": "chat", "key_hashes": [hash_key("k")],
              "groups": {"stable": {"app": "acme.chat", "version": "v1", "local": True}},
              "local": local}  # fmt: skip

    async def scenario() -> Any:
        await router.reconfigure(config)
        return await _call(router, TRACEPARENT)

    try:
        response = asyncio.run(scenario())
    finally:
        router.local.chaos.close()
        router.local.engine.stop()
    assert response.status_code == 200
    found = _by_name(spans)
    assert {"router", "version", "queue", "prefill", "decode"} <= set(found)
    router_span, version = found["router"], found["version"]
    assert {_hex(s.context.trace_id, 32) for s in found.values()} == {TRACE_ID}
    assert router_span.parent is not None and _hex(router_span.parent.span_id, 16) == CLIENT_SPAN
    assert version.parent is not None and version.parent.span_id == router_span.context.span_id
    for phase in ("queue", "prefill", "decode"):
        child = found[phase]
        assert child.parent is not None and child.parent.span_id == version.context.span_id
        assert version.start_time <= child.start_time <= child.end_time <= version.end_time
    assert found["queue"].end_time <= found["prefill"].start_time + 1
    assert found["prefill"].end_time <= found["decode"].start_time + 1
    assert version.attributes["gen_ai.usage.output_tokens"] == 4
    assert router_span.attributes["http.response.status_code"] == 200
    # The answer names the router's span: the client can find the trace.
    assert response.headers["traceparent"].split("-")[1:3] == [
        TRACE_ID,
        _hex(router_span.context.span_id, 16),
    ]


@pytest.mark.django_db
def test_a_portal_request_is_a_server_span_and_its_logs_carry_its_trace(
    spans: InMemorySpanExporter, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real = tracing.TracingMiddleware.__call__

    def spy(self: Any, request: Any) -> Any:
        response = real(self, request)
        seen.append(portal_logging.trace_id.get())
        return response

    monkeypatch.setattr(tracing.TracingMiddleware, "__call__", spy)
    response = client.get("/livez", HTTP_TRACEPARENT=TRACEPARENT)
    assert response.status_code == 200
    (server,) = [s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.SERVER]
    assert server.name == "GET livez" and server.attributes["http.route"] == "livez"
    assert _hex(server.context.trace_id, 32) == TRACE_ID
    assert server.parent is not None and _hex(server.parent.span_id, 16) == CLIENT_SPAN
    assert seen == [TRACE_ID]  # the JSON log lines of the request carry the span's trace


def test_a_task_continues_the_context_of_whoever_enqueued_it(
    spans: InMemorySpanExporter,
) -> None:
    headers: dict[str, Any] = {}
    with tracing.span("enqueue") as sender:
        tracing.inject_headers(headers=headers)  # before_task_publish
    task = SimpleNamespace(name="serving.reconcile", request=SimpleNamespace(**headers))
    tracing.start_task_span(task_id="t-1", task=task)  # task_prerun, in the worker
    with tracing.span("inside the task"):
        pass
    tracing.end_task_span(task_id="t-1", state="FAILURE")  # task_postrun
    found = _by_name(spans)
    consumer = found["celery serving.reconcile"]
    assert consumer.parent is not None and consumer.parent.span_id == sender.context.span_id
    assert consumer.status.status_code == trace.StatusCode.ERROR
    inner = found["inside the task"]
    assert inner.parent is not None and inner.parent.span_id == consumer.context.span_id


def test_replicas_get_the_portals_otlp_settings_only_when_tracing_is_on() -> None:
    assert tracing.dataplane_env({"OTEL_TRACES_SAMPLER": "always_on"}) == {}
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_SERVICE_NAME": "portal-web",  # the replicas name themselves
        "AWS_SECRET_ACCESS_KEY": "never",
    }
    assert tracing.dataplane_env(env) == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    }


def test_a_tasks_log_lines_carry_its_id_and_the_trace_of_whoever_enqueued_it() -> None:
    before = portal_logging.trace_id.set(TRACE_ID)  # what portal.requestctx set for a request
    try:
        headers: dict[str, Any] = {}
        tracing.inject_headers(headers=headers)  # no span here: the logs' trace still travels
        assert headers["traceparent"].split("-")[1] == TRACE_ID
        task = SimpleNamespace(name="serving.reconcile", request=SimpleNamespace(**headers))
        tracing.start_task_span(task_id="t-2", task=task)
        assert portal_logging.request_id.get() == "t-2"
        assert portal_logging.trace_id.get() == TRACE_ID
        tracing.end_task_span(task_id="t-2", state="SUCCESS")
        assert portal_logging.request_id.get() == ""  # back to the caller's
    finally:
        portal_logging.trace_id.reset(before)
