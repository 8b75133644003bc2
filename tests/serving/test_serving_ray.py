"""The serving path on a real local Ray cluster: register -> validate -> deploy -> infer through
the Serve proxy -> canary split -> weights-only change keeps replicas -> hot reload under
traffic -> delete; and tenant isolation at the router and in a shared KV pool."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings
from django.utils import timezone

from serving.control.serve_api import AppStatus
from serving.dataplane.lifecycle import requests_key
from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, DeploymentStatus, SharedPool
from serving.engine.checkpoint import load_tensors, load_tokenizer
from serving.engine.config import read_config
from serving.engine.engine import Engine, SamplingParams
from serving.engine.model import LlamaModel
from serving.engine.testing import write_tiny_checkpoint
from serving.registry import artifacts, services
from tenants.actors import Actor
from tenants.models import Quota
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

PROMPT = "The quick brown fox jumps over the lazy dog."


def _apply(cluster: RayCluster, apps: list[str], timeout: float = 120) -> None:
    client = cluster.client()
    before = max((a.last_deployed_time_s for a in client.applications().values()), default=0)
    control.reconcile(target=cluster.target, client=client)
    client.wait_until(apps, deployed_after=before - 0.001, timeout=timeout)
    control.refresh_status(client=client)


def _post(http: httpx.Client, url: str, key: str, **body: Any) -> httpx.Response:
    payload = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, **body}
    return http.post(url, json=payload, headers={"authorization": f"Bearer {key}"})


def _served(world: TenantWorld) -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name="assistant")


def _key(world: TenantWorld, deployment: Deployment) -> str:
    _, raw = deployments.inference_key_create(
        tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment, name="test"
    )
    return raw


def _ready_version(world: TenantWorld, directory: Path, label: str) -> Any:
    model = _served(world).current_revision.stable_version.model
    version = services.version_register_path(
        tenant=world.tenant, actor=Actor(user=world.owner), model=model, label=label,
        path=str(directory),
    )  # fmt: skip
    return services.version_validate(tenant=world.tenant, version_id=version.pk)


def _greedy(directory: Path, text: str, n: int) -> str:
    config = read_config(directory)
    tokenizer = load_tokenizer(directory)
    model = LlamaModel(config, load_tensors(directory, config))
    params = SamplingParams(max_tokens=n, temperature=0)
    seq = Engine(model).generate([tokenizer.encode(text).ids], params)[0]
    return str(tokenizer.decode(seq.output_ids))


def _completed_lifecycle(app: str, request_id: str, timeout: float = 10) -> Any:
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = requests_key(settings.SLI_KEY_PREFIX, app)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for raw in client.hgetall(key).values():
            for life in json.loads(raw)["recent"]:
                if life["request_id"] == request_id and life["state"] == "completed":
                    return life
        time.sleep(0.3)
    raise AssertionError(f"no completed lifecycle for {request_id} in {key}")


def _pids(cluster: RayCluster, app: str) -> set[int]:
    return {r.pid for r in cluster.client().replicas(app) if r.pid}


def test_deploy_infer_canary_reload_delete(
    world_a: TenantWorld, world_b: TenantWorld, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    actor = Actor(user=world_a.owner)
    deployment = _served(world_a)
    key = _key(world_a, deployment)
    key_b = _key(world_b, _served(world_b))
    app = "acme.assistant"
    _apply(ray_cluster, [app, "globex.assistant"])
    deployment.refresh_from_db()
    revision = deployment.current_revision
    assert deployment.status == DeploymentStatus.RUNNING, deployment.status_message
    assert revision.applied_at is not None and revision.converged_at is not None
    # Idempotent: the same desired state is not applied again.
    again = control.reconcile(target=ray_cluster.target)
    assert again.ok and again.skipped

    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    with httpx.Client(timeout=30, trust_env=False) as http:
        trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        answer = http.post(
            url,
            json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0},
            headers={"authorization": f"Bearer {key}", "traceparent": trace},
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-ab-group"] == "stable"
        assert answer.headers["traceparent"].split("-")[1] == trace.split("-")[1]
        assert answer.json()["usage"]["completion_tokens"] == 4
        # Another tenant's key on this route, and a made-up key: refused at the router.
        assert _post(http, url, key_b).status_code == 401
        assert _post(http, url, "ik_made_up").status_code == 401
        # The guard says why.
        too_long = _post(http, url, key, max_tokens=100000)
        assert too_long.status_code == 400 and "max_tokens" in too_long.json()["error"]["message"]
        # Streaming (SSE) on the chat route.
        with http.stream(
            "POST",
            f"{ray_cluster.serve_url}/acme/assistant/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                  "stream": True},
            headers={"authorization": f"Bearer {key}"},
        ) as stream:  # fmt: skip
            assert stream.status_code == 200
            events = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        # Every request's lifecycle, with a timestamp per state, as the router publishes it.
        life = _completed_lifecycle(app, answer.headers["x-request-id"])
        order = ["pending", "validating", "routing", "executing", "completed"]
        assert list(life["times"]) == order and life["group"] == "stable"
        assert [life["times"][s] for s in order] == sorted(life["times"][s] for s in order)
        # What the request inspector shows of it: the trace, who answered, tokens, hits.
        assert life["trace_id"] == trace.split("-")[1] and life["status"] == 200
        assert life["version"] == answer.headers["x-model-version"] and life["replica"]
        assert life["pid"] in _pids(ray_cluster, app) and life["completion_tokens"] == 4
        assert isinstance(life["prefix_hit_tokens"], int)  # the built-in engine reports it

        # Canary at 20%: about 20% of 500 answers come from it.
        v2_dir = write_tiny_checkpoint(tmp_path / "v2", seed=7)
        v2 = _ready_version(world_a, v2_dir, "v2")
        deployments.deployment_set_canary(
            tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk,
            percent=20,
        )  # fmt: skip
        _apply(ray_cluster, [app, f"{app}.canary"])
        groups: Counter[str] = Counter()
        lock = threading.Lock()

        def hammer(n: int) -> None:
            with httpx.Client(timeout=30, trust_env=False) as own:
                for _ in range(n):
                    response = _post(own, url, key)
                    assert response.status_code == 200, response.text
                    with lock:
                        groups[response.headers["x-ab-group"]] += 1

        threads = [threading.Thread(target=hammer, args=(125,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(groups.values()) == 500
        assert 0.14 <= groups["canary"] / 500 <= 0.26, groups

        # Weights only (traffic 50%): the same replica processes serve on.
        before = {name: _pids(ray_cluster, name) for name in (app, f"{app}.canary")}
        started = time.monotonic()
        deployments.deployment_set_traffic(
            tenant=world_a.tenant, actor=actor, deployment=deployment, percent=50
        )
        control.reconcile(target=ray_cluster.target)
        seen: Counter[str] = Counter()
        while time.monotonic() - started < 20:
            seen.clear()
            for _ in range(60):
                seen[_post(http, url, key).headers["x-ab-group"]] += 1
            if seen["canary"] >= 18:
                break
        assert 18 <= seen["canary"] <= 42, seen
        after = {name: _pids(ray_cluster, name) for name in before}
        assert after == before and all(after.values())

        # Promote under traffic: the stable slot hot-reloads v2 (no restart, no failed
        # request), and every answer comes from one set of weights, never a mix.
        old_text = _greedy(
            artifacts.local_directory(revision.stable_version.artifact_uri), PROMPT, 6
        )
        new_text = _greedy(v2_dir, PROMPT, 6)
        assert old_text != new_text
        failures: list[str] = []
        texts: Counter[str] = Counter()
        stop = threading.Event()

        def traffic() -> None:
            with httpx.Client(timeout=30, trust_env=False) as own:
                while not stop.is_set():
                    response = _post(own, url, key, max_tokens=6)
                    if response.status_code != 200:
                        failures.append(response.text)
                    else:
                        texts[response.json()["choices"][0]["text"]] += 1

        runner = threading.Thread(target=traffic)
        runner.start()
        try:
            stable_pids = _pids(ray_cluster, app)  # the router serves stable in-process
            deployments.deployment_promote(
                tenant=world_a.tenant, actor=actor, deployment=deployment
            )
            _apply(ray_cluster, [app])
            deadline = time.monotonic() + 30
            while texts[new_text] < 5 and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            stop.set()
            runner.join()
        assert not failures, failures[:3]
        assert set(texts) <= {old_text, new_text}, texts
        assert texts[new_text] >= 5
        assert _pids(ray_cluster, app) == stable_pids  # hot reload, no restart
        # The canary's application goes away (Serve deletes it in the background).
        ray_cluster.client().wait_until([f"{app}.canary"], [AppStatus.ABSENT], timeout=60)

    # Delete: Serve forgets the deployment's applications.
    deployments.deployment_delete(tenant=world_a.tenant, actor=actor, deployment=deployment)
    control.reconcile(target=ray_cluster.target)
    ray_cluster.client().wait_until([app], [AppStatus.ABSENT], timeout=60)
    control.refresh_status(client=ray_cluster.client())
    deployment.refresh_from_db()
    assert deployment.status == DeploymentStatus.DELETED


def published_window(app: str, group: str, need: Any, timeout: float = 15) -> dict[str, Any]:
    """The first SLI window a replica of `app`'s `group` published to Redis that satisfies
    `need` (polled until `timeout`)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.SLI_KEY_PREFIX}:sli:{app}:{group}"
    deadline = time.monotonic() + timeout
    seen: list[Any] = []
    while time.monotonic() < deadline:
        seen = [json.loads(raw) for raw in client.hgetall(key).values()]
        for window in seen:
            if need(window):
                return dict(window)
        time.sleep(0.3)
    raise AssertionError(f"no window under {key} matched: {[w.get('kv') for w in seen]}")


def _pool_stats(pool_app: str, tenant_ids: list[str], need: Any, timeout: float = 15) -> Any:
    """The shared pool's per-tenant KV stats, as its replica publishes them to Redis."""

    def tenants(window: dict[str, Any]) -> dict[str, Any]:
        mine = window.get("kv", {}).get("tenants", {})
        return {t: mine.get(t, {}) for t in tenant_ids}

    return tenants(published_window(pool_app, "pool", lambda w: need(tenants(w)), timeout))


def test_shared_pool_keeps_tenants_prefixes_and_blocks_apart(
    world_a: TenantWorld, world_b: TenantWorld, ray_cluster: RayCluster
) -> None:
    served_version = _served(world_a).current_revision.stable_version
    pool = SharedPool.objects.create(
        name="tiny", model_version=served_version, num_cpus=0.25, kv_blocks=256
    )
    pool.allowed_tenants.add(world_a.tenant, world_b.tenant)  # the platform's grant
    Quota.objects.filter(tenant=world_a.tenant).update(max_kv_blocks=64)
    Quota.objects.filter(tenant=world_b.tenant).update(max_kv_blocks=16)
    keys = {}
    for world in (world_a, world_b):
        own_version = _served(world).current_revision.stable_version_id
        # The worlds' own dedicated deployments are not part of this test: keep Ray light.
        Deployment.objects.filter(tenant=world.tenant).update(deleted_at=timezone.now())
        _, keys[world.tenant.slug] = deployments.deployment_create(
            tenant=world.tenant,
            actor=Actor(user=world.owner),
            name="pooled",
            version_id=own_version,
            settings={"kv_mode": "shared", "pool": pool.name},
        )
    _apply(ray_cluster, ["platform.tiny.pool", "acme.pooled", "globex.pooled"])
    a, b = str(world_a.tenant.pk), str(world_b.tenant.pk)
    # ~130 tokens: 9 blocks of 16, within both tenants' quotas (64 and 16 blocks).
    long_prompt = " ".join(["Paged attention keeps the KV cache in fixed-size blocks."] * 4)
    with httpx.Client(timeout=30, trust_env=False) as http:
        url_a = f"{ray_cluster.serve_url}/acme/pooled/v1/completions"
        url_b = f"{ray_cluster.serve_url}/globex/pooled/v1/completions"
        assert _post(http, url_a, keys["acme"], prompt=long_prompt).status_code == 200
        assert _post(http, url_a, keys["acme"], prompt=long_prompt).status_code == 200
        first = _pool_stats("platform.tiny.pool", [a, b], lambda s: s[a].get("prefix_hits", 0) > 0)
        hits_a = first[a]["prefix_hits"]
        # B sends A's exact prompt: no hits for B (its salt differs), A unaffected.
        assert _post(http, url_b, keys["globex"], prompt=long_prompt).status_code == 200
        stats = _pool_stats(
            "platform.tiny.pool", [a, b], lambda s: s[b].get("prefix_queries", 0) > 0
        )
        assert stats[b]["prefix_hits"] == 0
        # B floods long distinct prompts far beyond its 16 blocks: it evicts only its own.
        for i in range(12):
            flood = f"{i} " + " ".join([f"flood {i} number {i * 7}"] * 6)  # ~100 tokens
            response = _post(http, url_b, keys["globex"], prompt=flood)
            assert response.status_code == 200, response.text
        # Beyond the quota altogether: refused with a reason, not a crash.
        huge = " ".join(["flood"] * 60)  # ~300 tokens: 19 blocks, B may hold 16
        refused = _post(http, url_b, keys["globex"], prompt=huge)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "kv_quota_exceeded"
        assert _post(http, url_a, keys["acme"], prompt=long_prompt).status_code == 200
        final = _pool_stats(
            "platform.tiny.pool", [a, b],
            lambda s: s[b].get("evictions", 0) > 0 and s[a].get("prefix_hits", 0) > hits_a,
        )  # fmt: skip
        assert final[a]["evictions"] == 0
        assert final[b]["blocks_used"] <= 16
        assert final[a]["prefix_hits"] == 2 * hits_a  # A's repeat still hits in full


def test_a_version_that_cannot_load_shows_failed_with_serves_message(
    world_a: TenantWorld, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    directory = write_tiny_checkpoint(tmp_path / "vanishing", seed=3)
    version = _ready_version(world_a, directory, "vanishing")
    Deployment.objects.filter(tenant=world_a.tenant).update(deleted_at=timezone.now())
    deployment, _ = deployments.deployment_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), name="broken",
        version_id=version.pk, settings={"num_cpus": 0.25},
    )  # fmt: skip
    (directory / "model.safetensors").unlink()  # gone after validation
    client = ray_cluster.client()
    control.reconcile(target=ray_cluster.target, client=client)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        control.refresh_status(client=client)
        deployment.refresh_from_db()
        if deployment.status == DeploymentStatus.FAILED:
            break
        time.sleep(1)
    assert deployment.status == DeploymentStatus.FAILED, deployment.status
    assert "safetensors" in deployment.status_message
    assert deployment.current_revision.serve_status == "FAILED"


def test_an_unreachable_cluster_fails_the_run_and_records_why(world_a: TenantWorld) -> None:
    from serving.control.cluster import RayTarget
    from serving.control.serve_api import ServeApiError
    from serving.deployments.models import ReconcileRun

    nowhere = RayTarget(
        address="127.0.0.1:1", dashboard_url="http://127.0.0.1:1", serve_url="http://127.0.0.1:1",
        token="x",
    )  # fmt: skip
    with pytest.raises(ServeApiError):
        control.reconcile(target=nowhere)
    run = ReconcileRun.objects.order_by("-pk").first()
    assert run is not None and not run.ok and "unreachable" in run.error


def test_a_stale_config_landing_late_is_found_and_replaced(
    world_a: TenantWorld, ray_cluster: RayCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead reconciler's PUT that Serve applies after a newer one: the status refresh sees
    the router running an older revision than the portal applied, and applies the newest."""
    from datetime import timedelta

    from serving.deployments.tasks import refresh_deployment_status

    deployment = _served(world_a)
    Deployment.objects.exclude(pk=deployment.pk).update(deleted_at=timezone.now())
    app = f"{world_a.tenant.slug}.assistant"
    _apply(ray_cluster, [app])
    stale, _ = control.compiled_config(ray_cluster.target)
    old = deployment.current_revision.number
    deployments.deployment_change(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        changes={"guard": {"max_tokens": 64}}, reason="a newer revision",
    )  # fmt: skip
    _apply(ray_cluster, [app])
    client = ray_cluster.client()
    new = Deployment.objects.get(pk=deployment.pk).current_revision
    assert client.applications()[app].router_revision == new.number != old
    client.put(stale)  # the late PUT
    deadline = time.monotonic() + 30
    while client.applications()[app].router_revision != old and time.monotonic() < deadline:
        time.sleep(0.3)
    assert control.config_drift(client.applications()) == []  # within the grace: rollout lag
    type(new).objects.filter(pk=new.pk).update(applied_at=timezone.now() - timedelta(seconds=60))
    assert control.config_drift(client.applications()) == [app]
    # The beat task, pointed at this cluster, puts the newest config back.
    for name, value in ray_cluster.portal_env().items():
        monkeypatch.setenv(name, value)
    refresh_deployment_status()
    deadline = time.monotonic() + 30
    while client.applications()[app].router_revision != new.number and time.monotonic() < deadline:
        time.sleep(0.3)
    assert client.applications()[app].router_revision == new.number
