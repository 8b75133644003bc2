"""The data plane's pure parts: circuit breaker, input guard, traffic split, trace context,
inference keys, lifecycle and SLI windows (the Ray tests drive them end to end)."""

from __future__ import annotations

import json
import random

import pytest

from serving.dataplane import openai
from serving.dataplane.breaker import CLOSED, HALF_OPEN, OPEN, BreakerConfig, CircuitBreaker
from serving.dataplane.guard import GuardConfig, Refused, check_lengths, parse_body
from serving.dataplane.keys import bearer, hash_key, key_matches
from serving.dataplane.lifecycle import Lifecycle, LifecycleError
from serving.dataplane.sli import BOUNDS_MS, SliWindow, quantile
from serving.dataplane.traffic import choose_group, continue_trace, parse_traceparent


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_breaker_needs_the_minimum_count_before_opening() -> None:
    clock = Clock()
    breaker = CircuitBreaker(BreakerConfig(min_requests=10, failure_rate=0.5), clock)
    for _ in range(9):
        breaker.record(False)
    assert breaker.state == CLOSED  # 100% failures, but only 9 requests
    breaker.record(False)
    assert breaker.state == OPEN
    assert not breaker.allow()


def test_breaker_half_opens_after_the_cool_down_and_closes_on_good_probes() -> None:
    clock = Clock()
    config = BreakerConfig(min_requests=4, failure_rate=0.5, open_s=5, half_open_probes=2)
    breaker = CircuitBreaker(config, clock)
    for ok in (True, False, False, False):
        breaker.record(ok)
    assert breaker.state == OPEN
    clock.now += 5
    assert breaker.allow() and breaker.state == HALF_OPEN
    assert breaker.allow()
    assert not breaker.allow()  # only two probes at a time
    breaker.record(True)
    breaker.record(True)
    assert breaker.state == CLOSED


def test_a_failed_probe_opens_the_breaker_again() -> None:
    clock = Clock()
    breaker = CircuitBreaker(BreakerConfig(min_requests=2, open_s=1), clock)
    breaker.record(False)
    breaker.record(False)
    clock.now += 1
    assert breaker.allow()
    breaker.record(False)
    assert breaker.state == OPEN and breaker.opened_at == clock.now


def test_breaker_forgets_failures_outside_the_window() -> None:
    clock = Clock()
    breaker = CircuitBreaker(BreakerConfig(window_s=10, min_requests=4), clock)
    for _ in range(3):
        breaker.record(False)
    clock.now += 11
    for _ in range(3):
        breaker.record(True)
    breaker.record(False)
    assert breaker.state == CLOSED
    assert breaker.failure_rate() == pytest.approx(0.25)


def test_guard_refuses_with_reasons() -> None:
    config = GuardConfig(
        max_body_bytes=200,
        max_prompt_tokens=10,
        max_tokens=5,
        json_schema={
            "type": "object",
            "properties": {"user": {"type": "string", "maxLength": 8}},
        },
    )
    with pytest.raises(Refused) as big:
        parse_body(b"x" * 201, config)
    assert big.value.status == 413 and "at most 200" in big.value.message
    with pytest.raises(Refused, match="not valid JSON"):
        parse_body(b"{nope", config)
    with pytest.raises(Refused) as schema:
        parse_body(json.dumps({"user": "much-too-long"}).encode(), config)
    assert schema.value.code == "schema_violation" and schema.value.message.startswith("user:")
    with pytest.raises(Refused, match="prompt is 11 tokens"):
        check_lengths(11, 1, config)
    with pytest.raises(Refused, match="max_tokens is 6"):
        check_lengths(1, 6, config)
    assert parse_body(b'{"user": "ok"}', config) == {"user": "ok"}


def test_openai_fields_are_checked() -> None:
    with pytest.raises(Refused, match="max_tokens"):
        openai.sampling_fields({"max_tokens": 0})
    with pytest.raises(Refused, match="temperature"):
        openai.sampling_fields({"temperature": 3})
    with pytest.raises(Refused, match="messages\\[1\\]"):
        openai.prompt_of("chat", {"messages": [{"role": "user", "content": "hi"}, {"x": 1}]})
    assert openai.prompt_of("chat", {"messages": [{"role": "user", "content": "hi"}]}) == (
        "user: hi\nassistant:"
    )


def test_split_follows_the_weight_and_keeps_a_requested_group() -> None:
    rng = random.Random(0)
    picks = [choose_group(20, None, has_canary=True, rng=rng) for _ in range(5000)]
    assert 0.18 < picks.count("canary") / 5000 < 0.22
    assert choose_group(0, "canary", has_canary=True) == "canary"  # sticky
    assert choose_group(100, "stable", has_canary=True) == "stable"
    assert choose_group(100, "canary", has_canary=False) == "stable"
    assert choose_group(50, "bogus", has_canary=True, rng=random.Random(1)) in ("stable", "canary")


def test_traceparent_is_continued_or_started() -> None:
    incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    ctx = continue_trace(incoming)
    assert ctx.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert ctx.span_id != "00f067aa0ba902b7"
    assert parse_traceparent(ctx.header) == ctx
    assert parse_traceparent("00-" + "0" * 32 + "-00f067aa0ba902b7-01") is None
    fresh = continue_trace("garbage")
    assert len(fresh.trace_id) == 32 and parse_traceparent(fresh.header) is not None


def test_keys_compare_hashes_only() -> None:
    hashes = [hash_key("ik_one"), hash_key("ik_two")]
    assert key_matches("ik_two", hashes)
    assert not key_matches("ik_three", hashes)
    assert not key_matches(None, hashes)
    assert bearer("Bearer ik_one") == "ik_one"
    assert bearer("Basic abc") is None


def test_lifecycle_order_is_enforced_and_timed() -> None:
    life = Lifecycle("r1")
    for state in ("validating", "routing", "executing", "completed"):
        life.to(state)
    assert list(life.times) == ["pending", "validating", "routing", "executing", "completed"]
    assert life.times["completed"] >= life.times["pending"]
    with pytest.raises(LifecycleError):
        Lifecycle("r2").to("executing")


def test_sli_window_histograms_and_quantiles() -> None:
    window = SliWindow()
    for ms in (3, 7, 7, 30, 900):
        window.record(latency_s=ms / 1000, ok=True, ttft_s=0.002, itl_s=[0.001, 0.004])
    window.record(latency_s=0.02, ok=False)
    window.record(latency_s=0.001, ok=False, client_error=True)
    data = window.as_dict()
    assert data["requests"] == 7 and data["errors"] == 1 and data["rejected"] == 1
    assert sum(data["latency_ms"]) == 7 and len(data["latency_ms"]) == len(BOUNDS_MS) + 1
    assert sum(data["itl_ms"]) == 10
    assert quantile(data["latency_ms"], 0.5) == 10.0
    assert quantile(data["latency_ms"], 0.99) == 1000.0
    assert quantile([0] * 12, 0.5) is None


def test_refusals_survive_pickling_across_replicas() -> None:
    import pickle

    data = pickle.dumps(Refused(429, "kv_quota_exceeded", "needs 20 blocks"))
    again = pickle.loads(data)  # noqa: S301 (our own bytes, as Ray moves them)
    assert (again.status, again.code, again.message) == (
        429,
        "kv_quota_exceeded",
        "needs 20 blocks",
    )
