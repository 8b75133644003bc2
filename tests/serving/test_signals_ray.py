"""The signal SLIs from real replicas on the session's local Ray cluster: a replica publishes
its queue wait, its limits (Serve's max_ongoing_requests, the engine's batch) and failures by
reason; the router's breaker counts trips and the requests it turns away (its failures count
as `upstream` only where no replica reported them: each failure under one reason);
and a replica left on its old weights by a failed hot reload shows a state divergence above 0
(it does not vanish from the SLIs)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings

from serving.deployments import services as deployments
from serving.engine.testing import write_tiny_checkpoint
from serving.ops import health
from serving.ops.contracts import contract_set
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_serving_ray import _apply, _key, _post, _ready_version, _served

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: signals
spec:
  window: 1h
  objectives:
    - {name: divergence, sli: state_divergence, max: 0.03}
    - {name: failed, sli: errors_by_reason, reason: other, max: 0.1, window: 1m}
    - {name: trips, sli: breaker_trips, max: 0.5, window: 1m}
"""
APP = "acme.assistant"


def _snapshots(kind: str, app: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.SLI_KEY_PREFIX}:{kind}:{app}"
    return [json.loads(v) for v in client.hgetall(key).values()]


def _until(what: str, found: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"{what} within {timeout:.0f} s")


def test_real_replicas_publish_reasons_saturation_and_a_stale_replica_diverges(
    world_a: TenantWorld, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    actor = Actor(user=world_a.owner)
    deployment = _served(world_a)
    key = _key(world_a, deployment)
    contract_set(tenant=world_a.tenant, actor=actor, deployment=deployment, source=CONTRACT)
    _apply(ray_cluster, [APP])
    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    with httpx.Client(timeout=30, trust_env=False) as http:
        for _ in range(3):
            assert _post(http, url, key).status_code == 200

        # Saturation and queue wait, as a real replica publishes them.
        def served() -> Any:
            for snapshot in _snapshots("sli", f"{APP}:stable"):
                signals = snapshot.get("signals") or {}
                if (signals.get("queue") or {}).get("count", 0) >= 3:
                    return snapshot
            return None

        snapshot = _until("a snapshot with 3 queued requests", served)
        signals, kv = snapshot["signals"], snapshot["kv"]
        assert signals["max_ongoing"] >= 1 and signals["max_num_seqs"] >= 1
        assert signals["queue"]["sum_s"] >= 0 and "running" in kv and "waiting" in kv
        old_version, old_print = signals["version"], signals["fingerprint"]
        assert old_version and old_print
        _until("a router snapshot", lambda: _snapshots("router", APP))  # its baseline too
        now = time.time()
        health.tick(now=now, act=False)  # the baselines

        # A new stable version whose weights vanished after validation: the hot reload
        # fails and the replica keeps serving its old weights; and every request fails.
        v2_dir = write_tiny_checkpoint(tmp_path / "v2", seed=5)
        v2 = _ready_version(world_a, v2_dir, "v2")
        (v2_dir / "model.safetensors").unlink()
        issued = time.time()
        burst = {"share": 1.0, "status": 503}
        faults = {
            "stable": {
                "drill": "signals",
                "issued_at": issued,
                "expires_at": issued + 120,
                "error_burst": burst,
            }
        }
        deployments.deployment_change(
            tenant=world_a.tenant,
            actor=actor,
            deployment=deployment,
            changes={"stable_version_id": v2.pk, "faults": faults},
            reason="test: bad reload",
        )
        _apply(ray_cluster, [APP])
        statuses = [_post(http, url, key).status_code for _ in range(30)]
        assert set(statuses) <= {503} and len(statuses) == 30

    # The version's failures by reason, the router's breaker: failures, a trip, turned away.
    def counted() -> Any:
        for snapshot in _snapshots("sli", f"{APP}:stable"):
            if (snapshot.get("signals") or {}).get("errors", {}).get("other", 0) >= 20:
                return snapshot
        return None

    snapshot = _until("the replica's failures by reason", counted)
    assert snapshot["version"] == old_version  # still the old weights
    assert snapshot["signals"]["fingerprint"] == old_print

    def tripped() -> Any:
        for router in _snapshots("router", APP):
            found = (router.get("breakers") or {}).get("stable") or {}
            if found.get("failures", 0) >= 20 and found.get("turned_away", 0) >= 1:
                return router
        return None

    router = _until("a router snapshot with the failures and a trip", tripped)
    breaker = router["breakers"]["stable"]
    assert breaker["failures"] >= 20 and breaker["trips"] >= 1 and breaker["turned_away"] >= 1

    health.tick(now=now + 6, act=False)
    found = health.deployment_health(deployment.pk)["signals"]["stable"]
    # The replica on the old weights shows: it is off the desired (v2) weights.
    assert found["divergence"]["off"] == [snapshot["replica"]]
    assert found["values"]["state_divergence"] > 0
    reasons = found["values"]["errors_by_reason"]
    # The version's own failures (the replica reported them; the breaker saw the same ones).
    assert reasons["upstream"] == 0 and reasons["circuit_open"] > 0 and reasons["other"] > 0
    assert found["values"]["breaker_trips"] >= 1
    status = {
        o["name"]: o
        for o in health.deployment_health(deployment.pk)["slots"]["stable"]["objectives"]
    }
    assert status["divergence"]["ok"] is False and status["trips"]["ok"] is False
    assert status["failed"]["ok"] is False
