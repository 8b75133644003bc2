"""/metrics built with prometheus_client: the whole scrape parses with prometheus_client's own
parser and every family is typed; after rows are made the way the portal makes them (replicas
publish SLIs, the health tick evaluates a contract, a breach rolls the canary back, a
reconcile fails against an unreachable Serve, tasks wait in the broker, requests are served),
each family shows them. Sources are read at scrape time from Redis and the database, so the
numbers do not depend on which process answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
import yaml
from django.conf import settings
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from portal import http_metrics
from portal.celery import QUEUES, app
from serving.control.cluster import RayTarget
from serving.control.serve_api import ServeApiError
from serving.deployments import reconcile as control
from serving.deployments import services as deploy
from serving.deployments.models import Deployment, DeploymentStatus, ReconcileRun
from serving.ops import health
from serving.ops.contracts import contract_set
from serving.ops.models import Rollback, RollbackStatus
from serving.registry.tasks import validate_version
from serving.slo.rules import SLI_HISTOGRAMS, le_label
from serving.telemetry import metrics
from serving.telemetry.metrics_ops import CeleryQueueCollector, HealthTickCollector, queue_keys
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import Replica, _ready, _version, applied  # noqa: F401
from tests.slo.test_rules import check_rule_file, selectors

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-token"
CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: chat-sla
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
    - name: fast-answers
      sli: latency_p95
      threshold_ms: 250
      target: 0.95
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.1
      for: 15s
      min_requests: 10
      action: rollback
"""
NOWHERE = RayTarget(
    address="127.0.0.1:1", dashboard_url="http://127.0.0.1:1", serve_url="http://127.0.0.1:1",
    token="x",
)  # fmt: skip
NEW_FAMILIES = {
    "portal_sli_requests": "counter",
    "portal_sli_errors": "counter",
    "portal_sli_rejected": "counter",
    "portal_sli_prompt_tokens": "counter",
    "portal_sli_generation_tokens": "counter",
    "portal_sli_latency_seconds": "histogram",
    "portal_sli_ttft_seconds": "histogram",
    "portal_sli_itl_seconds": "histogram",
    "portal_slo_burn_rate": "gauge",
    "portal_slo_error_budget_remaining_ratio": "gauge",
    "portal_slo_objective_met": "gauge",
    "portal_slo_alerts_firing": "gauge",
    "portal_slo_evaluation_timestamp_seconds": "gauge",
    "portal_rollbacks": "counter",
    "portal_rollbacks_finished": "counter",
    "portal_rollbacks_in_progress": "gauge",
    "portal_rollback_duration_seconds": "histogram",
    "portal_reconciles": "counter",
    "portal_reconcile_duration_seconds": "histogram",
    "portal_reconcile_last_finished_timestamp_seconds": "gauge",
    "portal_health_tick_duration_seconds": "histogram",
    "portal_health_ticks_skipped": "counter",
    "portal_health_tick_last_duration_seconds": "gauge",
    "portal_health_tick_last_timestamp_seconds": "gauge",
    "portal_celery_queue_length": "gauge",
    "portal_http_requests": "counter",
    "portal_http_request_duration_seconds": "histogram",
    "portal_metrics_source_up": "gauge",
}


@pytest.fixture
def broker() -> Iterator[Any]:
    """The broker's Redis; the queues the test filled are emptied after it."""
    client = redis.Redis.from_url(app.conf.broker_url)
    options = dict(app.conf.broker_transport_options or {})
    keys = [key for queue in QUEUES for key in queue_keys(queue, options)]
    client.delete(*keys)
    yield client
    client.delete(*keys)


def scrape(client: Client | None = None) -> dict[str, Any]:
    """/metrics parsed whole by prometheus_client's parser: family name -> family."""
    with override_settings(METRICS_TOKEN=TOKEN):
        response = (client or Client()).get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    families = list(text_string_to_metric_families(response.content.decode()))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "a family is exposed twice"
    return {f.name: f for f in families}


def samples(family: Any, name: str | None = None, **labels: str) -> list[Sample]:
    return [
        s
        for s in family.samples
        if (name is None or s.name == name) and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def value(family: Any, name: str | None = None, **labels: str) -> float:
    [found] = samples(family, name, **labels)
    return float(found.value)


def buckets(family: Any, **labels: str) -> list[tuple[str, float]]:
    return [(s.labels["le"], s.value) for s in samples(family, family.name + "_bucket", **labels)]


def test_the_whole_scrape_parses_every_family_is_typed_and_shows_the_portals_work(
    world_a: TenantWorld,
    world_b: TenantWorld,
    applied: list[int],  # noqa: F811 (the fixture: a rollback's reconcile, no Ray here)
    broker: Any,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    contract_set(tenant=world_a.tenant, actor=actor, deployment=deployment, source=CONTRACT)
    v2 = _version(world_a, "v2")
    deploy.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    Replica(deployment, "stable", "s1").serve(ok=80, latency_s=0.02)
    Replica(deployment, "canary", "c1").serve(ok=14, failed=6, latency_s=0.4)
    with django_capture_on_commit_callbacks(execute=True):
        report = health.tick(now=time.time())
    assert report["firing"] >= 1, report
    rollback = Rollback.objects.get(tenant=world_a.tenant)
    assert rollback.status == RollbackStatus.DONE and rollback.trigger == "breach"
    with pytest.raises(ServeApiError):  # a real reconcile, against a Serve that is not there
        control.reconcile(target=NOWHERE)
    # An applied reconcile needs a Serve: that row is made directly, as the reconcile writes it.
    now = timezone.now()
    ReconcileRun.objects.create(
        started_at=now - timedelta(seconds=2), finished_at=now, ok=True, duration_ms=700.0
    )
    # Two validations wait for a worker (eager mode off: they are published to the broker).
    with monkeypatch.context() as patch:
        patch.setitem(app.conf, "task_always_eager", False)
        validate_version.apply_async(args=[0])
        validate_version.apply_async(args=[0], priority=6)
    http = world_a.client()
    assert http.get("/api/v1/deployments/").status_code == 200
    assert http.get("/api/v1/deployments/999999/").status_code == 404
    assert Client().get("/no/such/page/ever").status_code == 404

    families = scrape()

    for name, family in families.items():
        assert family.type not in ("unknown", "untyped"), name
        assert family.documentation, name
    for name, kind in NEW_FAMILIES.items():
        assert families[name].type == kind, name
    assert all(s.value == 1 for s in families["portal_metrics_source_up"].samples)
    assert {s.labels["source"] for s in families["portal_metrics_source_up"].samples} == {
        "gpu", "engine", "slo", "rollbacks", "reconciles", "health_tick", "celery", "http"}  # fmt: skip

    # SLIs: the slots' cumulative counts, as the tick evaluated them.
    stable = {"tenant": "acme", "deployment": "assistant", "slot": "stable"}
    canary = {**stable, "slot": "canary"}
    assert value(families["portal_sli_requests"], **stable) == 80
    assert value(families["portal_sli_requests"], **canary) == 20
    assert value(families["portal_sli_errors"], **canary) == 6
    assert value(families["portal_sli_rejected"], **canary) == 0
    assert value(families["portal_sli_generation_tokens"], **stable) == 80 * 4
    latency = families["portal_sli_latency_seconds"]
    canary_buckets = buckets(latency, **canary)
    assert [le for le, _ in canary_buckets][-1] == "+Inf"
    assert dict(canary_buckets)[le_label(250)] == 0 and dict(canary_buckets)["+Inf"] == 20
    assert dict(buckets(latency, **stable))[le_label(25)] == 80  # 20 ms answers
    counts = [v for _, v in canary_buckets]
    assert counts == sorted(counts), "buckets are cumulative"
    # Deployments without traffic are there too (another tenant's), never a deleted one.
    assert value(families["portal_sli_requests"], tenant="globex", slot="stable") == 0

    # SLO state: the canary burnt its budgets (30% errors against 1%; every answer slow).
    burn = families["portal_slo_burn_rate"]
    assert value(burn, **canary, slo="availability", window="5m") == pytest.approx(30.0)
    assert value(burn, **canary, slo="fast-answers", window="1h") == pytest.approx(20.0)
    assert value(burn, **stable, slo="availability", window="1h") == 0
    budget = families["portal_slo_error_budget_remaining_ratio"]
    assert value(budget, **canary, slo="availability") < 0
    assert value(budget, **stable, slo="availability") == 1
    met = families["portal_slo_objective_met"]
    assert value(met, **canary, slo="availability") == 0
    assert value(met, **stable, slo="fast-answers") == 1
    firing = families["portal_slo_alerts_firing"]
    page = samples(firing, **canary, slo="availability", kind="burn", severity="page")
    assert page and all(s.labels["action"] == "rollback" for s in page)
    assert value(firing, **canary, slo="error-spike", kind="fast") == 1
    assert not samples(firing, **stable)
    checked = value(families["portal_slo_evaluation_timestamp_seconds"], tenant="acme")
    assert time.time() - 60 < checked <= time.time()

    # Rollbacks and reconciles: counted from their rows.
    mine = {"tenant": "acme", "deployment": "assistant"}
    assert value(families["portal_rollbacks"], **mine, trigger="breach") == 1
    assert value(families["portal_rollbacks_finished"], **mine, outcome="done") == 1
    assert not samples(families["portal_rollbacks_in_progress"], **mine)
    took = families["portal_rollback_duration_seconds"]
    assert value(took, "portal_rollback_duration_seconds_count", tenant="acme") == 1
    seconds = (rollback.finished_at - rollback.detected_at).total_seconds()
    assert value(took, "portal_rollback_duration_seconds_sum", tenant="acme") == pytest.approx(
        seconds
    )
    reconciles = families["portal_reconciles"]
    assert value(reconciles, outcome="failed") == 1 and value(reconciles, outcome="applied") == 1
    run_took = families["portal_reconcile_duration_seconds"]
    assert dict(buckets(run_took, outcome="applied"))["0.5"] == 0
    assert dict(buckets(run_took, outcome="applied"))["1.0"] == 1
    assert value(run_took, "portal_reconcile_duration_seconds_sum", outcome="applied") == 0.7

    # The health tick's duration, recorded by the tick itself.
    tick = families["portal_health_tick_duration_seconds"]
    assert value(tick, "portal_health_tick_duration_seconds_count") == 1
    assert value(tick, "portal_health_tick_duration_seconds_sum") == pytest.approx(
        report["duration_ms"] / 1000, abs=1e-3
    )
    assert value(families["portal_health_tick_last_duration_seconds"]) > 0

    # The broker's queues: both messages wait in `validation` (two priority lists).
    queues = families["portal_celery_queue_length"]
    assert {s.labels["queue"] for s in queues.samples} == set(QUEUES)
    assert value(queues, queue="validation") == 2 and value(queues, queue="chaos") == 0

    # HTTP requests: route names and status classes, never a raw path.
    requests = families["portal_http_requests"]
    assert value(requests, method="GET", route="deployment-list", status="2xx") >= 1
    assert value(requests, method="GET", route="deployment-detail", status="4xx") >= 1
    assert value(requests, method="GET", route="unmatched", status="4xx") >= 1
    routes = {s.labels["route"] for s in requests.samples}
    assert not any("/" in route for route in routes), routes
    durations = families["portal_http_request_duration_seconds"]
    assert value(
        durations, "portal_http_request_duration_seconds_count", route="deployment-list",
        method="GET", status="2xx",
    ) == value(requests, method="GET", route="deployment-list", status="2xx")  # fmt: skip


def test_the_contracts_rules_read_only_series_this_scrape_exports(world_a: TenantWorld) -> None:
    """The rules of /metrics/rules work against /metrics: every series an expression reads
    is a family of the scrape (or a rule's own recording), with labels the scrape carries."""
    deployment = _ready(world_a)
    contract_set(tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
                 source=CONTRACT)  # fmt: skip
    Replica(deployment, "stable", "s1").serve(ok=5)
    health.tick(now=time.time(), act=False)
    families = scrape()
    exposed = {s.name: set(s.labels) for f in families.values() for s in f.samples}
    with override_settings(METRICS_TOKEN=TOKEN):
        text = Client().get("/metrics/rules", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content
    rules = check_rule_file(yaml.safe_load(text))
    recorded = {r["record"] for r in rules if "record" in r}
    read = {s.name for r in rules for s in selectors(r["expr"])}
    assert read - recorded, "the rules read the exported SLI series"
    for name in read - recorded:
        assert name in exposed, f"{name} is read by a rule but not on /metrics"
        assert {"tenant", "deployment", "slot"} <= exposed[name], name
    assert {f"{family}_bucket" for family in SLI_HISTOGRAMS.values()} & read


def test_a_source_that_cannot_be_read_leaves_the_rest_of_the_scrape(world_a: TenantWorld) -> None:
    away = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    registry = metrics.build_registry(
        {"health_tick": HealthTickCollector(away), "celery": CeleryQueueCollector(away),
         "reconciles": metrics.sources()["reconciles"]}
    )  # fmt: skip
    from prometheus_client import generate_latest

    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    up = {s.labels["source"]: s.value for s in families["portal_metrics_source_up"].samples}
    assert up == {"health_tick": 0.0, "celery": 0.0, "reconciles": 1.0}
    assert "portal_health_tick_duration_seconds" not in families
    assert "portal_reconciles" in families


def test_http_labels_stay_bounded(world_a: TenantWorld) -> None:
    http = world_a.client()
    for pk in range(900001, 900006):  # five paths, one route
        assert http.get(f"/api/v1/deployments/{pk}/").status_code == 404
    Client().generic("BREW", "/api/v1/deployments/")
    http_metrics.flush(force=True)
    totals = http_metrics.http_totals()
    assert totals[("GET", "deployment-detail", "4xx")].count == 5
    assert any(method == "OTHER" for method, _, _ in totals)
    assert all("/" not in route and str(pk) not in route for _, route, _ in totals for pk in
               range(900001, 900006))  # fmt: skip


def test_http_counts_wait_in_the_process_while_redis_is_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    http_metrics.flush(force=True)
    before = http_metrics.http_totals().get(("GET", "livez", "2xx"))
    monkeypatch.setattr(settings, "REDIS_URL", "redis://127.0.0.1:1/0")
    assert Client().get("/livez").status_code == 200  # the request does not fail
    assert http_metrics.flush(force=True) is False  # Redis refused: kept here
    monkeypatch.undo()
    assert http_metrics.flush(force=True) is True
    after = http_metrics.http_totals()[("GET", "livez", "2xx")]
    assert after.count == (before.count if before else 0) + 1


def test_metrics_need_the_token() -> None:
    client = Client()
    with override_settings(METRICS_TOKEN=""):
        assert client.get("/metrics").status_code == 404
    with override_settings(METRICS_TOKEN=TOKEN):
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
        assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405
