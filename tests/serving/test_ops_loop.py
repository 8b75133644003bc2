"""The ops loop without Ray: the health tick turns the replicas' published counters (written by
the data plane's own SliRecorder + publish into the real Redis) into stored SLI windows,
evaluates them against the contract, and a breach opens one incident and one rollback."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection

from serving.dataplane.sli import SliRecorder, publish
from serving.deployments import services as deploy
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import health, rollbacks, rollouts
from serving.ops.contracts import contract_set
from serving.ops.models import (
    Resolution,
    Rollback,
    RollbackStatus,
    Rollout,
    RolloutStatus,
    SliSample,
)
from serving.registry import services as registry
from tenants.actors import Actor
from tests.conftest import TenantWorld, world_checkpoint

pytestmark = pytest.mark.django_db

FAST_CONTRACT = """\
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
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.1
      for: 15s
      min_requests: 10
      action: rollback
"""


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Reconciles the rollback asked for (no Ray here): the revision each one saw as current."""
    seen: list[int] = []

    def apply() -> None:
        seen.append(
            Deployment.objects.get(name="assistant", tenant__slug="acme").current_revision.number
        )

    monkeypatch.setattr(rollbacks, "_apply", apply)
    return seen


def _ready(world: TenantWorld) -> Deployment:
    registry.version_validate(tenant=world.tenant, version_id=world.version.pk)
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    deployment.refresh_from_db()
    return deployment


def _version(world: TenantWorld, label: str) -> Any:
    version = registry.version_register_path(
        tenant=world.tenant, actor=Actor(user=world.owner), model=world.model, label=label,
        path=str(world_checkpoint()),
    )  # fmt: skip
    return registry.version_validate(tenant=world.tenant, version_id=version.pk) or version


class Replica:
    """One replica's SLI recorder, published to the real Redis exactly as in Ray."""

    def __init__(self, deployment: Deployment, group: str, name: str) -> None:
        app = f"{deployment.tenant.slug}.{deployment.name}"
        revision = Deployment.objects.get(pk=deployment.pk).current_revision
        version = revision.canary_version if group == "canary" else revision.stable_version
        # The label a version replica publishes once its weights are loaded.
        self.recorder = SliRecorder(app, group, f"{version.model.name}:{version.label}", name)

    def serve(self, ok: int, failed: int = 0, latency_s: float = 0.02) -> None:
        for _ in range(ok):
            self.recorder.current.record(latency_s=latency_s, ok=True, tokens_out=4)
        for _ in range(failed):
            self.recorder.current.record(latency_s=latency_s, ok=False)
        snapshot = self.recorder.roll(kv={"num_blocks": 64, "free_blocks": 48})

        async def send() -> None:
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(settings.REDIS_URL)
            await publish(client, settings.SLI_KEY_PREFIX, snapshot)
            await client.aclose()

        asyncio.run(send())


def test_tick_stores_counter_deltas_whatever_its_interval(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    replica = Replica(deployment, "stable", "r1")
    replica.serve(ok=8, failed=2)
    now = time.time()
    report = health.tick(now=now, act=False)
    assert report["slots"] == 1 and report["rows"] >= 1
    first = SliSample.objects.get(deployment=deployment, resolution=Resolution.RAW)
    assert (first.requests, first.errors) == (10, 2)
    # Three publishes between two ticks: nothing is lost, nothing counted twice.
    for _ in range(3):
        replica.serve(ok=5)
    health.tick(now=now + 2, act=False)
    rows = list(SliSample.objects.filter(deployment=deployment, resolution=Resolution.RAW)
                .order_by("end"))  # fmt: skip
    assert [r.requests for r in rows] == [10, 15]
    assert rows[-1].cumulative["requests"] == 25 and rows[-1].cumulative["errors"] == 2
    assert rows[-1].kv["blocks_used"] == 16
    # A new replica (a restart) counts from zero; the old one's disappearance is recorded.
    Replica(deployment, "stable", "r2").serve(ok=3)
    redis.Redis.from_url(settings.REDIS_URL).hdel(
        f"{settings.SLI_KEY_PREFIX}:sli:acme.assistant:stable", "r1"
    )
    health.tick(now=now + 4, act=False)
    last = SliSample.objects.filter(deployment=deployment, resolution=Resolution.RAW).latest("end")
    assert last.requests == 3 and last.kv["replica_restarts"] == 1
    # Crossing a minute boundary writes a minute row with the minute's counts. (The next
    # minute's first second, unless that is under a tick interval after the last tick: then
    # the slot is not due, and a start 55.25-56 s into a minute crossed nowhere; CI saw it.)
    health.tick(now=max(now - now % 60 + 61, now + 6), act=False)
    assert SliSample.objects.filter(deployment=deployment, resolution=Resolution.MINUTE).exists()


def test_health_interval_is_per_deployment(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    Deployment.objects.filter(pk=deployment.pk).update(health_interval_s=10)
    Replica(deployment, "stable", "r1").serve(ok=1)
    now = time.time()
    assert health.tick(now=now, act=False)["due"] == 1
    assert health.tick(now=now + 2, act=False)["due"] == 0
    assert health.tick(now=now + 10, act=False)["due"] == 1


def test_a_canary_in_flight_is_checked_every_canary_interval(
    world_a: TenantWorld, world_b: TenantWorld, settings: Any
) -> None:
    """The beat ticks every second; a deployment with a canary is due at each tick (its
    rollback waits on the tick that sees the breach), a stable-only neighbour at its own 2 s."""
    settings.HEALTH_CANARY_INTERVAL_S = 1.0
    deployment, neighbour = _ready(world_a), _ready(world_b)
    actor = Actor(user=world_a.owner)
    v2 = _version(world_a, "v2")
    deploy.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    canary = Replica(deployment, "canary", "c1")
    ids = [deployment.pk, neighbour.pk]
    now = time.time()
    due = []
    for step in range(5):
        canary.serve(ok=2)
        due.append(health.tick(now=now + step, act=False, deployment_ids=ids)["due"])
    assert due == [2, 1, 2, 1, 2]
    rows = SliSample.objects.filter(
        deployment=deployment, group="canary", resolution=Resolution.RAW
    )
    assert [round(r.end.timestamp() - r.start.timestamp(), 2) for r in rows.order_by("end")][1:] == [
        1.0, 1.0, 1.0, 1.0
    ]  # fmt: skip
    # Its own interval when that is the shorter one.
    settings.HEALTH_CANARY_INTERVAL_S = 10.0
    assert health.tick(now=now + 5, act=False, deployment_ids=ids)["due"] == 0
    assert health.tick(now=now + 6, act=False, deployment_ids=ids)["due"] == 2


def test_a_canary_interval_out_of_bounds_is_refused_by_name(tmp_path: Path) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings",
           "PORTAL_DATA_DIR": str(tmp_path), "HEALTH_CANARY_INTERVAL_S": "0"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], cwd=Path(__file__).parents[2],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and "HEALTH_CANARY_INTERVAL_S: give seconds" in done.stderr


def test_a_failing_canary_opens_one_incident_and_one_rollback(
    world_a: TenantWorld, applied: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    from incidents.models import Incident

    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    contract_set(tenant=world_a.tenant, actor=actor, deployment=deployment, source=FAST_CONTRACT)
    v2 = _version(world_a, "v2")
    canary_revision = deploy.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    stable, canary = Replica(deployment, "stable", "s1"), Replica(deployment, "canary", "c1")
    now = time.time()
    stable.serve(ok=80)
    canary.serve(ok=14, failed=6)  # 30% of the canary's requests fail
    with django_capture_on_commit_callbacks(execute=True):
        report = health.tick(now=now)
    assert report["firing"] >= 1, report
    [action] = [a for a in report["actions"] if a.get("rollback")]
    rollback = Rollback.objects.get(pk=action["rollback"])
    assert rollback.status == RollbackStatus.DONE, rollback.error
    assert rollback.from_revision == canary_revision
    assert rollback.trigger == "breach" and "error" in rollback.reason
    assert rollback.detected_at <= rollback.started_at <= rollback.traffic_switched_at
    assert rollback.traffic_switched_at <= rollback.finished_at
    deployment.refresh_from_db()
    current = deployment.current_revision
    assert current == rollback.new_revision and applied == [current.number]
    assert current.canary_version_id is None and current.canary_percent == 0
    assert current.stable_version_id == canary_revision.stable_version_id
    incident = Incident.objects.get(tenant=world_a.tenant, deployment=deployment)
    assert incident.rollback == rollback and incident.status == "mitigated"
    kinds = list(incident.events.order_by("at", "pk").values_list("kind", flat=True))
    assert kinds[0] == "breach" and "rollback_started" in kinds and "rollback_finished" in kinds
    # The breach goes on (the canary's window still shows it): still one incident, one rollback.
    canary.serve(ok=1, failed=5)
    with django_capture_on_commit_callbacks(execute=True):
        health.tick(now=now + 2)
    assert Incident.objects.filter(tenant=world_a.tenant).count() == 1
    assert Rollback.objects.filter(tenant=world_a.tenant).count() == 1
    # The same version as canary again, healthy this time: its windows start from zero, the
    # failed episode's errors are not held against it.
    canary.serve(ok=0)  # the old replica lingers in the hash (same version label)
    deploy.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    Replica(deployment, "canary", "c2").serve(ok=20)
    stable.serve(ok=80)
    with django_capture_on_commit_callbacks(execute=True):
        again = health.tick(now=now + 4)
    assert again["firing"] == 0, again
    assert Rollback.objects.filter(tenant=world_a.tenant).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_triggers_make_one_rollback(world_a: TenantWorld, applied: list[int]) -> None:
    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    v2 = _version(world_a, "v2")
    deploy.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    results: list[tuple[int, bool]] = []
    barrier = threading.Barrier(2)

    def trigger() -> None:
        try:
            barrier.wait()
            rollback, created = rollbacks.rollback_request(
                tenant=world_a.tenant, deployment=deployment, trigger="breach", reason="race"
            )
            results.append((rollback.pk, created))
        finally:
            connection.close()

    threads = [threading.Thread(target=trigger) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({pk for pk, _ in results}) == 1
    assert sorted(created for _, created in results) == [False, True]
    assert Rollback.objects.filter(deployment=deployment).count() == 1
    assert len(applied) == 1


def test_a_rollback_killed_mid_way_resumes_without_a_second_revision(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    v2 = _version(world_a, "v2")
    deploy.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )

    def dies() -> None:
        raise KeyboardInterrupt("worker killed between the revision and the reconcile")

    monkeypatch.setattr(rollbacks, "_apply", dies)
    rollback, _ = rollbacks.rollback_request(
        tenant=world_a.tenant, deployment=deployment, trigger="breach", reason="x"
    )
    with pytest.raises(KeyboardInterrupt):
        rollbacks.rollback_execute(rollback_id=rollback.pk)
    rollback = Rollback.objects.get(deployment=deployment)
    assert rollback.status == RollbackStatus.SWITCHING and rollback.new_revision is not None
    revisions = deployment.revisions.count()
    monkeypatch.setattr(rollbacks, "_apply", lambda: None)
    assert rollback.pk in rollbacks.rollbacks_stuck(older_than_s=0)
    done = rollbacks.rollback_execute(rollback_id=rollback.pk)
    assert done is not None and done.status == RollbackStatus.DONE
    assert deployment.revisions.count() == revisions  # no second revision
    assert rollbacks.rollback_execute(rollback_id=rollback.pk).status == RollbackStatus.DONE


def test_roll_back_to_previous_after_promotion_is_one_call(
    world_a: TenantWorld, applied: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    deployment = _ready(world_a)
    v1 = deployment.current_revision.stable_version_id
    actor = Actor(user=world_a.owner)
    v2 = _version(world_a, "v2")
    deploy.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    deploy.deployment_promote(tenant=world_a.tenant, actor=actor, deployment=deployment)
    client = world_a.client()
    url = f"/api/v1/deployments/{deployment.pk}/rollbacks/"
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, {}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["to_revision"] == 1
    assert Rollback.objects.get(pk=response.json()["id"]).status == RollbackStatus.DONE
    deployment.refresh_from_db()
    assert deployment.current_revision.stable_version_id == v1
    # Nothing earlier to go back to now but v2... and v2 is where we came from: one more works.
    with django_capture_on_commit_callbacks(execute=True):
        again = client.post(url, {}, format="json")
    assert again.status_code == 201 and again.json()["to_revision"] == 3
    listed = client.get(f"/api/v1/deployments/{deployment.pk}/rollbacks/").json()
    assert [r["trigger"] for r in listed] == ["manual", "manual"]


BAD_CONTRACTS = [
    ("syntax", "spec: [unclosed\n", 2, ""),
    ("unknown sli", FAST_CONTRACT.replace("sli: availability", "sli: latency_p42"), 9,
     "spec.objectives[0].sli"),
    ("negative target", FAST_CONTRACT.replace("target: 0.99", "target: -0.5"), 10,
     "spec.objectives[0].target"),
    ("window too short", FAST_CONTRACT.replace("window: 30d", "window: 10m"), 6, "spec.window"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "source", "line", "field"), BAD_CONTRACTS,
                         ids=[c[0] for c in BAD_CONTRACTS])  # fmt: skip
def test_bad_contracts_are_400_naming_line_and_field_and_the_old_one_stays(
    world_a: TenantWorld, case: str, source: str, line: int, field: str
) -> None:
    deployment = _ready(world_a)
    client = world_a.client()
    url = f"/api/v1/deployments/{deployment.pk}/contract/"
    assert client.put(url, {"source": FAST_CONTRACT}, format="json").status_code == 200
    response = client.put(url, {"source": source}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    messages = error["fields"].get(field or "document") or []
    assert any(m.startswith(f"line {line}:") for m in messages), error
    current = client.get(url).json()
    assert current["version"] == 1 and current["source"] == FAST_CONTRACT


def test_a_good_canary_is_promoted_through_its_steps(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    v2 = _version(world_a, "v2")
    rollouts.policy_set(
        tenant=world_a.tenant, actor=actor, deployment=deployment,
        values={"steps": [{"weight": 20, "pause_s": 0}, {"weight": 50, "pause_s": 0}],
                "analysis_interval_s": 1, "min_requests": 10},
    )  # fmt: skip
    rollout = rollouts.rollout_start(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk
    )
    Deployment.objects.filter(pk=deployment.pk).update(health_interval_s=1)
    stable, canary = Replica(deployment, "stable", "s1"), Replica(deployment, "canary", "c1")
    weights = []
    for _ in range(8):
        stable.serve(ok=40)
        canary.serve(ok=20)
        health.tick()
        rollout.refresh_from_db()
        deployment.refresh_from_db()
        weights.append(deployment.current_revision.canary_percent)
        if rollout.status != RolloutStatus.PROGRESSING:
            break
        time.sleep(1.05)
    assert rollout.status == RolloutStatus.SUCCESSFUL, (rollout.message, weights)
    assert 50 in weights
    assert deployment.current_revision.stable_version_id == v2.pk
    assert deployment.current_revision.canary_version_id is None
    assert [a.result for a in rollout.analyses.order_by("at")][-1] == "successful"


def test_inconclusive_analysis_pauses_for_a_human(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    v2 = _version(world_a, "v2")
    rollouts.policy_set(
        tenant=world_a.tenant, actor=actor, deployment=deployment,
        values={"steps": [{"weight": 20, "pause_s": 0}], "analysis_interval_s": 1,
                "min_requests": 50},
    )  # fmt: skip
    rollout = rollouts.rollout_start(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk
    )
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    Replica(deployment, "canary", "c1").serve(ok=3)  # far fewer than min_requests
    health.tick()
    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.PAUSED and "inconclusive" in rollout.message
    assert Rollout.objects.get(pk=rollout.pk).analyses.get().result == "inconclusive"


def test_a_canary_nobody_can_measure_fails_after_the_consecutive_error_limit(
    world_a: TenantWorld, applied: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    v2 = _version(world_a, "v2")
    rollouts.policy_set(
        tenant=world_a.tenant, actor=actor, deployment=deployment,
        values={"steps": [{"weight": 20, "pause_s": 60}], "analysis_interval_s": 1,
                "consecutive_error_limit": 1},
    )  # fmt: skip
    rollout = rollouts.rollout_start(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk
    )
    Deployment.objects.filter(pk=deployment.pk).update(health_interval_s=1)
    stable = Replica(deployment, "stable", "s1")  # no canary replica ever reports
    for _ in range(3):
        stable.serve(ok=10)
        with django_capture_on_commit_callbacks(execute=True):
            health.tick()
        rollout.refresh_from_db()
        if rollout.status != RolloutStatus.PROGRESSING:
            break
        time.sleep(1.05)
    assert rollout.status == RolloutStatus.FAILED, rollout.message
    assert list(rollout.analyses.values_list("result", flat=True)) == ["error", "error"]
    rollback = Rollback.objects.get(deployment=deployment)
    assert rollback.trigger == "analysis" and rollback.status == RollbackStatus.DONE
    assert rollback.to_revision == rollout.base_revision


GATED = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: gated
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
  alerts: []
  gate:
    mode: block
    objectives: [availability]
    min_requests: 10
"""


def test_the_contracts_gate_blocks_promotion_and_names_the_objective(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    contract_set(tenant=world_a.tenant, actor=actor, deployment=deployment, source=GATED)
    v2 = _version(world_a, "v2")
    deploy.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    Replica(deployment, "canary", "c1").serve(ok=15, failed=5)  # 75% good, the gate wants 99%
    health.tick()
    url = f"/api/v1/deployments/{deployment.pk}/promote/"
    refused = world_a.client().post(url, {}, format="json")
    assert refused.status_code == 409, refused.content
    error = refused.json()["error"]
    assert "gate" in error["fields"] and "availability" in error["message"]
    deployment.refresh_from_db()
    assert deployment.current_revision.canary_version_id == v2.pk  # nothing promoted


FEATURES = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: features
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
    - name: prompt-drift
      sli: drift_psi
      feature: prompt_length
      max: 0.2
      reference: {edges: [0, 16, 64, 256], counts: [30, 50, 20]}
    - name: profile-fresh
      sli: feature_freshness
      feature: user_profile
      max_age: 15m
"""


def test_reported_drift_and_stale_features_breach_their_objectives(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    actor = Actor(user=world_a.owner)
    contract_set(tenant=world_a.tenant, actor=actor, deployment=deployment, source=FEATURES)
    client = world_a.client()
    url = f"/api/v1/deployments/{deployment.pk}/features/"
    unknown = client.post(url, {"drift": {"nope": [1, 2, 3]}}, format="json")
    assert unknown.status_code == 400 and "drift.nope" in unknown.json()["error"]["fields"]
    bins = client.post(url, {"drift": {"prompt_length": [1, 2]}}, format="json")
    assert bins.status_code == 400 and "drift.prompt_length" in bins.json()["error"]["fields"]
    now = time.time()
    ok = client.post(
        url, {"drift": {"prompt_length": [5, 15, 80]}, "freshness": {"user_profile": now - 3600}},
        format="json",
    )  # fmt: skip
    assert ok.status_code == 200, ok.content
    Replica(deployment, "stable", "s1").serve(ok=10)
    health.tick(now=now, act=False)
    slots = health.deployment_health(deployment.pk)["slots"]["stable"]
    status = {o["name"]: o for o in slots["objectives"]}
    assert status["prompt-drift"]["ok"] is False and status["prompt-drift"]["value"] > 0.2
    assert status["profile-fresh"]["ok"] is False
    fired = {f["name"] for f in slots["firing"]}
    assert {"prompt-drift", "profile-fresh"} <= fired
    # The features recover: the same objectives hold.
    client.post(
        url, {"drift": {"prompt_length": [30, 50, 20]}, "freshness": {"user_profile": now}},
        format="json",
    )  # fmt: skip
    health.tick(now=now + 2, act=False)
    status = {o["name"]: o for o in
              health.deployment_health(deployment.pk)["slots"]["stable"]["objectives"]}  # fmt: skip
    assert status["prompt-drift"]["ok"] is True and status["profile-fresh"]["ok"] is True


def _go_silent(deployment: Deployment, group: str, name: str, ago_s: float = 12.0) -> None:
    """The replica's last value, as if it stopped publishing `ago_s` ago (a crash, a kill)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.SLI_KEY_PREFIX}:sli:{deployment.tenant.slug}.{deployment.name}:{group}"
    value = json.loads(client.hget(key, name) or b"{}")
    value["window"]["end"] = time.time() - ago_s
    client.hset(key, name, json.dumps(value))


def _restarts(deployment: Deployment) -> int:
    last = SliSample.objects.filter(deployment=deployment, resolution=Resolution.RAW).latest("end")
    return int(last.kv["replica_restarts"])


def _two_replicas_ticked(world: TenantWorld) -> tuple[Deployment, Replica, float]:
    """r1 and r2 published and ticked once (their baselines); r2, and the tick's time."""
    deployment = _ready(world)
    r1, r2 = Replica(deployment, "stable", "r1"), Replica(deployment, "stable", "r2")
    r1.serve(ok=4)
    r2.serve(ok=4)
    now = time.time()
    health.tick(now=now, act=False)
    return deployment, r2, now


def test_a_replica_that_crashed_while_a_sibling_publishes_is_counted_lost_once(
    world_a: TenantWorld,
) -> None:
    deployment, r2, now = _two_replicas_ticked(world_a)
    # r1 dies; r2 keeps publishing, which keeps the hash (and r1's last value) alive.
    _go_silent(deployment, "stable", "r1")
    r2.serve(ok=2)
    health.tick(now=now + 2, act=False)
    assert _restarts(deployment) == 1
    r2.serve(ok=2)
    health.tick(now=now + 4, act=False)
    assert _restarts(deployment) == 0  # still silent: counted once
    # Its value finally leaves the hash (expired): not counted a second time.
    redis.Redis.from_url(settings.REDIS_URL).hdel(
        f"{settings.SLI_KEY_PREFIX}:sli:acme.assistant:stable", "r1"
    )
    r2.serve(ok=2)
    health.tick(now=now + 6, act=False)
    assert _restarts(deployment) == 0
    assert _stored_requests(deployment) == 8 + 2 + 2 + 2


def _stored_requests(deployment: Deployment) -> int:
    rows = SliSample.objects.filter(deployment=deployment, resolution=Resolution.RAW)
    return sum(r.requests for r in rows)


def test_a_replica_serve_stopped_on_purpose_is_not_lost_and_its_last_requests_count(
    world_a: TenantWorld,
) -> None:
    from serving.dataplane.version import VersionCore

    deployment = _ready(world_a)
    r2 = Replica(deployment, "stable", "r2")
    core = VersionCore(deployment.serve_app, "stable", {})
    core.recorder = Replica(deployment, "stable", "r1").recorder
    core.publisher.redis_url, core.publisher.prefix = settings.REDIS_URL, settings.SLI_KEY_PREFIX
    for _ in range(3):
        core.recorder.current.record(latency_s=0.01, ok=True)
    asyncio.run(_send(core.recorder.roll()))
    r2.serve(ok=1)
    now = time.time()
    health.tick(now=now, act=False)
    # Two more requests end, then Serve stops the replica (a scale-down): `__del__` says so.
    for _ in range(2):
        core.recorder.current.record(latency_s=0.01, ok=True)
    core.__del__()
    core.__del__()  # Python's own call at collection: nothing more
    r2.serve(ok=1)
    health.tick(now=now + 2, act=False)
    assert _restarts(deployment) == 0
    assert _stored_requests(deployment) == 3 + 1 + 2 + 1
    stopped = redis.Redis.from_url(settings.REDIS_URL).hgetall(
        f"{settings.SLI_KEY_PREFIX}:sli-stopped:acme.assistant:stable"
    )
    assert list(stopped) == [b"r1"]
    # Later ticks neither count it nor its requests again.
    r2.serve(ok=1)
    health.tick(now=now + 4, act=False)
    assert _restarts(deployment) == 0 and _stored_requests(deployment) == 8


async def _send(snapshot: dict[str, Any]) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(settings.REDIS_URL)
    await publish(client, settings.SLI_KEY_PREFIX, snapshot)
    await client.aclose()


def test_lost_replicas_counts_each_once_and_spares_pauses_other_versions_and_gaps() -> None:
    from serving.ops.health.replicas import lost_replicas
    from serving.ops.health.targets import FORGET_S, LOST_AFTER_S

    wall = 1000.0

    def value(name: str, version: str, silent_s: float = 0.0) -> dict[str, Any]:
        return {"replica": name, "version": version, "window": {"end": wall - silent_s}}

    def lost(published: list[dict[str, Any]], counted: Any = None, **kw: Any) -> Any:
        known = {str(p["replica"]): {} for p in published}
        return lost_replicas(seen, known, {}, published, counted, "v2", wall=wall, **kw)

    seen = {"a": {}, "b": {}, "old": {}}
    paused = [value("a", "v2", 6.0), value("b", "v2"), value("old", "v1", 30.0)]
    assert lost(paused) == (0, [], [])  # a paused 6 s (a GC, a starved CPU): not lost yet
    # a silent past LOST_AFTER_S; old (the previous version, a rollout's) is not counted.
    silent = [value("a", "v2", LOST_AFTER_S + 1), *paused[1:]]
    assert lost(silent) == (1, ["a"], [])
    assert lost(silent, ["a"]) == (0, ["a"], [])  # counted once
    # a resumes, then goes silent again: still the one loss, not a second.
    assert lost([value("a", "v2"), *paused[1:]], ["a"]) == (0, ["a"], [])
    assert lost(silent, ["a"]) == (0, ["a"], [])
    # Silent for a minute: dead; the tick drops its value and baseline.
    dead = [value("a", "v2", FORGET_S + 1), value("b", "v2"), value("old", "v1", FORGET_S + 1)]
    assert lost(dead, ["a"]) == (0, [], ["a", "old"])
    # b's value left the hash with no goodbye (the hash expired): lost; a stopped one is not.
    now_seen = {"a": {}, "old": {}}
    gone, _, _ = lost_replicas(seen, now_seen, {}, silent[::2], ["a"], "v2", wall=wall)
    assert gone == 1
    gone, _, _ = lost_replicas(seen, now_seen, {"b": {}}, silent[::2], ["a"], "v2", wall=wall)
    assert gone == 0
    # A new episode, or a slot ticked again after minutes (a canary back): baselines whose
    # goodbyes expired meanwhile count nothing; a silent one is remembered, not counted.
    assert lost_replicas(seen, {}, {}, [], None, "v2", wall=wall, counting=False) == (0, [], [])
    assert lost(silent, counting=False) == (0, ["a"], [])


def test_a_replica_restart_asked_for_is_not_counted_lost(world_a: TenantWorld) -> None:
    """restart_replicas kills replicas (no goodbye from a kill): it marks each one stopped on
    purpose (until the kill's deadline), so the crash-loop signal does not count a restart the contract asked for."""
    from serving.ops.remediation.restart import stopped_on_purpose

    deployment, r2, now = _two_replicas_ticked(world_a)
    _go_silent(deployment, "stable", "r1")  # killed; its replacement comes up later
    stopped_on_purpose(deployment, "stable", "r1", until=time.time())
    r2.serve(ok=2)
    health.tick(now=now + 2, act=False)
    assert _restarts(deployment) == 0
    assert _stored_requests(deployment) == 10


def test_a_goodbye_under_an_id_a_live_replica_now_uses_leaves_that_replica_alone(
    world_a: TenantWorld,
) -> None:
    """Two objects under one replica id (two in-process cores of a test process; an id Serve
    reused): the old one's goodbye neither deletes the live one's value nor hides it."""
    from serving.dataplane.sli import farewell

    deployment = _ready(world_a)
    old = Replica(deployment, "stable", "r1")
    old.serve(ok=2)
    time.sleep(0.01)
    live = Replica(deployment, "stable", "r1")  # the same id, its own totals
    live.serve(ok=4)
    now = time.time()
    health.tick(now=now, act=False)
    farewell(settings.REDIS_URL, settings.SLI_KEY_PREFIX, old.recorder)
    key = f"{settings.SLI_KEY_PREFIX}:sli:acme.assistant:stable"
    assert redis.Redis.from_url(settings.REDIS_URL).hexists(key, "r1")  # the live one's value
    # Publishes after the goodbye: alive. Not within the goodbye's millisecond, which reads as
    # the stopped one's value landing late (a live replica publishes every second); CI once
    # rolled the window within it and the goodbye's 2 counted as a restart's.
    time.sleep(0.01)
    live.serve(ok=3)
    health.tick(now=now + 2, act=False)
    assert _restarts(deployment) == 0
    assert _stored_requests(deployment) == 4 + 3


def test_a_replica_serve_replaces_for_failing_its_health_check_is_lost(
    world_a: TenantWorld,
) -> None:
    """Serve stops an unhealthy replica gracefully too (its __del__ runs): a replica whose
    health check failed says no goodbye, so the hang is counted (the replica_hang drill's
    detector)."""
    from serving.dataplane.version import VersionCore

    deployment, r2, now = _two_replicas_ticked(world_a)
    core = VersionCore(deployment.serve_app, "stable", {})
    core.recorder = Replica(deployment, "stable", "r3").recorder
    core.publisher.redis_url, core.publisher.prefix = settings.REDIS_URL, settings.SLI_KEY_PREFIX
    core.recorder.current.record(latency_s=0.01, ok=True)
    asyncio.run(_send(core.recorder.roll()))
    health.tick(now=now + 2, act=False)
    core.chaos.check_health = _hung  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        core.check_health()
    core.__del__()
    _go_silent(deployment, "stable", "r3")
    r2.serve(ok=1)
    health.tick(now=now + 4, act=False)
    assert _restarts(deployment) == 1
    assert not redis.Redis.from_url(settings.REDIS_URL).exists(
        f"{settings.SLI_KEY_PREFIX}:sli-stopped:acme.assistant:stable"
    )


def _hung() -> None:
    raise RuntimeError("replica_hang: this replica stopped answering its health check")


def test_a_replica_silent_for_a_minute_leaves_the_hash_and_the_state(world_a: TenantWorld) -> None:
    deployment, r2, now = _two_replicas_ticked(world_a)
    _go_silent(deployment, "stable", "r1", ago_s=61)
    r2.serve(ok=1)
    health.tick(now=now + 2, act=False)
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert not client.hexists(f"{settings.SLI_KEY_PREFIX}:sli:acme.assistant:stable", "r1")
    state = json.loads(client.hget(health.health_keys()["state"], f"{deployment.pk}:stable"))
    assert set(state["replicas"]) == {"r2"} and state["lost"] == []
    assert _restarts(deployment) == 1  # counted as it went (it never said goodbye)
