"""Drills prove detection on the real cluster (issue 18 item 1): the session's Ray head, a real
Celery worker (queues default, health, chaos) stepping the runs, traffic through the Serve proxy.
The replicas' own fault reports (published with their SLI windows) say the fault took effect.

* A latency spike takes effect and moves the slot's p95: detected, with an MTTD.
* A leak too small to move the replicas' memory beyond its baseline (1 MB/s up to 32 MB) takes
  effect but nothing notices it: the run fails as "undetected", not as a steady-state failure.
* Seed 001 §3.1's leak, 512 MB/s for 60 s (30 GB, more than this host's memory): simulated
  device memory on a replica without a GPU, detected by the replicas' reported memory and
  labelled simulated; the host never held it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from incidents import drills
from incidents.drills.models import DrillRun, DrillStatus
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.reliability.test_drills_ray import CHAOS_QUEUES, _serving, _status, _until
from tests.serving.test_ops_ray import Traffic, Worker, worker_factory  # noqa: F401

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ENDED = (DrillStatus.PASSED, DrillStatus.FAILED, DrillStatus.ABORTED)
STEADY = {"contract": False, "probes": [{"sli": "error_rate", "max": 0.2}]}
# A node with room for the seed's whole leak as the replica's share: the leak is simulated
# device memory on a replica without a GPU, so no host memory backs it.
BIG_SHARE = {"REPLICA_MB_PER_CPU": "262144"}


def _run(world: TenantWorld, drill: Any, timeout: float) -> DrillRun:
    run = drills.run_start(tenant=world.tenant, actor=Actor(user=world.owner), drill=drill)
    _until(lambda: _status(run) in ENDED, timeout)
    return run


def _timeline(run: DrillRun) -> list[tuple[str, str]]:
    return list(run.events.values_list("kind", "message"))


def test_a_latency_spike_is_detected_and_an_unnoticed_leak_fails_as_undetected(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
) -> None:
    deployment, key = _serving(world_a, ray_cluster, canary=False)
    owner = Actor(user=world_a.owner)
    traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions", key)
    worker = worker_factory(reconcile=True, queues=CHAOS_QUEUES)
    worker.start()
    try:
        _until(lambda: sum(traffic.groups.values()) > 60, 90)  # a few ticks stored rows
        spike = drills.drill_create(
            tenant=world_a.tenant, actor=owner, deployment=deployment, name="slow",
            fault="latency_spike", parameters={"delay_ms": 150}, group="stable",
            duration_s=12, steady_state=STEADY,
        )  # fmt: skip
        run = _run(world_a, spike, 120)
        assert run.status == DrillStatus.PASSED, (run.verdict, _timeline(run))
        assert run.effect_at is not None and "requests delayed" in run.detection["effect"]
        assert run.detected_by in ("latency_p95", "contract"), run.detection
        assert run.mttd_s is not None and run.mttd_s >= 0  # how fast: bench/drills.py
        assert run.detection["baseline"]["latency_p95"] is not None, run.detection

        small = drills.drill_create(
            tenant=world_a.tenant, actor=owner, deployment=deployment, name="small leak",
            fault="gpu_memory_leak", parameters={"mb_per_s": 1, "max_mb": 32},
            group="stable", duration_s=10, steady_state=STEADY,
        )  # fmt: skip
        run = _run(world_a, small, 120)
        assert run.status == DrillStatus.FAILED, (run.verdict, _timeline(run))
        assert run.verdict.startswith("undetected: gpu_memory_leak took effect"), run.verdict
        assert run.effect_at is not None and run.detected is False and run.mttd_s is None
        assert "simulated device" in run.detection["effect"]  # no GPU on this cluster
    finally:
        traffic.close()


def test_the_seed_rate_leak_is_detected_by_the_replicas_memory(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
    settings: Any,
) -> None:
    settings.REPLICA_MB_PER_CPU = int(BIG_SHARE["REPLICA_MB_PER_CPU"])
    deployment, key = _serving(world_a, ray_cluster, canary=False)
    traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions", key)
    worker = worker_factory(reconcile=True, queues=CHAOS_QUEUES, env=BIG_SHARE)
    worker.start()
    try:
        _until(lambda: sum(traffic.groups.values()) > 10, 60)
        leak = drills.drill_create(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
            name="seed leak", fault="gpu_memory_leak",
            parameters={"mb_per_s": 512, "max_mb": 512 * 60}, group="stable",
            duration_s=60, steady_state=STEADY,
        )  # fmt: skip
        run = _run(world_a, leak, 180)
        assert run.status == DrillStatus.PASSED, (run.verdict, _timeline(run))
        assert run.detected_by in ("replica_memory", "gpu_memory"), run.detection
        assert run.effect_at is not None and run.mttd_s is not None and run.mttd_s >= 0
        if run.detected_by == "replica_memory":
            assert run.detection["simulated"] is True  # no GPU here: labelled simulated
            moved = run.events.get(kind="signal_moved")
            assert "simulated device memory" in moved.message
        # It grew at the seed's rate to ~30 GB, more than this host's memory: never allocated.
        assert run.detection["peak"]["replica_memory"] >= 512 * 45, run.detection
        assert traffic.statuses.get(200, 0) > 0
    finally:
        traffic.close()
