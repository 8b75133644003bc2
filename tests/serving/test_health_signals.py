"""The health tick's signal SLIs from replicas' snapshots in the real Redis (no Ray here): a
replica left on other weights shows in the divergence score (and on the page), errors by
reason and queue wait come from the replicas' counters, a deployment missing a critical signal
(GPU samples without a GPU agent) scores a coverage below 1, the golden-prompt probe's score
is read from its hash; all of it on the health page and in /metrics."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis
from django.conf import settings
from django.urls import reverse

from serving.dataplane.guard import Refused
from serving.dataplane.sli import SliRecorder, publish
from serving.deployments.models import Deployment
from serving.ops import health
from serving.ops.contracts import contract_set
from serving.ops.health.state import consistency_field, consistency_key, health_keys
from serving.telemetry.keys import gpu_keys
from serving.telemetry.metrics_slo import SloCollector
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import _ready

pytestmark = pytest.mark.django_db

CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: signals
spec:
  window: 1h
  objectives:
    - {name: divergence, sli: state_divergence, max: 0.03}
    - {name: observed, sli: coverage, min: 1}
    - {name: golden, sli: output_consistency, min: 0.9}
    - {name: kv-quota, sli: errors_by_reason, reason: kv_quota, max: 0.5, window: 1m}
    - {name: queue, sli: queue_wait_ms, max: 1000, window: 1m}
  critical_signals: [latency, weights, kv_use, queue_wait, error_reasons, gpu_memory]
"""


def _version_label(deployment: Deployment) -> str:
    version = Deployment.objects.get(pk=deployment.pk).current_revision.stable_version
    return f"{version.model.name}:{version.label}"


class FakeReplica:
    """One replica's recorder, published to the real Redis as a Ray replica does."""

    def __init__(self, deployment: Deployment, name: str, version: str, fingerprint: str) -> None:
        app = f"{deployment.tenant.slug}.{deployment.name}"
        self.recorder = SliRecorder(app, "stable", version, name, {"max_num_seqs": 8})
        self.loaded = {"version": version, "fingerprint": fingerprint}

    def serve(self, ok: int, kv_quota: int = 0, queued_s: float = 0.05) -> None:
        for _ in range(ok):
            self.recorder.record(queued_s=queued_s, latency_s=0.02, ok=True, tokens_out=4)
        for _ in range(kv_quota):
            try:
                raise Refused(429, "kv_quota_exceeded", "full")
            except Refused:
                self.recorder.record(latency_s=0.001, ok=False, client_error=True)
        kv = {"num_blocks": 64, "free_blocks": 32, "running": 2, "waiting": 0, "tenants": {}}
        snapshot = self.recorder.roll(kv=kv, loaded=self.loaded)

        async def send() -> None:
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(settings.REDIS_URL)
            await publish(client, settings.SLI_KEY_PREFIX, snapshot)
            await client.aclose()

        asyncio.run(send())


def _signals(deployment: Deployment) -> dict[str, Any]:
    return health.deployment_health(deployment.pk)["signals"]["stable"]


def _objectives(deployment: Deployment) -> dict[str, Any]:
    slot = health.deployment_health(deployment.pk)["slots"]["stable"]
    return {o["name"]: o for o in slot["objectives"]}


def test_the_gpu_key_is_the_telemetry_rooms() -> None:
    assert health_keys()["gpu_latest"] == gpu_keys()["latest"]


def test_signals_from_replicas_divergence_coverage_consistency_page_and_metrics(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _ready(world_a)
    contract_set(
        tenant=world_a.tenant,
        actor=Actor(user=world_a.owner),
        deployment=deployment,
        source=CONTRACT,
    )
    version = _version_label(deployment)
    good = FakeReplica(deployment, "r-good", version, "sha-new")
    stale = FakeReplica(deployment, "r-stale", "assistant:old", "sha-old")
    now = time.time()
    for step in range(4):  # 4 ticks 3 s apart: two series points
        good.serve(ok=10, kv_quota=2 if step else 0)
        stale.serve(ok=5)
        health.tick(now=now + 3 * step, act=False)

    found = _signals(deployment)
    # The replica on other weights is not dropped: it shows, and the score is above 0.
    assert found["divergence"]["off"] == ["r-stale"]
    assert found["divergence"]["weights"] == 0.5 and found["values"]["state_divergence"] > 0
    rows = {r["replica"]: r for r in found["replicas"]}
    assert rows["r-stale"]["fingerprint"] == "sha-old" and rows["r-good"]["version"] == version
    # Errors by reason and queue wait from the replicas' counters.
    assert found["values"]["errors_by_reason"]["kv_quota"] == pytest.approx(6 / (10 + 3 * 12))
    assert found["values"]["queue_wait_ms"] == pytest.approx(50.0)
    assert found["values"]["kv_use"] == 0.5 and found["values"]["batch_occupancy"] == 0.25
    # No GPU agent sample: gpu_memory is missing, coverage is 5 of 6.
    assert found["coverage"]["missing"] == ["gpu_memory"]
    assert found["values"]["coverage"] == pytest.approx(5 / 6)
    status = _objectives(deployment)
    assert status["divergence"]["ok"] is False and "r-stale" in status["divergence"]["detail"]
    assert status["observed"]["ok"] is False and "gpu_memory" in status["observed"]["detail"]
    assert status["golden"]["ok"] is None  # no probe result yet
    assert status["kv-quota"]["ok"] is True and status["queue"]["ok"] is True

    # A GPU agent's sample with a process of this deployment, and a probe's score.
    r = redis.Redis.from_url(settings.REDIS_URL)
    sample = {
        "at": time.time(),
        "node": "n1",
        "devices": [{"uuid": "GPU-1", "gpu_util": 40.0}],
        "processes": [
            {"pid": 1, "device_uuid": "GPU-1", "deployment_id": deployment.pk, "group": "stable"}
        ],
    }
    r.hset(gpu_keys()["latest"], "n1", json.dumps(sample))
    probe = {"score": 0.5, "at": time.time(), "detail": "1 of 2 prompts drifted"}
    r.hset(consistency_key(), consistency_field(deployment.pk, "stable"), json.dumps(probe))
    good.serve(ok=10)
    stale.serve(ok=5)
    health.tick(now=now + 12, act=False)
    found = _signals(deployment)
    assert found["values"]["coverage"] == 1.0 and found["coverage"]["missing"] == []
    assert "gpu_memory" in found["coverage"]["collected"]
    status = _objectives(deployment)
    assert status["observed"]["ok"] is True
    assert status["golden"]["value"] == 0.5 and status["golden"]["ok"] is False

    # The page's panel.
    client.force_login(world_a.viewer)
    url = reverse(
        "serving-deployment-health-live", kwargs={"slug": world_a.tenant.slug, "pk": deployment.pk}
    )
    page = client.get(url).content.decode()
    assert 'data-testid="signals"' in page and 'data-signal="latency_p99_jitter"' in page
    assert 'data-off="1"' in page and "off the desired weights" in page
    assert 'data-testid="coverage"' in page and "100.0%" in page
    assert 'data-reason="kv_quota"' in page

    # /metrics.
    families = {f.name: f for f in SloCollector().collect()}
    samples = {
        (s.labels["signal"], s.labels["slot"]): s.value
        for s in families["portal_slo_signal"].samples
    }
    assert samples[("state_divergence", "stable")] > 0
    assert samples[("coverage", "stable")] == 1.0
    assert samples[("output_consistency", "stable")] == 0.5
    reasons = {
        s.labels["reason"]: s.value for s in families["portal_slo_errors_by_reason_ratio"].samples
    }
    assert reasons["kv_quota"] > 0
    parts = {
        s.labels["part"]: s.value for s in families["portal_slo_state_divergence_part"].samples
    }
    assert parts["weights"] == 0.5


def test_a_malformed_probe_result_is_not_a_score(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    contract_set(
        tenant=world_a.tenant,
        actor=Actor(user=world_a.owner),
        deployment=deployment,
        source=CONTRACT,
    )
    r = redis.Redis.from_url(settings.REDIS_URL)
    field = consistency_field(deployment.pk, "stable")
    now = time.time()
    replica = FakeReplica(deployment, "r1", _version_label(deployment), "sha")
    malformed = ("{not json", json.dumps({"score": 7}), '{"score": "1"}', '{"score": 1, "at": "x"}')
    for step, bad in enumerate(malformed):
        r.hset(consistency_key(), field, bad)
        replica.serve(ok=1)
        health.tick(now=now + 3 * step, act=False)
        assert _objectives(deployment)["golden"]["ok"] is None


def test_a_probe_score_of_another_version_or_too_old_is_not_the_slots(
    world_a: TenantWorld,
) -> None:
    """The score the probe stored for the slot's previous version (a canary replaced, a
    promotion) or over an hour ago does not decide `output_consistency` now."""
    deployment = _ready(world_a)
    contract_set(
        tenant=world_a.tenant,
        actor=Actor(user=world_a.owner),
        deployment=deployment,
        source=CONTRACT,
    )
    r = redis.Redis.from_url(settings.REDIS_URL)
    field = consistency_field(deployment.pk, "stable")
    label = _version_label(deployment)
    replica = FakeReplica(deployment, "r1", label, "sha")
    now = time.time()
    stored = (
        {"score": 0.25, "at": now, "detail": "old version", "version": "assistant:old"},
        {"score": 0.25, "at": now - 7200, "detail": "two hours ago", "version": label},
    )
    for step, probe in enumerate(stored):
        r.hset(consistency_key(), field, json.dumps(probe))
        replica.serve(ok=1)
        health.tick(now=now + 3 * step, act=False)
        assert _objectives(deployment)["golden"]["ok"] is None, probe["detail"]
        assert "consistency" not in _signals(deployment)["coverage"]["collected"]
    r.hset(consistency_key(), field, json.dumps({**stored[0], "version": label}))
    replica.serve(ok=1)
    health.tick(now=now + 6, act=False)
    golden = _objectives(deployment)["golden"]
    assert golden["ok"] is False and golden["value"] == 0.25


def test_the_panel_shows_a_value_and_its_seed_threshold_in_the_same_unit() -> None:
    from serving.ops.views.health_signals import signals_view

    found = {"values": {"state_divergence": 0.05, "latency_p99_jitter": 20.0}}
    rows = {r["name"]: r for r in signals_view(found)["rows"]}
    divergence, jitter = rows["state_divergence"], rows["latency_p99_jitter"]
    assert (divergence["text"], divergence["seed"], divergence["over_seed"]) == (
        "5.0%",
        "3.0%",
        True,
    )
    assert (jitter["text"], jitter["seed"]) == ("20 ms", "15 ms")


def test_between_points_a_tick_moves_only_the_small_state(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The series is a capped per-slot list, appended once per point and read only when a
    point may close; the per-tick hash field stays small however long the series."""
    from serving.ops.health import series as series_cache
    from serving.slo.signals import POINT_S

    deployment = _ready(world_a)
    contract_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        source=CONTRACT,
    )  # fmt: skip
    Deployment.objects.filter(pk=deployment.pk).update(health_interval_s=1)
    replica = FakeReplica(deployment, "r-1", _version_label(deployment), "sha")
    loaded: list[bool] = []
    parse = series_cache.parse_read

    def counting(result: Any, names: Any) -> Any:
        found = parse(result, names)
        loaded.extend(series is not None for _, series in found.values())
        return found

    monkeypatch.setattr(series_cache, "parse_read", counting)
    keys, r = health_keys(), redis.Redis.from_url(settings.REDIS_URL)
    name = f"{deployment.pk}:stable"
    now, ticks = int(time.time()) + 0.0006, 40  # a tick time whose rounding would go up
    for step in range(ticks):
        replica.serve(ok=3)
        health.tick(now=now + step, act=False)
    points = r.llen(series_cache.series_key(keys["signals"], name))
    assert points == pytest.approx(ticks / POINT_S, abs=1)
    assert sum(loaded) <= points + 2  # read when a point closes, not every tick
    assert len(r.hget(keys["signals"], name)) < 2500  # no series in the per-tick state
    assert 0 < r.ttl(series_cache.series_key(keys["signals"], name)) <= series_cache.LIST_TTL_S
    # The contract's windowed objectives and the page read the values cached at the point.
    status = _objectives(deployment)
    assert status["queue"]["ok"] is True and "over 60s" in status["queue"]["detail"]
    assert _signals(deployment)["values"]["queue_wait_ms"] == pytest.approx(50.0)


def test_signals_of_slots_that_are_no_longer_targets_are_pruned(world_a: TenantWorld) -> None:
    from serving.ops.health import series as series_cache

    deployment = _ready(world_a)
    keys, r = health_keys(), redis.Redis.from_url(settings.REDIS_URL)
    gone = ["999999:stable", f"{deployment.pk}:canary"]  # a deleted deployment, a canary
    for name in gone:
        r.hset(keys["signals"], name, "0 {}")
        r.lpush(series_cache.series_key(keys["signals"], name), "{}")
    r.delete(f"{keys['lock']}:signals-pruned")
    health.tick(now=time.time(), act=False)
    assert set(gone).isdisjoint(f.decode() for f in r.hkeys(keys["signals"]))
    assert not any(r.exists(series_cache.series_key(keys["signals"], n)) for n in gone)
    assert r.hexists(keys["signals"], f"{deployment.pk}:stable")


def test_a_failure_is_counted_under_one_reason_only() -> None:
    """The router's breaker records the same failure the replica reports (published apart, the
    router's first): by reason the shares never add up to more than the error ratio; a
    failure no replica reported (it died) still counts, as upstream."""
    from serving.ops.health import series as series_cache
    from serving.ops.health.signals import slot_signals, summary
    from serving.slo.counts import Counts

    state: dict[str, Any] | None = None
    points: list[dict[str, Any]] = []
    now, requests, errors = 1000.0, 0, 0
    for tick in range(12):
        replica_errors = 2 * min(tick, 7)  # from tick 8 its replica is gone: no more reports
        router_failures = 2 * (tick + 1)  # a tick ahead of the replica's report
        replica = {
            "replica": "r-1", "version": "m:v1", "kv": {}, "totals": {},
            "signals": {"errors": {"other": replica_errors}},
        }  # fmt: skip
        router = {"replica": "router-1", "breakers": {"stable": {"failures": router_failures}}}
        delta = Counts(requests=10, errors=2, seconds=2.0)
        requests, errors = requests + 10, errors + delta.errors
        observed, raw, point = slot_signals(
            now=now + 2 * tick, dep_id=1, tenant_id=1, group="stable", version="m:v1",
            replicas=[replica], delta=delta, routers=[router], gpu=[], consistency=None,
            reported={}, critical=None, state=state, series=list(points),
        )  # fmt: skip
        state = series_cache.decode_state(raw)
        if point is not None:
            points.append(json.loads(point))
    shares = summary(observed)["values"]["errors_by_reason"]
    total = sum(v or 0.0 for v in shares.values())
    assert total <= errors / requests + 1e-9
    assert (shares["upstream"] or 0) > 0 and (shares["other"] or 0) > 0


def test_a_replica_still_loading_its_first_weights_is_not_off_them() -> None:
    """A replica publishes before its first load ends (no version yet): it serves nothing, so
    it is not a replica left on other weights (a new deployment would otherwise breach its
    state_divergence objective in its first second); one on another version still is."""
    from serving.ops.health.signals import slot_signals
    from serving.slo.counts import Counts

    def replica(name: str, version: str) -> dict[str, Any]:
        return {"replica": name, "version": version, "kv": {}, "totals": {}, "signals": {}}

    def score(*replicas: dict[str, Any]) -> Any:
        observed, _, _ = slot_signals(
            now=1000.0, dep_id=1, tenant_id=1, group="stable", version="m:v1",
            replicas=list(replicas), delta=Counts(), routers=[], gpu=[], consistency=None,
            reported={}, critical=None, state=None,
        )  # fmt: skip
        return observed["divergence"]

    assert score(replica("r-1", "m:v1"), replica("r-2", ""))["score"] == 0.0
    assert score(replica("r-1", ""))["score"] is None
    left = score(replica("r-1", "m:v1"), replica("r-2", "m:v0"))
    assert left["score"] > 0 and left["off"] == ["r-2"]


def test_a_slots_points_are_decoded_in_one_call_and_a_bad_one_is_dropped_alone() -> None:
    from serving.ops.health import series as series_cache

    names = ["1:stable", "1:canary", "2:stable"]
    read = [
        b"0:0 {}", [b'{"t":2.0,"req":3}', b'{"t":1.0,"req":1}'],  # newest first, as LRANGE
        None, [b'{"t":3}', b"not json", b'{"t":2},{"t":9}', b"[1]", b'{"t":"x"}', b'{"t":1}'],
        None, None,  # its state said not yet: no points read
    ]  # fmt: skip
    out = series_cache.parse_read(read, names)
    assert out["1:stable"] == ({}, [{"t": 1.0, "req": 1}, {"t": 2.0, "req": 3}])
    # One element holding two points (a comma inside) is not taken as two: it is dropped.
    assert out["1:canary"] == (None, [{"t": 1}, {"t": 3}])
    assert out["2:stable"] == (None, None)
