"""The Serve API client under a slow or failing control plane (seed 000 §2.5): its retry budget
and circuit breaker (serving.control.breaker) keep the HTTP calls bounded, the breaker opens
under the `control_plane_delay` fault (the real chaos hook: a Redis key the client reads at each
call) and closes once the delay ends; its state reaches /metrics, the pages' badge and the
operator's alert. The Serve API here is a stand-in HTTP server on 127.0.0.1 that counts calls."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from serving.control import breaker
from serving.control.breaker import BreakerState, ControlPlaneGuard, GuardSettings
from serving.control.serve_api import ServeApiClient, ServeApiError, ServeCircuitOpen
from serving.deployments import controlplane
from serving.deployments.chaos import control_delay_key
from tests.conftest import TenantWorld

FAST = GuardSettings(failure_threshold=3, cooldown_s=1.0, slow_call_s=0.2, backoff_s=0.01)


class StandIn:
    """A stand-in Serve API: answers GET /api/serve/applications/ and counts the calls.
    `mode`: ok, fail (503 each time) or alternate (503, 200, 503, ...)."""

    def __init__(self) -> None:
        self.hits = 0
        self.mode = "ok"
        self.lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                with stand_in.lock:
                    stand_in.hits += 1
                    failing = stand_in.mode == "fail" or (
                        stand_in.mode == "alternate" and stand_in.hits % 2 == 1
                    )
                body = b"busy" if failing else json.dumps({"applications": {}}).encode()
                self.send_response(503 if failing else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def client(self) -> ServeApiClient:
        return ServeApiClient(self.url, "token", timeout=5)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    breaker.configure(FAST)
    store = redis.Redis.from_url(settings.REDIS_URL)
    store.delete(controlplane._key(controlplane.GUARDS_KEY))
    store.delete(controlplane._key(controlplane.EVENTS_KEY), control_delay_key())
    server = StandIn()
    try:
        yield server
    finally:
        server.close()
        store.delete(control_delay_key())
        breaker.configure()


def hammer(client: ServeApiClient, *, threads: int, seconds: float) -> dict[str, int]:
    """`threads` callers asking Serve for its applications as fast as they can."""
    outcome = {"ok": 0, "refused": 0, "failed": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def caller() -> None:
        while time.monotonic() < deadline:
            try:
                client.applications()
                kind = "ok"
            except ServeCircuitOpen:
                kind = "refused"
                time.sleep(0.01)
            except ServeApiError:
                kind = "failed"
            with lock:
                outcome[kind] += 1

    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return outcome


def test_the_breaker_opens_probes_after_the_cooldown_and_closes() -> None:
    now = [0.0]
    guard = ControlPlaneGuard("http://x", FAST, clock=lambda: now[0])
    for _ in range(FAST.failure_threshold):
        assert guard.allow()
        guard.record(ok=False, latency_s=0.01)
    assert guard.state is BreakerState.OPEN and not guard.allow()
    now[0] += FAST.cooldown_s
    assert guard.allow() and guard.state is BreakerState.HALF_OPEN  # the one probe
    assert not guard.allow()  # a second caller waits while the probe is out
    guard.record(ok=True, latency_s=FAST.slow_call_s + 0.1)  # answered, but too slowly
    assert guard.state is BreakerState.OPEN and not guard.allow()
    now[0] += FAST.cooldown_s
    assert guard.allow()
    guard.record(ok=True, latency_s=0.01)
    assert guard.state is BreakerState.CLOSED and guard.allow()
    assert guard.counts["opened"] == 2 and guard.counts["http_calls"] == 5


def test_a_probe_that_never_reports_back_does_not_wedge_the_breaker() -> None:
    """The half-open probe's caller died (or failed before recording an attempt): after a
    cool-down another caller probes, instead of every call being refused for ever."""
    now = [0.0]
    guard = ControlPlaneGuard("http://x", FAST, clock=lambda: now[0])
    for _ in range(FAST.failure_threshold):
        assert guard.allow()
        guard.record(ok=False, latency_s=0.01)
    now[0] += FAST.cooldown_s
    assert guard.allow() and guard.state is BreakerState.HALF_OPEN  # the probe, then lost
    now[0] += FAST.cooldown_s / 2
    assert not guard.allow()  # still in flight, maybe
    now[0] += FAST.cooldown_s / 2
    assert guard.allow()  # lost: the next caller probes
    assert not guard.allow()
    guard.record(ok=True, latency_s=0.01)
    assert guard.state is BreakerState.CLOSED and guard.allow()


def test_a_failure_below_the_threshold_does_not_open_it_and_success_resets() -> None:
    guard = ControlPlaneGuard("http://x", FAST)
    for _ in range(5):
        guard.record(ok=False, latency_s=0.01)
        guard.record(ok=False, latency_s=0.01)
        guard.record(ok=True, latency_s=0.01)
    assert guard.state is BreakerState.CLOSED


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        GuardSettings(failure_threshold=0)
    with pytest.raises(ValueError, match="retry_ratio"):
        GuardSettings(retry_ratio=2)


def test_an_open_breaker_refuses_without_a_call_and_says_why(stand_in: StandIn) -> None:
    client = ServeApiClient("http://127.0.0.1:1", "t", timeout=1)
    with pytest.raises(ServeApiError, match="unreachable") as first:
        client.applications()  # the call and its budgeted retries: 3 failures, the threshold
    assert not isinstance(first.value, ServeCircuitOpen)
    with pytest.raises(ServeCircuitOpen, match="circuit breaker is open.*unreachable"):
        client.applications()
    guard = breaker.guard_for("http://127.0.0.1:1")
    assert guard.counts["http_calls"] == FAST.failure_threshold and guard.counts["rejected"] == 1


def test_retries_stay_within_the_budget(stand_in: StandIn) -> None:
    """Every other call fails: each failure could be retried, the budget allows about 10 %."""
    stand_in.mode = "alternate"
    client = stand_in.client()
    started = time.monotonic()
    requests = 300
    for _ in range(requests):
        try:
            client.applications()
        except ServeApiError as exc:
            assert exc.status == 503
    elapsed = time.monotonic() - started
    guard = breaker.guard_for(stand_in.url)
    retries = guard.counts["retries"]
    allowed = FAST.retry_cap + FAST.retry_ratio * requests + FAST.retry_floor_per_s * elapsed
    assert 0 < retries <= allowed, (retries, allowed)
    assert guard.counts["retries_denied"] > 100  # without the budget each was one more call
    assert stand_in.hits == requests + retries
    assert guard.state is BreakerState.CLOSED  # never 3 failures in a row


def test_a_failing_control_plane_sees_no_retry_storm(stand_in: StandIn) -> None:
    stand_in.mode = "fail"
    seconds, threads = 2.0, 8
    outcome = hammer(stand_in.client(), threads=threads, seconds=seconds)
    guard = breaker.guard_for(stand_in.url)
    # The calls that opened it (and their budgeted retries, and those in flight), then one
    # probe per cool-down: a few dozen at most, against thousands of requests.
    bound = FAST.failure_threshold + FAST.retry_cap + threads + seconds / FAST.cooldown_s + 2
    assert stand_in.hits <= bound, (stand_in.hits, outcome)
    assert outcome["refused"] > 10 * stand_in.hits, outcome
    assert guard.state is not BreakerState.CLOSED


@pytest.mark.django_db
def test_the_control_plane_delay_opens_the_breaker_and_it_recovers_after(
    stand_in: StandIn, world_a: TenantWorld
) -> None:
    store = redis.Redis.from_url(settings.REDIS_URL)
    store.set(control_delay_key(), json.dumps({"run": 1, "delay_ms": 400}), ex=60)
    client = stand_in.client()
    seconds, threads = 3.0, 6
    outcome = hammer(client, threads=threads, seconds=seconds)
    guard = breaker.guard_for(stand_in.url)
    # Unguarded, 6 callers would have made 6 * 3 / 0.4 = 45 calls (more with retries).
    bound = FAST.failure_threshold + threads + seconds / FAST.cooldown_s + 2
    assert stand_in.hits <= bound, (stand_in.hits, outcome)
    assert guard.state is not BreakerState.CLOSED and outcome["refused"] > stand_in.hits
    assert guard.counts["retries"] == 0  # slow answers are answers: nothing to retry

    # Published for every process: the platform's state, its alert, /metrics, the badges.
    status = controlplane.control_plane_status()
    assert status["state"] in ("open", "half_open") and status["degraded"]
    assert status["events"][-1]["state"] == "open"  # the alert (newest first: the oldest)
    assert status["latency_p50_s"] >= 0.4
    with override_settings(METRICS_TOKEN="t"):
        scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(scraped)}
    states = {
        s.labels["state"]: s.value
        for s in families["portal_serve_api_breaker_state"].samples
        if s.labels["endpoint"] == stand_in.url
    }
    assert states[status["state"]] == 1 and states["closed"] == 0
    [rejected] = [
        s
        for s in families["portal_serve_api_rejected"].samples
        if s.labels["endpoint"] == stand_in.url and s.name.endswith("_total")
    ]
    assert rejected.value >= 1
    member = Client()
    member.force_login(world_a.viewer)
    page = member.get(f"/t/{world_a.tenant.slug}/").content.decode()
    assert 'data-testid="control-plane-badge"' in page and "control plane" in page
    assert "deployment changes are delayed" in page and "retries" not in page

    # The delay ends: after a cool-down the probe answers fast and the breaker closes.
    store.delete(control_delay_key())
    time.sleep(FAST.cooldown_s + 0.1)
    assert client.applications() == {}
    assert guard.state is BreakerState.CLOSED
    assert controlplane.control_plane_status()["state"] == "closed"
    page = member.get(f"/t/{world_a.tenant.slug}/").content.decode()
    assert 'data-testid="control-plane-badge"' not in page  # tenants see it only when degraded
    staff = get_user_model().objects.create_user(
        username="sre@platform.example", email="sre@platform.example", is_staff=True
    )
    platform = Client()
    platform.force_login(staff)
    page = platform.get("/platform/status/").content.decode()
    assert 'data-testid="control-plane-badge"' in page  # staff: always, with the latency
    assert 'data-testid="control-plane-alerts"' in page and stand_in.url in page


def test_a_publish_drops_dead_processes_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    store = redis.Redis.from_url(settings.REDIS_URL)
    key = controlplane._key(controlplane.GUARDS_KEY)
    store.delete(key)
    now = time.time()
    dead = {"at": now - controlplane.STALE_AFTER_S - 5, "state": "closed", "endpoint": "x"}
    store.hset(key, "gone:1 http://x", json.dumps(dead))
    monkeypatch.setattr(controlplane, "_pruned_at", 0.0)
    snapshot = {
        "at": now, "state": "closed", "endpoint": "http://127.0.0.1:1",
        "consecutive_failures": 0, "latency_last_s": None,
    }  # fmt: skip
    controlplane.publish(snapshot, changed=False)
    fields = {f.decode() for f in store.hkeys(key)}
    assert "gone:1 http://x" not in fields and len(fields) == 1
    store.delete(key)
