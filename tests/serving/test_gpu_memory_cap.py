"""A tenant's GPU memory cap per replica (Quota.max_gpu_memory_mb_per_replica): set by platform
staff, refused at deployment create and change with the field named, compiled into every
replica's user_config, and enforced by the replica's engine (a real VersionCore on the tiny
checkpoint, no Ray): its KV blocks stay under the cap and a request past it is a 413."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from portal.exceptions import QuotaExceeded
from serving.dataplane.app import VersionCore
from serving.dataplane.guard import Refused
from serving.deployments import services
from serving.deployments.models import Deployment, SharedPool
from serving.deployments.replica_memory import slot_bytes
from serving.deployments.specs import compiled_config
from serving.engine.memory import CAP_FIELD, MIB
from serving.registry import services as registry
from tenants import services as tenant_services
from tenants.actors import Actor
from tenants.models import Quota
from tests.conftest import TenantWorld
from tests.serving.test_deployments import TARGET

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _validated(world_a: TenantWorld) -> None:
    """Validation runs on commit; these tests run inside one transaction, so run it here."""
    registry.version_validate(tenant=world_a.tenant, version_id=world_a.version.pk)
    world_a.version.refresh_from_db()


def _staff() -> Actor:
    user = get_user_model().objects.filter(username="sre@platform.example").first()
    if user is None:
        user = get_user_model().objects.create_user(
            "sre@platform.example", password="x" * 16, is_staff=True
        )
    return Actor(user=user)


def _set_cap(world: TenantWorld, mb: int) -> None:
    tenant_services.quota_update(tenant=world.tenant, actor=_staff(), changes={CAP_FIELD: mb})


def _create(world: TenantWorld, name: str = "chat", **settings: Any) -> Deployment:
    deployment, _ = services.deployment_create(
        tenant=world.tenant, actor=Actor(user=world.owner), name=name,
        version_id=world.version.pk, settings=settings,
    )  # fmt: skip
    return deployment


def _replica_mb(world: TenantWorld, kv_blocks: int) -> float:
    spec = {"kv_blocks": kv_blocks, "block_size": 16, "num_gpus": 0}
    sizes, _ = slot_bytes(world.version, {"name": "builtin"}, spec)
    return sizes["total"] / MIB


def test_platform_staff_set_the_cap_and_it_is_shown(world_a: TenantWorld) -> None:
    quota = Quota.objects.get(tenant=world_a.tenant)
    assert quota.max_gpu_memory_mb_per_replica == 24576  # the free plan's 24 GiB
    _set_cap(world_a, 40)
    body = world_a.client("owner").get(reverse("quota-list")).json()
    rows = body["results"] if isinstance(body, dict) else body
    assert rows[0][CAP_FIELD] == 40
    page = world_a.client("owner").get(reverse("tenant-settings", args=[world_a.tenant.slug]))
    assert page.status_code == 200 and "40 MiB" in page.content.decode()


def test_a_deployment_over_the_cap_is_refused_at_create_naming_the_field(
    world_a: TenantWorld,
) -> None:
    # The tiny model: ~0.4 MiB of weights, 8 KiB a KV block, ~28 MiB of activations at most.
    assert _replica_mb(world_a, 256) < 40 < _replica_mb(world_a, 3000)
    _set_cap(world_a, 40)
    before = Deployment.objects.filter(tenant=world_a.tenant).count()
    with pytest.raises(QuotaExceeded) as caught:
        _create(world_a, kv_blocks=3000)
    assert caught.value.field == "kv_blocks"
    assert CAP_FIELD in str(caught.value) and "40 MiB" in str(caught.value)
    assert Deployment.objects.filter(tenant=world_a.tenant).count() == before  # nothing written
    # Through the API: the same refusal, the field named in the body.
    response = world_a.client().post(
        "/api/v1/deployments/",
        {"name": "big", "version": world_a.version.pk, "kv_blocks": 3000},
        format="json",
    )
    assert response.status_code == 403, response.content
    error = response.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert "kv_blocks" in (error.get("fields") or {}) and CAP_FIELD in error["message"]
    # Within the cap: created.
    assert _create(world_a, kv_blocks=256).name == "chat"


def test_weights_alone_over_the_cap_name_the_version(world_a: TenantWorld) -> None:
    # The registry's summary of a 70B model (the summary is what the check reads).
    seventy_b = {
        "architecture": "LlamaForCausalLM", "vocab_size": 128256, "hidden_size": 8192,
        "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 8192,
        "parameters": 70_553_706_496,
    }  # fmt: skip
    type(world_a.version).objects.filter(pk=world_a.version.pk).update(config_summary=seventy_b)
    world_a.version.refresh_from_db()
    with pytest.raises(QuotaExceeded) as caught:
        _create(world_a)
    assert caught.value.field == "version"
    assert "weights 269," in str(caught.value)  # 70.5 G parameters x 4 bytes


def test_a_change_past_the_cap_is_refused_and_the_revision_stays(world_a: TenantWorld) -> None:
    deployment = _create(world_a)
    _set_cap(world_a, 40)
    revisions = deployment.revisions.count()
    with pytest.raises(QuotaExceeded) as caught:
        services.deployment_change(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
            changes={"kv_blocks": 3000}, reason="more cache",
        )  # fmt: skip
    assert caught.value.field == "kv_blocks"
    assert deployment.revisions.count() == revisions
    response = world_a.client().patch(
        f"/api/v1/deployments/{deployment.pk}/", {"kv_blocks": 3000}, format="json"
    )
    assert response.status_code == 403 and "kv_blocks" in response.json()["error"]["fields"]


def test_a_shared_deployment_is_capped_in_the_pool_not_refused(world_a: TenantWorld) -> None:
    pool = SharedPool.objects.create(
        name="tiny", model_version=world_a.version, num_cpus=0.25, kv_blocks=4096
    )
    pool.allowed_tenants.add(world_a.tenant)
    _set_cap(world_a, 40)
    _create(world_a, name="pooled", kv_mode="shared", pool=pool.name)
    config, _ = compiled_config(TARGET)
    pool_app = next(a for a in config["applications"] if a["name"] == "platform.tiny.pool")
    caps = pool_app["deployments"][0]["user_config"]["gpu_memory_mb"]
    assert caps == {str(world_a.tenant.pk): 40}


def _request(tenant: str, request_id: str, max_tokens: int) -> dict[str, Any]:
    sampling = {"max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0, "stream": False}
    return {"request_id": request_id, "tenant": tenant, "prompt": "the cap holds",
            "sampling": sampling, "guard": {}}  # fmt: skip


def _local_config(world: TenantWorld, deployment: Deployment) -> tuple[dict[str, Any], Any]:
    config, _ = compiled_config(TARGET)
    name = f"{world.tenant.slug}.{deployment.name}"
    app = next(a for a in config["applications"] if a["name"] == name)
    return app["deployments"][0]["user_config"]["local"], app["args"]["local"]


def test_the_replicas_engine_is_told_the_cap_and_holds_to_it(world_a: TenantWorld) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    tenant = str(world_a.tenant.pk)
    # The platform lowers the cap under a running deployment below what its replica needs for
    # weights and a step's activations (~24.4 MiB for the tiny model): nothing is left for KV.
    _set_cap(world_a, 24)
    local, args = _local_config(world_a, deployment)
    assert local["gpu_memory_mb"] == {tenant: 24}
    _set_cap(world_a, 25)  # what the platform sets next: the compiled config now
    raised, _ = _local_config(world_a, deployment)
    core = VersionCore(app=args["app"], group="stable", engine=args["engine"])

    async def scenario() -> None:
        await core.reconfigure({**local, "telemetry": {}})
        engine = core.engine.engine
        assert engine.memory.cap_blocks(tenant) == 0 and engine.pool.quota(tenant) == 0
        # Refused before it runs, with the reason and the field: not an out-of-memory crash.
        with pytest.raises(Refused) as refused:
            await core.complete(_request(tenant, "any", max_tokens=8))
        assert refused.value.status == 413 and refused.value.code == "gpu_memory_cap_exceeded"
        assert CAP_FIELD in refused.value.message and "24 MiB" in refused.value.message

        # A little more: room for some KV blocks, and the tenant's requests share just that.
        await core.reconfigure({**raised, "telemetry": {}})
        blocks = engine.memory.cap_blocks(tenant)
        assert blocks is not None and 0 < blocks < engine.pool.num_blocks
        assert engine.pool.quota(tenant) == blocks
        most = 0

        async def watch(stop: asyncio.Event) -> None:
            nonlocal most
            while not stop.is_set():
                tenants = core._kv_stats()["tenants"]
                most = max(most, tenants.get(tenant, {}).get("blocks_used", 0))
                await asyncio.sleep(0.001)

        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(stop))
        answers = await asyncio.gather(
            *(core.complete(_request(tenant, f"r{i}", max_tokens=400)) for i in range(12))
        )
        stop.set()
        await watcher
        assert all(a["usage"]["completion_tokens"] > 0 for a in answers)
        assert 0 < most <= blocks

    try:
        asyncio.run(scenario())
    finally:
        core.chaos.close()
        if core.engine is not None:
            core.engine.stop()
