"""A hostile tenant against the drills' replay of recorded prompts (incidents.drills.replay,
serving.dataplane.prompt_sample), on the real routers of two tenants (the in-process data
plane of tests/incidents/test_drill_faults.py, no Ray):

* tenant B cannot get tenant A's sample replayed or read: B's prompts never enter A's sample
  (even with an arm record for B's deployment naming A's run, B's router writes under B), B's
  own run reads only B's; B cannot read A's run, nor drill A's deployment; A's run shows counts,
  never prompts;
* oversize prompts and floods are bounded: per prompt, in count and in total bytes.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings

from incidents import drills
from incidents.drills import replay
from incidents.drills.models import ChaosDrill, DrillRun
from portal.exceptions import ValidationFailed
from serving.dataplane.prompt_sample import MAX_PROMPT_BYTES, arm_key, sample_key
from serving.deployments import services as deploy
from serving.deployments.models import Deployment
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.test_drill_faults import DataPlane, _drill, _start, plane  # noqa: F401
from tests.serving.test_ops_loop import _ready

pytestmark = pytest.mark.django_db


def _key(world: TenantWorld) -> str:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    _, key = deploy.inference_key_create(
        tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment, name="client"
    )
    return key


def _send(data_plane: DataPlane, slug: str, key: str, prompt: str) -> int:
    answer = httpx.post(
        f"{data_plane.url}/{slug}/assistant/v1/completions",
        json={"prompt": prompt, "max_tokens": 1},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    return answer.status_code


def _replaying_run(world: TenantWorld, data_plane: DataPlane) -> DrillRun:
    drill = _drill(world, "token_starvation", replay_prompts=True, duration_s=60,
                   parameters={"concurrency": 1})  # fmt: skip
    return _start(world, drill, data_plane, time.time())


def _settle(run: DrillRun, count: int) -> list[str]:
    """The run's sample once it holds `count` prompts (the routers record asynchronously)."""
    deadline = time.monotonic() + 10
    while len(replay.sample(run)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)  # and nothing more comes
    return replay.sample(run)


def test_tenant_b_can_neither_replay_nor_read_tenant_as_sample(
    world_a: TenantWorld,
    world_b: TenantWorld,
    plane: DataPlane,  # noqa: F811
) -> None:
    _ready(world_a)
    _ready(world_b)
    key_a, key_b = _key(world_a), _key(world_b)
    plane.apply()
    run_a = _replaying_run(world_a, plane)
    run_b = _replaying_run(world_b, plane)
    prefix = settings.SLI_KEY_PREFIX
    client = redis.Redis.from_url(settings.REDIS_URL)
    # An arm record for B's deployment that names A's run: B's router still writes under B.
    confused = json.loads(client.get(arm_key(prefix, world_b.tenant.pk, "assistant")) or "{}")
    client.set(arm_key(prefix, world_b.tenant.pk, "assistant"),
               json.dumps({**confused, "run": run_a.pk}))  # fmt: skip
    for n in range(3):
        assert _send(plane, "acme", key_a, f"acme's private prompt {n}") == 200
        assert _send(plane, "globex", key_b, f"globex prompt {n}: show me acme's") == 200
    # B's key on A's deployment is refused before anything is recorded.
    assert _send(plane, "acme", key_b, "globex sneaking into acme") == 401
    sample_a = _settle(run_a, 3)
    assert sorted(sample_a) == [f"acme's private prompt {n}" for n in range(3)]
    b_under_a_run = client.lrange(sample_key(prefix, world_b.tenant.pk, run_a.pk), 0, -1)
    assert len(b_under_a_run) == 3 and all(b"globex" in p for p in b_under_a_run)
    assert not any("globex" in p for p in replay.sample(run_a))
    assert not any("acme's private" in p for p in replay.sample(run_b))
    # B cannot read A's run (the same 404 as a missing one), nor drill A's deployment.
    api_b = world_b.client()
    assert api_b.get(f"/api/v1/drill-runs/{run_a.pk}/").status_code == 404
    a_deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    with pytest.raises(ValidationFailed) as exc:
        drills.drill_create(tenant=world_b.tenant, actor=Actor(user=world_b.owner),
                            deployment=a_deployment, name="steal", fault="token_starvation",
                            replay_prompts=True)  # fmt: skip
    assert exc.value.field == "deployment"
    assert not ChaosDrill.objects.filter(tenant=world_b.tenant, name="steal").exists()
    # A's own view of its run: counts and sizes, never the prompts.
    shown = world_a.client().get(f"/api/v1/drill-runs/{run_a.pk}/")
    assert shown.status_code == 200 and "private prompt" not in shown.content.decode()


def test_oversize_prompts_and_floods_are_bounded(
    world_a: TenantWorld,
    plane: DataPlane,  # noqa: F811
) -> None:
    _ready(world_a)
    key = _key(world_a)
    plane.apply()
    run = _replaying_run(world_a, plane)
    limits: dict[str, Any] = replay.LIMITS
    huge = "é" + "x" * 60_000  # within the guard's body limit, far beyond a sample's prompt
    assert _send(plane, "acme", key, huge) in (200, 400)  # answered or refused: parsed either way
    first = _settle(run, 1)
    assert len(first) == 1 and len(first[0].encode()) == limits["max_prompt_bytes"]
    assert limits["max_prompt_bytes"] <= MAX_PROMPT_BYTES
    for n in range(limits["max_prompts"] + 20):
        _send(plane, "acme", key, f"{n:04d} " + "y" * 1500)
    sample = _settle(run, limits["max_prompts"])
    total = sum(len(p.encode()) for p in sample)
    assert len(sample) <= limits["max_prompts"], len(sample)
    assert total <= limits["max_total_bytes"], total
    assert total > limits["max_total_bytes"] - 2000  # it filled up to the bound, not beyond
    client = redis.Redis.from_url(settings.REDIS_URL)
    ttl = client.pttl(sample_key(settings.SLI_KEY_PREFIX, world_a.tenant.pk, run.pk))
    assert 0 < ttl <= (60 + 60 + 60 + replay.KEEP_MARGIN_S) * 1000  # it expires on its own
