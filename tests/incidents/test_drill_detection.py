"""Drills prove detection, not only survival (issue 18 item 1), without Ray: replicas publish
their fault reports to the real Redis (as serving.dataplane.version does), the health tick
stores the slot's SLI rows, and the run is stepped by hand.

* Every fault kind declares the signals that should notice it.
* An error burst that took effect (the replica's own count) and moved the error ratio is
  detected with an MTTD from the moment it took effect; page and API show it.
* A latency spike that took effect but moved nothing (a 1 ms delay) fails as "undetected".
* A spike that reached the replica late (a worker killed holding the injection's reconcile)
  is judged on the rows while it was in, not diluted by the seconds before it.
* A fault no replica reported fails as "never took effect".
* A leak at seed 001's rate (512 MB/s) on a replica without a GPU: simulated device memory,
  detected by the replicas' reported memory, labelled simulated.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from django.conf import settings

from incidents import drills
from incidents.drills import detection
from incidents.drills.catalogue import CATALOGUE, catalogue
from incidents.drills.models import DrillRun, DrillStatus, FaultKind
from serving.dataplane.faults import FaultInjector
from serving.dataplane.sli import publish
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import health
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import Replica, _ready

pytestmark = pytest.mark.django_db


class ReportingReplica(Replica):
    """A replica that also publishes its fault report (`kv.faults`, `kv.fault_leaked_mb`)."""

    report: dict[str, Any] | None = None
    leaked_mb: float = 0.0

    def serve(self, ok: int, failed: int = 0, latency_s: float = 0.02) -> None:
        for _ in range(ok):
            self.recorder.current.record(latency_s=latency_s, ok=True, tokens_out=4)
        for _ in range(failed):
            self.recorder.current.record(latency_s=latency_s, ok=False)
        kv = {"num_blocks": 64, "free_blocks": 48, "fault_leaked_mb": self.leaked_mb}
        if self.report is not None:
            kv["faults"] = self.report
        snapshot = self.recorder.roll(kv=kv)

        async def send() -> None:
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(settings.REDIS_URL)
            await publish(client, settings.SLI_KEY_PREFIX, snapshot)
            await client.aclose()

        asyncio.run(send())


def _report(run: DrillRun, kind: str, **extra: Any) -> dict[str, Any]:
    return {
        "drill": str(run.pk), "active": [kind], "effects": {}, "effects_drill": str(run.pk),
        "leak": None, **extra,
    }  # fmt: skip


def _drill(world: TenantWorld, deployment: Deployment, fault: str, **extra: Any) -> Any:
    data: dict[str, Any] = {
        "name": f"{fault} drill", "fault": fault, "group": "stable", "duration_s": 10,
        "steady_state": {"contract": False, "probes": [{"sli": "error_rate", "max": 1}]},
        **extra,
    }  # fmt: skip
    return drills.drill_create(
        tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment, **data
    )


def _inject(world: TenantWorld, drill: Any, t0: float) -> DrillRun:
    run = drills.run_start(tenant=world.tenant, actor=Actor(user=world.owner), drill=drill)
    drills.run_advance(run.pk, t0 + 0.1)
    drills.run_advance(run.pk, t0 + 0.2)
    drills.run_advance(run.pk, t0 + 0.3)
    run.refresh_from_db()
    assert run.status == DrillStatus.OBSERVING, run.verdict
    return run


def _finish(run: DrillRun, t0: float, tick: Any) -> DrillRun:
    at = t0 + 10.5
    for _ in range(15):  # the revert, the recovery, and DETECTION_WAIT_S for a late signal
        tick(at)
        if drills.run_advance(run.pk, at + 0.1) is None:
            break
        at += 3
    run.refresh_from_db()
    return run


def test_every_fault_kind_declares_known_signals() -> None:
    assert set(CATALOGUE) == set(FaultKind.values)
    for kind, fault in CATALOGUE.items():
        assert fault.detectors, f"{kind} declares no detector"
        assert set(fault.detectors) <= set(detection.SIGNALS), (kind, fault.detectors)
    leak = CATALOGUE[FaultKind.GPU_MEMORY_LEAK].detectors
    assert set(leak) == {"gpu_memory", "replica_memory"}  # a GPU or replica-memory signal
    listed = {entry["fault"]: entry["detectors"] for entry in catalogue()}
    assert listed["error_burst"] == ["error_ratio", "contract"]


def test_the_injector_reports_what_its_fault_did() -> None:
    injector = FaultInjector("r-1")
    injector.configure({"drill": "7", "error_burst": {"share": 1.0}})
    assert injector.failure() is not None and injector.failure() is not None
    report = injector.report()
    assert report["drill"] == "7" and report["active"] == ["error_burst"]
    assert report["effects"] == {"error_burst": 2}
    injector.configure({})  # reverted: what it did stays readable until another drill
    assert injector.report()["effects"] == {"error_burst": 2}
    assert injector.report()["effects_drill"] == "7" and injector.report()["drill"] is None
    injector.configure({"drill": "8", "latency_spike": {"delay_ms": 5}})
    injector.delay_s()
    assert injector.report()["effects"] == {"latency_spike": 1}  # another drill: from zero


def test_a_seed_rate_leak_without_a_gpu_is_simulated_device_memory() -> None:
    """Seed 001 §3.1: 512 MB/s for 60 s is 30 GB: counted on a simulated device, not
    allocated on the host; every report says simulated."""
    clock = {"now": 1000.0}
    injector = FaultInjector("r-1", clock=lambda: clock["now"], leak_tick_s=0.005)

    async def scenario() -> None:
        import resource

        injector.configure({"drill": "3", "gpu_memory_leak": {"mb_per_s": 512, "max_mb": 30720}})
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # torch imported by now
        assert injector.leak is not None and injector.leak.device in ("simulated", "cuda")
        clock["now"] += 60
        for _ in range(200):
            if injector.leaked_mb >= 30720:
                break
            await asyncio.sleep(0.01)
        assert injector.leaked_mb == 30720
        leak = injector.report()["leak"]
        if injector.leak.device == "simulated":
            assert leak == {"mb": 30720.0, "device": "simulated", "simulated": True}
            grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
            assert grew_mb < 200  # nothing like 30 GB was allocated
        injector.close()
        assert injector.leaked_mb == 0

    asyncio.run(scenario())


def test_an_error_burst_that_took_effect_and_moved_the_error_ratio_is_detected(
    world_a: TenantWorld, client: Any
) -> None:
    deployment = _ready(world_a)
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    replica = ReportingReplica(deployment, "stable", "s1")
    drill = _drill(world_a, deployment, "error_burst", traffic_share=0.5)
    t0 = time.time()
    replica.serve(ok=40)
    health.tick(now=t0, act=False)
    run = _inject(world_a, drill, t0)
    assert run.detection["baseline"]["error_ratio"] == 0.0
    drills.run_advance(run.pk, t0 + 1)
    run.refresh_from_db()
    assert run.effect_at is None and not run.detected_by  # nothing reported yet
    replica.report = _report(run, "error_burst", effects={"error_burst": 20})
    replica.serve(ok=20, failed=20)
    health.tick(now=t0 + 2, act=False)
    drills.run_advance(run.pk, t0 + 2.5)
    run.refresh_from_db()
    assert run.effect_at is not None and "20 requests failed" in run.detection["effect"]
    assert run.detected_by == "error_ratio" and run.detected is True
    assert run.mttd_s is not None and 0 <= run.mttd_s < 1
    replica.report = None

    def tick(at: float) -> None:
        replica.serve(ok=30)
        health.tick(now=at, act=False)

    run = _finish(run, t0 + 15, tick)
    assert run.status == DrillStatus.PASSED, run.verdict
    kinds = list(run.events.values_list("kind", flat=True))
    assert "effective" in kinds and "signal_moved" in kinds
    client.force_login(world_a.owner)
    page = client.get(f"/t/{world_a.tenant.slug}/drill-runs/{run.pk}/").content.decode()
    assert 'data-testid="run-detected"' in page and "error_ratio" in page
    api = client.get(f"/api/v1/drill-runs/{run.pk}/").json()
    assert api["detected"] is True and api["detected_by"] == "error_ratio"
    assert api["effect_at"] and api["mttd_s"] is not None


def test_a_fault_that_took_effect_but_moved_nothing_fails_as_undetected(
    world_a: TenantWorld,
) -> None:
    deployment = _ready(world_a)
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    replica = ReportingReplica(deployment, "stable", "s1")
    drill = _drill(world_a, deployment, "latency_spike", parameters={"delay_ms": 1})
    t0 = time.time()
    replica.serve(ok=40)
    health.tick(now=t0, act=False)
    run = _inject(world_a, drill, t0)

    def tick(at: float) -> None:
        replica.report = _report(run, "latency_spike", effects={"latency_spike": 30})
        replica.serve(ok=30)  # 1 ms more: the p95 stays in its bucket
        health.tick(now=at, act=False)

    tick(t0 + 2)
    drills.run_advance(run.pk, t0 + 2.5)
    run = _finish(run, t0, tick)
    assert run.status == DrillStatus.FAILED
    assert run.verdict.startswith("undetected: latency_spike took effect"), run.verdict
    assert "latency_p95" in run.verdict and run.detected is False and run.mttd_s is None
    assert run.effect_at is not None


def _spiking_slot(world: TenantWorld) -> tuple[ReportingReplica, Any]:
    """A running deployment ticked every second, its stable replica and a 200 ms spike drill."""
    deployment = _ready(world)
    Deployment.objects.filter(pk=deployment.pk).update(
        status=DeploymentStatus.RUNNING, health_interval_s=1
    )
    deployment.refresh_from_db()
    replica = ReportingReplica(deployment, "stable", "s1")
    return replica, _drill(world, deployment, "latency_spike", parameters={"delay_ms": 200})


def test_a_spike_that_reached_the_replica_late_is_judged_on_the_rows_while_it_was_in(
    world_a: TenantWorld,
) -> None:
    """8 s of a 10 s drill pass before the fault reaches the replica: its 10 delayed requests
    are under 5 % of all since the injection (the p95 there stays 25 ms), but a quarter of
    those since the replica says the fault arrived (`effects_since`)."""
    replica, drill = _spiking_slot(world_a)
    t0 = time.time()
    replica.serve(ok=40)
    health.tick(now=t0, act=False)
    run = _inject(world_a, drill, t0)
    for k in range(1, 9):  # the fault is in the desired state, not yet on the replica
        replica.serve(ok=40)
        health.tick(now=t0 + k, act=False)
        drills.run_advance(run.pk, t0 + k + 0.5)
    run.refresh_from_db()
    assert run.effect_at is None and not run.detected_by
    replica.report = _report(
        run, "latency_spike", effects={"latency_spike": 10}, effects_since=t0 + 8.6
    )
    replica.serve(ok=30)
    replica.serve(ok=10, latency_s=0.22)  # one row: 30 before the fault, 10 delayed
    health.tick(now=t0 + 9.2, act=False)
    drills.run_advance(run.pk, t0 + 9.3)
    run.refresh_from_db()
    assert run.detection["effect_since"] == pytest.approx(t0 + 8.6)
    assert run.detected_by == "latency_p95", run.detection
    assert run.detection["values"]["latency_p95"] == 250.0
    replica.report = None

    def tick(at: float) -> None:
        replica.serve(ok=40)
        health.tick(now=at, act=False)

    run = _finish(run, t0, tick)
    assert run.status == DrillStatus.PASSED, run.verdict
    since, until = detection.observed_window(run)
    assert since == pytest.approx(t0 + 8.6)
    assert run.reverted_at is not None and until == run.reverted_at.timestamp()


def test_a_tick_that_stalled_across_the_injection_is_not_the_baseline(
    world_a: TenantWorld,
) -> None:
    """No row before the injection (the worker holding the ticks was killed): the first row
    spans it, delayed requests and all. It is not the minute before the injection, so the
    spike is measured against no baseline instead of against itself."""
    replica, drill = _spiking_slot(world_a)
    t0 = time.time()
    replica.serve(ok=0)
    health.tick(now=t0 - 0.5, act=False)  # the last tick before the stall: no request yet
    run = _inject(world_a, drill, t0)
    assert run.detection["baseline"]["latency_p95"] is None
    replica.serve(ok=30)
    replica.report = _report(
        run, "latency_spike", effects={"latency_spike": 10}, effects_since=t0 + 3.0
    )
    replica.serve(ok=10, latency_s=0.22)
    health.tick(now=t0 + 5, act=False)  # one row: from before the injection to now
    drills.run_advance(run.pk, t0 + 5.1)
    run.refresh_from_db()
    assert run.detection["baseline"]["latency_p95"] is None
    assert run.detected_by == "latency_p95", run.detection


def test_a_fault_no_replica_reported_never_took_effect(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    replica = ReportingReplica(deployment, "stable", "s1")
    drill = _drill(world_a, deployment, "error_burst")
    t0 = time.time()
    replica.serve(ok=40)
    health.tick(now=t0, act=False)
    run = _inject(world_a, drill, t0)

    def tick(at: float) -> None:
        replica.serve(ok=30)
        health.tick(now=at, act=False)

    run = _finish(run, t0, tick)
    assert run.status == DrillStatus.FAILED
    assert "never took effect" in run.verdict and run.effect_at is None


def test_a_seed_rate_leak_is_detected_by_the_replicas_reported_memory(
    world_a: TenantWorld,
) -> None:
    deployment = _ready(world_a)
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    replica = ReportingReplica(deployment, "stable", "s1")
    drill = _drill(world_a, deployment, "gpu_memory_leak",
                   parameters={"mb_per_s": 512, "max_mb": 256})  # fmt: skip
    t0 = time.time()
    replica.serve(ok=10)
    health.tick(now=t0, act=False)
    run = _inject(world_a, drill, t0)
    assert run.detection["baseline"]["replica_memory"] == 0.0
    assert run.detection["baseline"]["gpu_memory"] is None  # no GPU agent sample here
    leak = {"mb": 256.0, "device": "simulated", "simulated": True}
    replica.report = _report(run, "gpu_memory_leak", leak=leak)
    replica.leaked_mb = 256.0
    replica.serve(ok=10)
    drills.run_advance(run.pk, t0 + 1.5)
    run.refresh_from_db()
    assert run.detected_by == "replica_memory" and run.detection["simulated"] is True
    assert "simulated device" in run.detection["effect"]
    moved = run.events.get(kind="signal_moved")
    assert "simulated device memory" in moved.message


def test_moved_thresholds() -> None:
    assert detection.moved("error_ratio", 0.0, 0.02)
    assert not detection.moved("error_ratio", 0.1, 0.15)  # not doubled
    assert detection.moved("latency_p95", 10.0, 100.0)
    assert not detection.moved("latency_p95", 10.0, 25.0)
    assert detection.moved("replica_memory", 0.0, 512.0)
    assert not detection.moved("gpu_memory", 2048.0, 2100.0)
    assert not detection.moved("replica_restarts", 0.0, None)
    assert detection.moved("replica_restarts", 0.0, 1.0)
