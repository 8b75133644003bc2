"""Issue 18 item 2 for real: a local Ray cluster, a real Celery worker on the `chaos` queue (and
`default` for reconciles, `health` for ticks), traffic through the Serve proxy; each run is
stepped by the worker from start to verdict.

* prompt_injection: the shipped corpus goes through the tenant's router to the model under the
  drill's system prompt; the verdict lists each of the 30 items (refused / kept / leaked).
* replay: a kv_pollution_probe that replays the tenant's own recorded prompts (recorded at the
  router while the run lasts, never the drill's own traffic); the sample is gone afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings

from incidents import drills
from incidents.drills import replay
from incidents.drills.injection import canary_for, corpus
from incidents.drills.models import DrillRun, DrillStatus
from serving.dataplane.prompt_sample import arm_key, sample_key
from serving.deployments.models import Deployment
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.reliability.test_drill_faults_ray import _ended, _explain
from tests.reliability.test_drills_ray import CHAOS_QUEUES, _serving, _status, _until
from tests.serving.test_ops_ray import PROMPT, Traffic, Worker, worker_factory  # noqa: F401

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _run(world: TenantWorld, deployment: Deployment, fault: str, **extra: Any) -> DrillRun:
    actor = Actor(user=world.owner)
    drill = drills.drill_create(tenant=world.tenant, actor=actor, deployment=deployment,
                                name=f"{fault} drill", fault=fault, group="stable",
                                **extra)  # fmt: skip
    return drills.run_start(tenant=world.tenant, actor=actor, drill=drill)


def test_the_injection_corpus_goes_through_serve_and_every_item_gets_a_verdict(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
) -> None:
    deployment, _ = _serving(world_a, ray_cluster, canary=False)
    worker = worker_factory(reconcile=True, queues=CHAOS_QUEUES)
    worker.start()
    run = _ended(_run(world_a, deployment, "prompt_injection", duration_s=40,
                      parameters={"prompts_per_step": 10, "max_tokens": 8},
                      steady_state={"contract": False,
                                    "probes": [{"sli": "error_rate", "max": 0.05}]}), 120)  # fmt: skip
    assert run.status == DrillStatus.PASSED, _explain(run)
    items = run.probes["fault"]["items"]
    assert sorted(items) == sorted(i.id for i in corpus())
    # The tiny model keeps to its system prompt: neither the canary nor a payload comes back.
    assert {v["outcome"] for v in items.values()} == {"kept"}, items
    assert all(v["status"] == 200 for v in items.values())
    assert "30 of 30 corpus items judged: 0 refused, 30 kept, 0 leaked" in run.verdict
    assert all(f"{i.id} kept" in run.verdict for i in corpus())
    assert run.detected_by == "probe" and run.effect_at is not None, run.detection
    assert canary_for(run.pk) not in str(run.probes) + run.verdict
    deployment.refresh_from_db()
    assert deployment.current_revision.faults == {}  # it never needed a revision


def test_a_drill_replays_the_tenants_recorded_prompts_and_the_sample_goes_with_it(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
) -> None:
    deployment, key = _serving(world_a, ray_cluster, canary=False)
    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    traffic = Traffic(url, key, pause_s=0.5)  # paced: the sample has room for later prompts
    worker = worker_factory(reconcile=True, queues=CHAOS_QUEUES)
    worker.start()
    mine = [f"acme's own prompt {n}: how does a canary rollout work?" for n in range(3)]
    try:
        _until(lambda: sum(traffic.groups.values()) > 10, 60)
        run = _run(world_a, deployment, "kv_pollution_probe", duration_s=15, replay_prompts=True,
                   steady_state={"contract": False,
                                 "probes": [{"sli": "error_rate", "max": 0.05}]})  # fmt: skip
        _until(lambda: _status(run) == DrillStatus.OBSERVING, 60)
        with httpx.Client(timeout=30, trust_env=False) as http:
            for prompt in mine:
                answer = http.post(url, json={"prompt": prompt, "max_tokens": 1},
                                   headers={"authorization": f"Bearer {key}"})  # fmt: skip
                assert answer.status_code == 200

        def recorded() -> bool:
            return set(mine) <= set(replay.sample(run))

        _until(recorded, 20, tick=False)
        # The tenant's client prompts only: never the drill's replays or the health probes.
        assert set(replay.sample(run)) <= {PROMPT, *mine}, replay.sample(run)
        run = _ended(run, 90)
    finally:
        traffic.close()
    assert run.status == DrillStatus.PASSED, _explain(run)
    used = run.probes["fault"]["replay"]
    assert used["steps_from_sample"] >= 1 and used["sample_prompts"] >= 4, used
    assert run.probes["fault"]["cross_tenant_hits"] == 0
    kinds = list(run.events.values_list("kind", flat=True))
    assert "replay_armed" in kinds
    # Deleted when the run ended, not left to its TTL.
    client = redis.Redis.from_url(settings.REDIS_URL)
    prefix = settings.SLI_KEY_PREFIX
    _until(lambda: not client.exists(sample_key(prefix, world_a.tenant.pk, run.pk)), 10, tick=False)
    assert not client.exists(arm_key(prefix, world_a.tenant.pk, "assistant"))
    assert not any(p in str(run.probes) for p in mine)
    assert traffic.statuses.get(200, 0) > 0
