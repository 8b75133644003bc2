"""The golden-prompt probe on a real local Ray cluster: each slot's recorded greedy answers are
replayed through the Serve proxy, alone and in a mixed batch. A correct version scores 1.0; a
canary whose weights change behind its recorded answers (a hot reload of a tampered artifact:
the weight_swap_jitter fault's reload) scores below 1, and the stable slot stays at 1.0."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings

from serving.deployments import services as deployments
from serving.engine.testing import write_tiny_checkpoint
from serving.ops import contracts
from serving.ops.consistency import consistency_probe, consistency_scores
from serving.ops.health.state import consistency_field, consistency_key
from serving.registry.golden import DEFAULT_PROMPTS
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_serving_ray import _apply, _ready_version, _served

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

CONSISTENCY_CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: consistent
spec:
  window: 30d
  objectives:
    - name: golden-answers
      sli: output_consistency
      min: 1.0
"""


def test_a_correct_version_scores_one_and_a_bad_reload_scores_below(
    world_a: TenantWorld, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    actor = Actor(user=world_a.owner)
    deployment = _served(world_a)
    app = "acme.assistant"
    v2_dir = write_tiny_checkpoint(tmp_path / "v2", seed=7)
    v2 = _ready_version(world_a, v2_dir, "v2")
    assert [p["prompt"] for p in v2.golden["prompts"]] == list(DEFAULT_PROMPTS)
    deployments.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=10
    )
    _apply(ray_cluster, [app, f"{app}.canary"])

    # The beat's probe picks the deployments whose contract names the SLI (this one only).
    contracts.contract_set(
        tenant=world_a.tenant, actor=actor, deployment=deployment, source=CONSISTENCY_CONTRACT
    )
    scores = consistency_probe(serve_url=ray_cluster.serve_url)
    assert set(scores) == {(deployment.pk, "stable"), (deployment.pk, "canary")}, scores
    assert scores[(deployment.pk, "stable")]["score"] == 1.0, scores
    assert scores[(deployment.pk, "canary")]["score"] == 1.0, scores
    stored = redis.Redis.from_url(settings.REDIS_URL).hget(
        consistency_key(), consistency_field(deployment.pk, "canary")
    )
    assert json.loads(stored)["score"] == 1.0
    assert "8/8 replies" in consistency_scores(deployment.pk)["stable"]["detail"]

    # The canary's artifact is swapped for other weights, then hot-reloaded (the
    # weight_swap_jitter fault reloads the same path): its answers leave the recorded ones.
    other = write_tiny_checkpoint(tmp_path / "other", seed=8)
    # Beside the file, then renamed over it: the replica maps the file it serves, and a
    # rewrite in place would kill it (SIGBUS) rather than leave the reload to pick it up.
    shutil.copyfile(other / "model.safetensors", v2_dir / "model.safetensors.new")
    os.replace(v2_dir / "model.safetensors.new", v2_dir / "model.safetensors")
    issued = time.time()
    faults = {
        "canary": {
            "drill": "consistency",
            "issued_at": issued,
            "expires_at": issued + 300,
            "weight_swap_jitter": {"reload": 1},
        }
    }
    deployments.deployment_change(
        tenant=world_a.tenant,
        actor=actor,
        deployment=deployment,
        changes={"faults": faults},
        reason="test: reload the tampered canary",
    )
    _apply(ray_cluster, [app, f"{app}.canary"])
    started = time.monotonic()
    deadline = started + 60
    while True:
        scores = consistency_probe(serve_url=ray_cluster.serve_url, deployment_ids=[deployment.pk])
        if scores[(deployment.pk, "canary")]["score"] < 1.0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    canary = scores[(deployment.pk, "canary")]
    print(f"consistency after the bad reload: {canary} ({time.monotonic() - started:.1f} s)")
    assert canary["score"] < 1.0, canary
    assert "recorded" in canary["detail"], canary
    assert scores[(deployment.pk, "stable")]["score"] == 1.0, scores
