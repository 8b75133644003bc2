"""Failed hot reloads alert, and a degraded tier is judged against its own SLA, through the real
health tick (PostgreSQL, Redis; the replicas' and routers' snapshots are written to Redis the way
the data plane writes them). The Ray test drives both on replicas: tests/serving/test_tiers_ray.py."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis
from django.conf import settings

from incidents.models import BreachKind, EventKind, Incident, IncidentEvent, SlaBreach
from serving.dataplane.sli import SliRecorder, publish
from serving.deployments import services as deploy
from serving.deployments.models import Deployment
from serving.ops import health
from serving.ops.contracts import contract_set
from serving.ops.health.tier_sla import scaled_contract, scaled_threshold
from serving.slo.parse import parse_contract
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import _ready, _version

pytestmark = pytest.mark.django_db

APP = "acme.assistant"


def _failure(at: float, error: str = "the reload overran its 0.001 s deadline") -> dict[str, Any]:
    return {"artifact": "/a/v3", "version": "m:v3", "error": error, "at": at}


def _publish(deployment: Deployment, group: str, replica: str, **kv: Any) -> None:
    """One replica's snapshot, published with the data plane's own recorder and publish."""
    revision = Deployment.objects.get(pk=deployment.pk).current_revision
    version = revision.stable_version
    recorder = SliRecorder(APP, group, f"{version.model.name}:{version.label}", replica)
    latency_s, requests = float(kv.pop("latency_s", 0.02)), int(kv.pop("requests", 1))
    for _ in range(requests):
        recorder.current.record(latency_s=latency_s, ok=True, tokens_out=4)
    snapshot = recorder.roll(kv={"num_blocks": 64, "free_blocks": 48, **kv})

    async def send() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        await publish(client, settings.SLI_KEY_PREFIX, snapshot)
        await client.aclose()

    asyncio.run(send())


def _forget_memos() -> None:
    """What the tick remembers in Redis is a cache: lose it, the database still decides."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(f"{settings.SLI_KEY_PREFIX}:health:tick-lock:reload-told:*"):
        client.delete(key)


def test_a_failed_reload_alerts_exactly_once_whatever_the_ticks_that_see_it(
    world_a: TenantWorld,
) -> None:
    deployment = _ready(world_a)
    first = time.time() - 5
    standby = {"failures": [_failure(first)]}
    _publish(deployment, "stable", "r1", standby=standby)
    now = time.time()
    report = health.tick(now=now)
    assert [a.get("reload_failed") for a in report["actions"]] == [
        f"reload-failed:stable:r1:{first:.3f}"
    ]
    breach = SlaBreach.objects.get(deployment=deployment, kind=BreachKind.RELOAD)
    assert breach.severity == "ticket" and breach.action == "notify" and breach.group == "stable"
    assert "overran its deadline" in breach.detail and "old weights kept serving" in breach.detail
    assert breach.observed["deadline"] is True and breach.observed["version"] == "m:v3"
    incident = breach.incident
    # More ticks see the same failure (the replica keeps publishing it): nothing new.
    for n in range(1, 4):
        _publish(deployment, "stable", "r1", standby=standby)
        assert not [a for a in health.tick(now=now + 10 * n)["actions"] if "reload_failed" in a]
    _forget_memos()
    incident.status = "resolved"
    incident.save(update_fields=["status"])
    _publish(deployment, "stable", "r1", standby=standby)
    health.tick(now=now + 50)  # the incident is over; the failure is still the same one
    assert SlaBreach.objects.filter(kind=BreachKind.RELOAD).count() == 1
    assert SlaBreach.objects.get(pk=breach.pk).occurrences == 1
    assert Incident.objects.filter(deployment=deployment).count() == 1
    # Another failure (another replica, or later) is another alert.
    second = time.time()
    _publish(deployment, "stable", "r2", standby={"failures": [_failure(second, "disk gone")]})
    report = health.tick(now=now + 60)
    assert [a["reload_failed"] for a in report["actions"] if "reload_failed" in a] == [
        f"reload-failed:stable:r2:{second:.3f}"
    ]
    latest = SlaBreach.objects.filter(kind=BreachKind.RELOAD).latest("id")
    assert "failed (replica r2): disk gone" in latest.detail
    assert IncidentEvent.objects.filter(incident=latest.incident, kind=EventKind.BREACH).exists()


def test_an_unreadable_snapshot_or_failure_is_skipped(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    _publish(deployment, "stable", "r1", standby={"failures": ["x", {"at": "soon"}, None]})
    health.tick(now=time.time())
    assert not SlaBreach.objects.filter(kind=BreachKind.RELOAD).exists()


SLOW_CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: chat-sla
spec:
  window: 30d
  objectives:
    - name: p99
      sli: latency_p99
      threshold_ms: 100
      target: 0.9
  fast:
    - name: slow
      sli: latency_p99
      above_ms: 120
      for: 15s
      min_requests: 5
      action: notify
"""


def test_latency_thresholds_scale_to_the_bounds_the_histogram_can_judge() -> None:
    assert scaled_threshold(100, 1.0) == 100
    assert scaled_threshold(100, 1.8) == 250  # the seed's 180 ms: judged at the 250 ms bound
    assert scaled_threshold(100, 3.0) == 500
    assert scaled_threshold(5000, 10) == 10000  # capped at the last bound
    contract = parse_contract(SLOW_CONTRACT)
    degraded = scaled_contract(contract, 2.5)
    assert degraded.objective("p99").threshold_ms == 250
    assert degraded.fast[0].above_ms == pytest.approx(300)
    assert contract.objective("p99").threshold_ms == 100  # the contract itself is unchanged


def _router(tier: str) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    state = {"app": APP, "replica": "router-1", "at": time.time(), "tier": {"tier": tier}}
    client.hset(f"{settings.SLI_KEY_PREFIX}:router:{APP}", "router-1", json.dumps(state))


def test_a_degraded_slot_is_judged_against_its_tiers_sla(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    small = _version(world_a, "small")
    deploy.deployment_change(
        tenant=world_a.tenant,
        actor=actor,
        deployment=deployment,
        changes={
            "tiers": {
                "levels": [{"name": "distilled", "version_id": small.pk, "sla_latency_scale": 2.5}]
            }
        },
        reason="a distilled tier with a looser SLA",
    )
    contract_set(tenant=world_a.tenant, actor=actor, deployment=deployment, source=SLOW_CONTRACT)
    now = time.time()
    _router("distilled")  # the router serves the distilled tier: p99 <= 300 ms holds
    _publish(deployment, "stable", "r1", latency_s=0.15, requests=20)
    report = health.tick(now=now, act=False)
    info = json.loads(
        redis.Redis.from_url(settings.REDIS_URL).hget(
            f"{settings.SLI_KEY_PREFIX}:health:deployments", str(deployment.pk)
        )
        or "{}"
    )
    assert report["firing"] == 0, info
    _router("full")  # back on the full tier: the contract as written, 150 ms is too slow
    _publish(deployment, "stable", "r1", latency_s=0.15, requests=20)
    report = health.tick(now=now + 30, act=False)
    assert report["firing"] >= 1
