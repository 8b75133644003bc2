"""Signals around an incident, computed from stored SLI samples, breaches, rollouts and
reconcile runs, and the hints they lead to."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from incidents import selectors
from incidents.rca.evidence import incident_signals
from serving.deployments.models import DeploymentRevision, ReconcileRun
from serving.ops.models import Rollout
from tests.conftest import TenantWorld
from tests.incidents.factories import breach, deployment_of
from tests.incidents.slis import sample

pytestmark = pytest.mark.django_db


def test_sli_signals_per_group(world_a: TenantWorld) -> None:
    deployment = deployment_of(world_a)
    now = timezone.now()
    _, incident, _ = breach(world_a, detected_at=now - timedelta(minutes=2))
    for minutes in (10, 5, 1):
        end = now - timedelta(minutes=minutes)
        sample(deployment, end, requests=100, errors=1, rejected=5, latency_ms=40)
        sample(deployment, end, group="canary", requests=20, errors=4, latency_ms=900)
    sample(deployment, now - timedelta(minutes=30), requests=999, errors=999)  # outside
    signals = incident_signals(tenant=world_a.tenant, incident=incident)
    assert signals["error_ratio_stable"] == pytest.approx(3 / 300)
    assert signals["error_ratio_canary"] == pytest.approx(12 / 60)
    assert signals["canary_error_ratio_vs_stable"] == pytest.approx(20.0)
    assert signals["latency_p95_ms_stable"] == 50.0  # upper bound of the 40 ms bucket
    assert signals["latency_p95_ms_canary"] == 1000.0
    assert signals["rejected_ratio"] == pytest.approx(15 / 360)
    assert signals["canary_involved"] is False
    assert signals["request_rate_ratio"] < 0.2  # the hour before saw a burst, not this
    assert "kv_usage" not in signals and "gpu_memory_growth_mb_per_min" not in signals


def test_kv_counters_rate_and_memory(world_a: TenantWorld) -> None:
    deployment = deployment_of(world_a)
    now = timezone.now()
    _, incident, _ = breach(world_a, detected_at=now - timedelta(minutes=3))
    # The hour before: 10 requests per 10 s.
    for minutes in range(20, 60, 5):
        sample(deployment, now - timedelta(minutes=minutes), requests=10)
    # The window: 50 requests per 10 s, the cache filling up, preemptions, a restart
    # (its counters reset), GPU memory growing 12 MB a minute.
    kv_series = [
        {"blocks_total": 100, "blocks_used": 60, "preemptions": 5, "replica_restarts": 0, "gpu_memory_mb": 1000},
        {"blocks_total": 100, "blocks_used": 90, "preemptions": 9, "replica_restarts": 1, "gpu_memory_mb": 1012},
        {"blocks_total": 100, "blocks_used": 98, "preemptions": 2, "replica_restarts": 2, "gpu_memory_mb": 1024, "fragmentation": 0.3},
        {"blocks_total": 100, "blocks_used": 97, "preemptions": 6, "replica_restarts": 3, "gpu_memory_mb": 1036},
    ]  # fmt: skip
    for offset, kv in zip((4, 3, 2, 1), kv_series, strict=True):
        sample(deployment, now - timedelta(minutes=offset), requests=50, kv=kv)
    signals = incident_signals(tenant=world_a.tenant, incident=incident)
    assert signals["kv_usage"] == pytest.approx(0.98)
    assert signals["preemptions"] == 4 + 4  # positive steps only: 5->9, (reset) 2->6
    assert signals["replica_restarts"] == 3
    assert signals["fragmentation"] == 0.3
    assert signals["gpu_memory_growth_mb_per_min"] == pytest.approx(12.0)
    assert signals["request_rate_ratio"] == pytest.approx(5.0)
    _, hints = selectors.incident_hints(tenant=world_a.tenant, incident=incident)
    causes = [h.cause for h in hints]
    assert causes[0] == "KV cache exhausted"
    assert {"Replica crash loop", "GPU memory leak", "Input flood"} <= set(causes)


def test_minute_samples_stand_in_when_raw_ticks_are_gone(world_a: TenantWorld) -> None:
    deployment = deployment_of(world_a)
    now = timezone.now()
    _, incident, _ = breach(world_a, detected_at=now - timedelta(minutes=2))
    sample(
        deployment, now - timedelta(minutes=1), seconds=60, requests=600, errors=60, resolution=60
    )
    signals = incident_signals(tenant=world_a.tenant, incident=incident)
    assert signals["error_ratio_stable"] == pytest.approx(0.1)


def test_canary_involvement_and_reconcile_runs(world_a: TenantWorld) -> None:
    now = timezone.now()
    _, incident, _ = breach(world_a, group="canary", detected_at=now - timedelta(minutes=1))
    for duration, ok in ((200.0, True), (300.0, True), (9000.0, False), (250.0, True)):
        ReconcileRun.objects.create(
            started_at=now - timedelta(minutes=2), finished_at=now, ok=ok, duration_ms=duration
        )
    ReconcileRun.objects.create(started_at=now - timedelta(hours=2), ok=False, duration_ms=1)
    signals = incident_signals(tenant=world_a.tenant, incident=incident)
    assert signals["canary_involved"] is True
    assert signals["reconcile_p95_ms"] == 9000.0
    assert signals["reconcile_failures"] == 1.0
    _, hints = selectors.incident_hints(tenant=world_a.tenant, incident=incident)
    assert {"Canary regression", "Control-plane delay"} <= {h.cause for h in hints}


def test_an_active_rollout_makes_the_canary_involved(world_a: TenantWorld) -> None:
    deployment = deployment_of(world_a)
    _, incident, _ = breach(world_a)
    revision = DeploymentRevision.objects.filter(deployment=deployment).first()
    assert revision is not None
    Rollout.objects.create(
        tenant=world_a.tenant, deployment=deployment, canary_version=revision.stable_version,
        base_revision=revision, started_at=timezone.now() - timedelta(minutes=30),
    )  # fmt: skip
    assert incident_signals(tenant=world_a.tenant, incident=incident)["canary_involved"] is True


def test_the_tenants_rules_join_the_hints(world_a: TenantWorld) -> None:
    from incidents import services
    from tenants.actors import Actor

    deployment = deployment_of(world_a)
    now = timezone.now()
    _, incident, _ = breach(world_a, detected_at=now - timedelta(minutes=1))
    sample(deployment, now, requests=100, errors=30)
    services.cause_rule_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), symptom="error_ratio_stable",
        op="gte", threshold=0.25, cause="Upstream feature store down", fix="check the store",
        weight=6,
    )  # fmt: skip
    services.cause_rule_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), symptom="error_ratio_stable",
        op="gte", threshold=0.1, cause="Never shown", is_active=False,
    )  # fmt: skip
    _, hints = selectors.incident_hints(tenant=world_a.tenant, incident=incident)
    assert [h.cause for h in hints] == ["Upstream feature store down"]
    assert hints[0].evidence == ["error_ratio_stable = 0.3 >= 0.25"]


def test_nothing_measured_leaves_the_signals_out(world_a: TenantWorld) -> None:
    _, incident, _ = breach(world_a)
    assert incident_signals(tenant=world_a.tenant, incident=incident) == {"canary_involved": False}
    assert selectors.incident_hints(tenant=world_a.tenant, incident=incident)[1] == []
