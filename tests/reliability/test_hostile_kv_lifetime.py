"""The hostile-tenant suite, KV cache lifetime: a tenant's `kv_cache` is bounded (a 400 naming
the field, nothing written), reaches only its own entry of a shared pool's config, and in the
pool's engine acts on its own blocks only: turning prefix caching on never finds a neighbour's
blocks (salts keep chains apart whatever the policy), turning it off or a one-second max age
never frees or expires a neighbour's; another tenant's violations on the pool's health item
show without their detail."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from serving.control.compile import pool_apps
from serving.dataplane.kv_checks import policies_of
from serving.deployments import services
from serving.deployments.models import Deployment, SharedPool
from serving.deployments.specs import desired_state
from serving.engine.checkpoint import load_tensors
from serving.engine.config import read_config
from serving.engine.engine import Engine, SamplingParams, tenant_cache_salt
from serving.engine.kv_cache import CachePolicy
from serving.engine.kv_integrity import IntegrityScanner, scan_engine
from serving.engine.model import LlamaModel
from serving.engine.testing import write_tiny_checkpoint
from serving.ops.health.kv_integrity import slot_integrity
from serving.registry import services as registry
from tenants.actors import Actor
from tests.conftest import TenantWorld

SECRET = b"pool secret"
PROMPT = list(range(3, 60))


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LlamaModel:
    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("hostile-kv") / "ckpt", seed=3)
    config = read_config(directory)
    return LlamaModel(config, load_tensors(directory, config), fingerprint="tiny")


def _pool_engine(model: LlamaModel) -> Engine:
    return Engine(model, num_blocks=64, cache_secret=SECRET, quotas={"a": 32, "b": 32})


def test_prefix_caching_on_never_finds_a_neighbours_blocks(model: LlamaModel) -> None:
    engine = _pool_engine(model)
    engine.pool.set_policies({"a": CachePolicy(True), "b": CachePolicy(True)}, CachePolicy())
    engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="b")
    attacker = engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="a")[0]
    assert attacker.cached_tokens == 0  # the same prompt, another salt: nothing found
    victim = engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="b")[0]
    assert victim.cached_tokens > 0
    salts = {t: tenant_cache_salt(SECRET, t) for t in ("a", "b")}
    assert scan_engine(engine, IntegrityScanner(), salts=salts).violations == 0


def test_a_tenants_policy_never_frees_or_expires_a_neighbours_blocks(model: LlamaModel) -> None:
    clock = Clock()
    engine = _pool_engine(model)
    engine.pool.clock = clock
    engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="b")
    cached_b = set(engine.pool._cached["b"])
    engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="a")
    # A turns prefix caching off and its max age down to a second, then waits.
    engine.pool.set_policies({"a": CachePolicy(False, 1.0)}, CachePolicy())
    clock.now += 3600
    engine.pool.expire()
    assert not engine.pool._cached.get("a")
    assert set(engine.pool._cached["b"]) == cached_b
    assert engine.pool.stats["b"].expired == 0
    again = engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="b")[0]
    assert again.cached_tokens > 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"max_age_s": 0.001}, "kv_cache.max_age_s"),
        ({"max_age_s": 10**12}, "kv_cache.max_age_s"),
        ({"max_age_s": [30]}, "kv_cache.max_age_s"),
        ({"prefix_caching": "true"}, "kv_cache.prefix_caching"),
        ({"salt": "00" * 32}, "kv_cache.salt"),  # no way to pick a salt
        ({"x" * 5000: 1}, "kv_cache." + "x" * 40),
        ([1, 2], "kv_cache"),
    ],
)
def test_kv_cache_is_bounded_over_the_api(world_a: TenantWorld, value: Any, field: str) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    before = deployment.current_revision_id
    url = reverse("deployment-detail", args=[deployment.pk])
    response = world_a.client("token").patch(url, {"kv_cache": value}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == [field]
    deployment.refresh_from_db()
    assert deployment.current_revision_id == before


@pytest.mark.django_db
def test_a_pool_tenants_kv_cache_reaches_only_its_own_entry(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    for world in (world_a, world_b):
        registry.version_validate(tenant=world.tenant, version_id=world.version.pk)
    served = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    pool = SharedPool.objects.create(
        name="tiny",
        model_version=served.current_revision.stable_version,  # type: ignore[union-attr]
        kv_blocks=1024,
        min_tenants=4,
    )
    pool.allowed_tenants.add(world_a.tenant, world_b.tenant)
    for world, kv in ((world_a, {"prefix_caching": True, "max_age_s": 5}), (world_b, {})):
        services.deployment_create(
            tenant=world.tenant, actor=Actor(user=world.owner), name="pooled",
            version_id=world.version.pk,
            settings={"kv_mode": "shared", "pool": pool.name, "kv_cache": kv},
        )  # fmt: skip
    _, pools, _ = desired_state()
    config = pool_apps(pools[0], {})[0]["deployments"][0]["user_config"]
    a, b = str(world_a.tenant.pk), str(world_b.tenant.pk)
    assert config["tenants"][a]["kv_cache"] == {"prefix_caching": True, "max_age_s": 5.0}
    assert "kv_cache" not in config["tenants"][b] and "kv_cache" not in config
    tenants, default = policies_of(config)
    assert default == CachePolicy() and set(tenants) == {a}


def test_another_tenants_violation_shows_without_its_detail() -> None:
    replica = {
        "replica": "r1",
        "window": {"end": 1000.0},
        "kv": {
            "integrity": {
                "applies": True,
                "ok": False,
                "violations": 2,
                "violations_total": 2,
                "counts": {"owner": 1, "salt": 1},
                "samples": [
                    {"kind": "salt", "block": 4, "tenant": "7", "detail": "secret of seven"},
                    {"kind": "owner", "block": 5, "tenant": "8", "detail": "mine"},
                ],
            }
        },
    }
    item = slot_integrity([replica], "8", now=1000.5)
    assert item["state"] == "bad"
    theirs, mine = item["samples"]
    assert theirs == {"kind": "salt", "block": 4, "whose": "another tenant", "detail": ""}
    assert mine["whose"] == "yours" and mine["detail"] == "mine"
