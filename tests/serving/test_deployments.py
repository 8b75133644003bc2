"""Deployments without Ray: revisions of desired state, quotas, keys, the compiled config."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from django.urls import reverse
from ray.serve.schema import ServeDeploySchema

from portal.exceptions import ConflictError, QuotaExceeded, ValidationFailed
from serving.control.cluster import RayTarget
from serving.control.compile import restart_free
from serving.deployments import services
from serving.deployments.keys import cache_salt_hex
from serving.deployments.models import Deployment, DeploymentRevision, InferenceKey
from serving.deployments.specs import compiled_config, desired_state
from serving.registry import services as registry
from tenants.actors import Actor
from tenants.models import AuditEvent, Quota
from tests.conftest import TenantWorld, world_checkpoint

pytestmark = pytest.mark.django_db

TARGET = RayTarget(
    address="127.0.0.1:1",
    dashboard_url="http://127.0.0.1:1",
    serve_url="http://127.0.0.1:2",
    token="t",
    serve_http_options={"host": "127.0.0.1", "port": 8001},
)


def _second_version(world: TenantWorld, label: str = "v2", **kwargs: Any) -> Any:
    version = registry.version_register_path(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        model=world.model,
        label=label,
        path=str(world_checkpoint()),
        **kwargs,
    )
    return registry.version_validate(tenant=world.tenant, version_id=version.pk) or version


@pytest.fixture(autouse=True)
def _ready_world_versions(request: pytest.FixtureRequest) -> None:
    """Validation runs on commit; these tests run inside one transaction, so run it here."""
    for name in ("world_a", "world_b"):
        if name in request.fixturenames:
            world = request.getfixturevalue(name)
            registry.version_validate(tenant=world.tenant, version_id=world.version.pk)
            world.version.refresh_from_db()


def _create(world: TenantWorld, name: str = "chat", **settings: Any) -> tuple[Deployment, str]:
    return services.deployment_create(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        name=name,
        version_id=world.version.pk,
        settings={"num_cpus": 0.5, **settings},
    )


def test_create_makes_revision_one_and_a_key_shown_once(world_a: TenantWorld) -> None:
    deployment, key = _create(world_a)
    revision = deployment.current_revision
    assert revision is not None and revision.number == 1
    assert revision.stable_version_id == world_a.version.pk
    assert key.startswith("ik_")
    stored = InferenceKey.objects.get(deployment=deployment)
    assert stored.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key not in str(InferenceKey.objects.values_list())  # only the hash at rest
    assert revision.key_hashes == [stored.key_hash]
    created = AuditEvent.objects.filter(action="deployment.created", object_id=str(deployment.pk))
    assert created.count() == 1


def test_every_change_is_a_new_immutable_revision(world_a: TenantWorld) -> None:
    deployment, _ = _create(world_a)
    actor = Actor(user=world_a.owner)
    v2 = _second_version(world_a)
    services.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    services.deployment_set_traffic(
        tenant=world_a.tenant, actor=actor, deployment=deployment, percent=50
    )
    services.deployment_promote(tenant=world_a.tenant, actor=actor, deployment=deployment)
    numbers = list(deployment.revisions.order_by("number").values_list("number", "reason"))
    assert [n for n, _ in numbers] == [1, 2, 3, 4]
    final = DeploymentRevision.objects.get(deployment=deployment, number=4)
    assert final.stable_version_id == v2.pk and final.canary_version_id is None
    first = DeploymentRevision.objects.get(deployment=deployment, number=1)
    first.canary_percent = 99
    with pytest.raises(ValueError, match="immutable"):
        first.save()
    # No change, no revision.
    services.deployment_change(
        tenant=world_a.tenant, actor=actor, deployment=deployment, changes={}, reason="noop"
    )
    assert deployment.revisions.count() == 4


def test_weights_only_changes_compile_to_user_config_changes(world_a: TenantWorld) -> None:
    deployment, _ = _create(world_a)
    actor = Actor(user=world_a.owner)
    v2 = _second_version(world_a)
    services.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=20
    )
    before, _ = compiled_config(TARGET)
    ServeDeploySchema.model_validate(before)
    services.deployment_set_traffic(
        tenant=world_a.tenant, actor=actor, deployment=deployment, percent=80
    )
    after, _ = compiled_config(TARGET)
    assert restart_free(before, after)
    router = next(a for a in after["applications"] if a["name"] == "acme.chat")
    config = router["deployments"][0]["user_config"]
    assert config["canary_percent"] == 80 and config["revision"] == 3
    tenants = config["local"]["tenants"]  # the stable slot, served in the router's replicas
    assert tenants == {
        str(world_a.tenant.pk): {"salt": cache_salt_hex(world_a.tenant.pk), "quota_blocks": None}
    }
    services.deployment_change(
        tenant=world_a.tenant,
        actor=actor,
        deployment=deployment,
        changes={"num_cpus": 0.75},
        reason="scale",
    )
    assert not restart_free(after, compiled_config(TARGET)[0])


def test_tenants_get_different_server_side_salts(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    _create(world_a)
    _create(world_b)
    specs, _, _ = desired_state()
    salts = {s.tenant_slug: s.cache_salt_hex for s in specs}
    assert salts["acme"] != salts["globex"] and len(salts["acme"]) == 64


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"num_replicas": 5}, "num_replicas"),  # default quota: 4 replicas
        ({"num_gpus": 2}, "num_gpus"),  # default quota: 1 GPU
        ({"kv_blocks": 8192}, "kv_blocks"),  # default quota: 4096 blocks
        ({"autoscaling": {"min_replicas": 1, "max_replicas": 9}}, "num_replicas"),
    ],
)
def test_quotas_refuse_with_the_field(
    world_a: TenantWorld, settings: dict[str, Any], field: str
) -> None:
    with pytest.raises(QuotaExceeded) as caught:
        _create(world_a, **settings)
    assert caught.value.field == field
    assert Deployment.objects.filter(tenant=world_a.tenant).count() == 1  # the world's own


def test_deployment_count_quota(world_a: TenantWorld) -> None:
    Quota.objects.filter(tenant=world_a.tenant).update(max_deployments=2)
    _create(world_a)  # the world's own deployment is the first
    with pytest.raises(QuotaExceeded) as caught:
        _create(world_a, name="second")
    assert caught.value.field == "max_deployments"


def test_a_canary_counts_against_the_replica_quota(world_a: TenantWorld) -> None:
    deployment, _ = _create(world_a, num_replicas=3)
    v2 = _second_version(world_a)
    with pytest.raises(QuotaExceeded, match="7 replicas in all"):
        services.deployment_set_canary(
            tenant=world_a.tenant,
            actor=Actor(user=world_a.owner),
            deployment=deployment,
            version_id=v2.pk,
            percent=10,
        )
    assert deployment.revisions.count() == 1


def test_bad_settings_name_the_field(world_a: TenantWorld) -> None:
    cases = [
        ({"name": "Bad_Name"}, "name"),
        ({"breaker": {"failure_rate": 2}}, "breaker.failure_rate"),
        ({"breaker": {"canary_alpha": 0.9}}, "breaker.canary_alpha"),
        ({"breaker": {"slow_ms": -1}}, "breaker.slow_ms"),
        ({"guard": {"max_tokns": 5}}, "guard.max_tokns"),
        ({"kv_mode": "shared"}, "pool"),
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "autoscaling.max_replicas"),
    ]
    for settings, field in cases:
        name = settings.pop("name", "chat")
        with pytest.raises(ValidationFailed) as caught:
            _create(world_a, name=name, **settings)
        assert caught.value.field == field, settings
    assert list(Deployment.objects.values_list("name", flat=True)) == ["assistant"]


def test_only_ready_versions_of_this_tenant_deploy(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    with pytest.raises(ValidationFailed) as foreign:
        services.deployment_create(
            tenant=world_a.tenant,
            actor=Actor(user=world_a.owner),
            name="x",
            version_id=world_b.version.pk,
        )
    assert foreign.value.field == "version"
    broken = _second_version(world_a, "broken", sha256="0" * 64)
    with pytest.raises(ConflictError, match="only ready versions"):
        services.deployment_create(
            tenant=world_a.tenant,
            actor=Actor(user=world_a.owner),
            name="x",
            version_id=broken.pk,
        )


def test_key_rotation_is_a_revision_and_revoked_keys_leave_the_router(
    world_a: TenantWorld,
) -> None:
    deployment, _ = _create(world_a)
    actor = Actor(user=world_a.owner)
    key, raw = services.inference_key_create(
        tenant=world_a.tenant, actor=actor, deployment=deployment, name="ci"
    )
    deployment.refresh_from_db()
    assert key.key_hash in deployment.current_revision.key_hashes
    services.inference_key_revoke(tenant=world_a.tenant, actor=actor, key=key)
    deployment.refresh_from_db()
    assert key.key_hash not in deployment.current_revision.key_hashes
    assert deployment.current_revision.number == 3


def test_deleted_deployments_leave_the_config(world_a: TenantWorld) -> None:
    deployment, _ = _create(world_a)

    def names() -> set[str]:
        return {a["name"] for a in compiled_config(TARGET)[0]["applications"]}

    assert {"acme.chat", "acme.assistant"} == names()
    services.deployment_delete(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment
    )
    assert names() == {"acme.assistant"}
    _create(world_a)  # the name is free again


def test_api_create_canary_promote_delete(world_a: TenantWorld) -> None:
    client = world_a.client("token")
    response = client.post(
        reverse("deployment-list"),
        {"name": "chat", "version": world_a.version.pk, "num_cpus": 0.5},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["inference_key"].startswith("ik_")
    assert body["route"] == "/acme/chat/v1" and body["revision"]["number"] == 1
    pk = body["id"]
    v2 = _second_version(world_a)
    response = client.post(
        reverse("deployment-canary", args=[pk]), {"version": v2.pk, "percent": 20}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["revision"]["canary_percent"] == 20
    response = client.post(reverse("deployment-promote", args=[pk]))
    assert response.status_code == 200
    revisions = client.get(reverse("deployment-revisions", args=[pk])).json()
    assert [r["number"] for r in revisions] == [3, 2, 1]
    assert "inference_key" not in client.get(reverse("deployment-detail", args=[pk])).json()
    response = client.post(
        reverse("deployment-list"),
        {"name": "big", "version": world_a.version.pk, "num_gpus": 5},
        format="json",
    )
    assert response.status_code == 403
    assert list(response.json()["error"]["fields"]) == ["num_gpus"]
    assert client.delete(reverse("deployment-detail", args=[pk])).status_code == 204
    assert client.get(reverse("deployment-detail", args=[pk])).status_code == 404


def _vllm_version(world: TenantWorld, label: str = "v-vllm") -> Any:
    """A version marked validated for both engines (vLLM's own checks run in the Ray tests)."""
    version = _second_version(world, label)
    version.engines = ["builtin", "vllm"]
    version.save(update_fields=["engines"])
    return version


def test_the_engine_is_chosen_per_slot_and_follows_the_canary_on_promotion(
    world_a: TenantWorld,
) -> None:
    actor = Actor(user=world_a.owner)
    deployment, _ = _create(world_a)
    assert deployment.current_revision.engine == {"name": "builtin"}
    with pytest.raises(ValidationFailed) as refused:  # validated for the built-in engine only
        services.deployment_change(tenant=world_a.tenant, actor=actor, deployment=deployment,
                                   changes={"engine": "vllm"}, reason="vllm")  # fmt: skip
    assert refused.value.field == "engine"
    v2 = _vllm_version(world_a)
    services.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=deployment, version_id=v2.pk, percent=10,
        engine={"name": "vllm", "max_num_seqs": 4},
    )  # fmt: skip
    revision = deployment.current_revision
    assert revision.engine == {"name": "builtin"}
    assert revision.canary_engine["name"] == "vllm" and revision.canary_engine["max_num_seqs"] == 4
    spec = next(s for s in desired_state()[0] if s.deployment_id == deployment.pk)
    assert spec.canary is not None and spec.canary.is_vllm and not spec.stable.is_vllm
    # A fault that acts on the built-in engine's machinery is refused on the vLLM slot.
    with pytest.raises(ValidationFailed) as refused:
        services.deployment_change(
            tenant=world_a.tenant, actor=actor, deployment=deployment,
            changes={"faults": {"canary": {"weight_swap_jitter": {"reload": 5}}}}, reason="x",
        )  # fmt: skip
    assert refused.value.field == "faults.canary.weight_swap_jitter"
    promoted = services.deployment_promote(
        tenant=world_a.tenant, actor=actor, deployment=deployment, skip_gate=True
    )
    assert promoted.engine["name"] == "vllm" and promoted.canary_engine is None
    assert promoted.stable_version_id == v2.pk


def test_a_shared_deployment_runs_on_its_pools_engine(world_a: TenantWorld) -> None:
    from serving.deployments.models import SharedPool

    pool = SharedPool.objects.create(name="p", model_version=world_a.version)
    pool.allowed_tenants.add(world_a.tenant)
    with pytest.raises(ValidationFailed) as refused:
        _create(world_a, "pooled", kv_mode="shared", pool="p", engine="vllm")
    assert refused.value.field == "engine"


def test_the_api_shows_and_takes_the_engine(world_a: TenantWorld) -> None:
    v2 = _vllm_version(world_a)
    api = world_a.client()
    created = api.post("/api/v1/deployments/", {"name": "llm", "version": v2.pk, "num_cpus": 0.5,
                       "engine": {"name": "vllm", "dtype": "bfloat16"}}, format="json")  # fmt: skip
    assert created.status_code == 201, created.content
    engine = created.json()["revision"]["engine"]
    assert engine["name"] == "vllm" and engine["dtype"] == "bfloat16"
    version = api.get(f"/api/v1/models/{world_a.model.pk}/versions/{v2.pk}/").json()
    assert version["engines"] == ["builtin", "vllm"]
    bad = api.post(f"/api/v1/models/{world_a.model.pk}/versions/",
                   {"label": "x", "path": str(world_checkpoint()), "engines": ["tgi"]},
                   format="json")  # fmt: skip
    assert bad.status_code == 400 and list(bad.json()["error"]["fields"]) == ["engines"]
