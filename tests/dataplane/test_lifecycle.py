"""The request lifecycle as the request inspector sees it: trace id, status, the version and
replica that answered, tokens and prefix hits, durations per state, bounded sizes; the slowest
requests kept through a flood of fast ones; and the same record through a real router with
its in-process stable slot (the built-in engine reports its prefix-cache hits)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from serving.dataplane.lifecycle import (
    MAX_ERROR,
    MAX_LABEL,
    REQUEST_ID,
    Lifecycle,
    LifecycleError,
    RecentRequests,
    requests_key,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The lifecycle module's clock, set by the test."""
    from serving.dataplane import lifecycle

    fake = Clock()
    monkeypatch.setattr(lifecycle, "time", SimpleNamespace(time=fake))
    return fake


def _finished(
    life: Lifecycle, clock: Clock, times: list[float], state: str = "completed"
) -> Lifecycle:
    """Walk `life` (made at times[0]) through its states at the given times."""
    life.times["pending"] = times[0]
    for name, at in zip(("validating", "routing", "executing", state), times[1:], strict=False):
        clock.now = at
        life.to(name)
    return life


def test_the_record_carries_trace_status_answer_and_durations(clock: Clock) -> None:
    life = Lifecycle("r1", trace_id=TRACE)
    _finished(life, clock, [10.0, 10.001, 10.004, 10.010, 10.250])
    life.answered(
        {"version": "v7", "replica": "abc123", "pid": 4242, "prompt_tokens": 12,
         "fingerprint": "fp"}
    )  # fmt: skip
    life.answered(
        {"type": "end", "usage": {"prompt_tokens": 12, "completion_tokens": 5},
         "prefix_hit_tokens": 8}
    )  # fmt: skip
    record = life.as_dict()
    assert record["trace_id"] == TRACE and record["status"] == 200 and record["code"] is None
    assert (record["version"], record["replica"], record["pid"]) == ("v7", "abc123", 4242)
    assert (record["prompt_tokens"], record["completion_tokens"]) == (12, 5)
    assert record["prefix_hit_tokens"] == 8
    assert record["ms"] == pytest.approx(
        {"pending": 1.0, "validating": 3.0, "routing": 6.0, "executing": 240.0}, abs=0.01
    )
    assert record["total_ms"] == pytest.approx(250.0, abs=0.01)
    assert list(record["times"]) == ["pending", "validating", "routing", "executing", "completed"]
    json.dumps(record)  # what the router publishes


def test_a_failure_keeps_its_status_and_code_and_cuts_long_text() -> None:
    life = Lifecycle("r2")
    life.to("validating")
    life.to("failed", error="x" * 5000, status=401, code="invalid_api_key" * 20)
    assert life.status == 401 and life.done
    assert len(life.error or "") == MAX_ERROR and len(life.code or "") == MAX_LABEL
    assert list(life.durations_ms()) == ["pending", "validating"]
    # What an answer says is taken only when it has the right shape.
    life.answered({"version": "v" * 500, "pid": "not a pid", "usage": [1], "prompt_tokens": -3})
    assert len(life.version or "") == MAX_LABEL and life.pid is None
    assert life.prompt_tokens is None
    with pytest.raises(LifecycleError):
        life.to("completed")


def test_request_ids_the_router_keeps_and_the_key_layout() -> None:
    assert REQUEST_ID.match("5f2b0c1e-8d7a-4a3e-9c51-0e2b7f3c9a10")
    assert REQUEST_ID.match("a" * 128) and not REQUEST_ID.match("a" * 129)
    assert not REQUEST_ID.match("") and not REQUEST_ID.match("has space")
    assert not REQUEST_ID.match("line\nbreak") and not REQUEST_ID.match("ünïcode")
    assert requests_key("portal", "acme.chat") == "portal:requests:acme.chat"


def test_recent_is_bounded_and_the_slowest_survive_a_flood(clock: Clock) -> None:
    clock.now = 1000.0
    recent = RecentRequests(50, slow_size=3, slow_window_s=60, clock=clock)
    for i, seconds in enumerate([2.0, 0.5, 3.0]):
        life = Lifecycle(f"slow-{i}")
        recent.add(life)
        _finished(life, clock, [990.0, 990.0, 990.0, 990.0, 990.0 + seconds])
    for i in range(500):  # a flood of fast ones pushes the slow ones out of "recent"
        life = Lifecycle(f"fast-{i}")
        recent.add(life)
        _finished(life, clock, [995.0, 995.0, 995.0, 995.0, 995.01])
    snapshot = recent.snapshot()
    assert len(snapshot["recent"]) == 50
    assert snapshot["recent"][-1]["request_id"] == "fast-499"
    assert [s["request_id"] for s in snapshot["slow"]] == ["slow-2", "slow-0", "slow-1"]
    # A slower one replaces the fastest of the kept; a request still running is not kept.
    running = Lifecycle("running")
    recent.add(running)
    slower = Lifecycle("slower")
    recent.add(slower)
    _finished(slower, clock, [996.0, 996.0, 996.0, 996.0, 997.0])
    assert [s["request_id"] for s in recent.snapshot()["slow"]] == ["slow-2", "slow-0", "slower"]
    assert recent.snapshot()["recent"][-2]["state"] == "pending"
    # Past the window, the slow ones are forgotten.
    clock.now = 1000.0 + 120
    assert recent.snapshot()["slow"] == []
    fresh = Lifecycle("fresh")
    recent.add(fresh)
    _finished(fresh, clock, [1119.0, 1119.0, 1119.0, 1119.0, 1119.1], state="failed")
    assert [s["request_id"] for s in recent.snapshot()["slow"]] == ["fresh"]


def test_through_the_router_the_record_has_trace_replica_tokens_and_prefix_hits(
    tmp_path: Path,
) -> None:
    """The in-process stable slot (the built-in engine): the second request of one long
    prompt finds its blocks in the prefix cache; a refused request keeps its status and code;
    a stream's record gets its tokens from the end event. Published apart from the router's
    state, bounded."""
    from starlette.requests import Request

    from serving.dataplane.app import Router
    from serving.dataplane.keys import hash_key
    from serving.engine.testing import write_tiny_checkpoint

    artifact = str(write_tiny_checkpoint(tmp_path / "tiny"))
    router = Router.func_or_class(local={"app": "acme.chat", "engine": {"num_blocks": 64}})
    config = {
        "tenant": "7", "deployment": "chat", "key_hashes": [hash_key("k")],
        "groups": {"stable": {"app": "acme.chat", "version": "v1", "local": True}},
        "local": {"version": "v1", "artifact": artifact, "fingerprint": "fp-1",
                  "tenants": {"7": {"salt": "ab" * 32}}},
    }  # fmt: skip
    prompt = "a prompt long enough to fill more than two blocks of sixteen tokens each, " * 2

    async def post(key: str, request_id: str, **body: Any) -> Any:
        async def receive() -> dict[str, Any]:
            # Greedy: sampled at temperature 1, a random model may end on EOS before 3 tokens.
            payload = {"prompt": prompt, "max_tokens": 3, "temperature": 0, **body}
            return {
                "type": "http.request",
                "body": json.dumps(payload).encode(),
                "more_body": False,
            }

        headers = [
            (b"authorization", f"Bearer {key}".encode()),
            (b"x-request-id", request_id.encode()),
            (b"traceparent", f"00-{TRACE}-00f067aa0ba902b7-01".encode()),
        ]
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "",
                 "headers": headers, "query_string": b""}  # fmt: skip
        response = await router(Request(scope, receive))
        if hasattr(response, "body_iterator"):
            async for _ in response.body_iterator:
                pass
        return response

    async def scenario() -> dict[str, Any]:
        await router.reconfigure(config)
        assert (await post("k", "first")).status_code == 200
        assert (await post("k", "second")).status_code == 200
        assert (await post("wrong", "refused")).status_code == 401
        assert (await post("k", "streamed", stream=True)).status_code == 200
        assert (await post("k", "bad id\twith tab")).status_code == 200
        return router.stats()

    try:
        stats = asyncio.run(scenario())
    finally:
        router.local.chaos.close()
        router.local.engine.stop()
    records = {r["request_id"]: r for r in stats["requests"]["recent"]}
    first, second = records["first"], records["second"]
    for record in (first, second):
        assert record["trace_id"] == TRACE and record["status"] == 200
        assert record["version"] == "v1" and record["group"] == "stable"
        assert record["replica"] and record["pid"] == stats["pid"]
        assert record["completion_tokens"] == 3 and record["prompt_tokens"] > 32
        assert set(record["ms"]) == {"pending", "validating", "routing", "executing"}
    assert first["prefix_hit_tokens"] == 0
    assert second["prefix_hit_tokens"] >= 32  # two full blocks found again
    refused = records["refused"]
    assert (refused["state"], refused["status"], refused["code"]) == (
        "failed",
        401,
        "invalid_api_key",
    )
    assert refused["version"] is None and refused["trace_id"] == TRACE
    streamed = records["streamed"]
    assert streamed["state"] == "completed" and streamed["completion_tokens"] == 3
    assert streamed["prefix_hit_tokens"] >= 32 and streamed["version"] == "v1"
    assert not any("\t" in r for r in records) and len(records) == 5  # the odd id replaced
    assert len(stats["requests"]["slow"]) == 5

    # Published: the router's state without the requests, the requests under their own key.
    import redis
    import redis.asyncio as aioredis
    from django.conf import settings

    from serving.dataplane.answers import publish_router

    prefix = f"test-lifecycle-{os.getpid()}"

    async def publish() -> None:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        await publish_router(client, prefix, {**stats, "app": "acme.chat"})
        await client.aclose()

    asyncio.run(publish())
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        state = json.loads(client.hget(f"{prefix}:router:acme.chat", stats["replica"]))
        published = json.loads(client.hget(requests_key(prefix, "acme.chat"), stats["replica"]))
        assert 0 < client.ttl(requests_key(prefix, "acme.chat")) <= 10
    finally:
        client.delete(f"{prefix}:router:acme.chat", requests_key(prefix, "acme.chat"))
    assert "requests" not in state and state["breakers"]
    assert published["replica"] == stats["replica"] and published["pid"] == stats["pid"]
    assert len(published["recent"]) == 5 and len(published["slow"]) == 5
