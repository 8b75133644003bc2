"""The KV integrity health item without Ray: a real version core (its engine on a tiny model)
publishes its scan with the SLI window to the real Redis; the health page shows it ok, then
bad once the pool is corrupted, and the health tick opens one incident (a page) however many
ticks see it. On a real cluster: tests/serving/test_kv_integrity_ray.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse

from incidents.models import Incident, SlaBreach
from serving.dataplane.sli import publish
from serving.dataplane.version import VersionCore
from serving.deployments.keys import cache_salt_hex
from serving.deployments.models import Deployment
from serving.engine.async_engine import AsyncEngine
from serving.engine.checkpoint import load_tensors
from serving.engine.config import read_config
from serving.engine.engine import Engine, SamplingParams
from serving.engine.model import LlamaModel
from serving.engine.testing import write_tiny_checkpoint
from serving.ops import health
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

PROMPT = list(range(5, 50))


def _core(tmp_path: Path, deployment: Deployment) -> VersionCore:
    directory = write_tiny_checkpoint(tmp_path / "ckpt", seed=1)
    config = read_config(directory)
    model = LlamaModel(config, load_tensors(directory, config), fingerprint="tiny")
    revision = deployment.current_revision
    assert revision is not None
    version = f"{revision.stable_version.model.name}:{revision.stable_version.label}"
    core = VersionCore(deployment.serve_app, "stable", {})
    core.recorder.version, core.recorder.replica = version, "r1"
    core.engine = AsyncEngine(Engine(model, num_blocks=64))
    tenant = str(deployment.tenant_id)
    core.tenants = {tenant: {"salt": bytes.fromhex(cache_salt_hex(deployment.tenant_id))}}
    with core.engine._lock:  # two requests run to the end: their blocks stay cached
        engine = core.engine.engine
        salt = core.tenants[tenant]["salt"]
        for _ in range(2):
            seq = engine.add_request(
                PROMPT, SamplingParams(max_tokens=2), tenant=tenant, cache_salt=salt
            )
            engine.run_until_done([seq])
    return core


def _publish(core: VersionCore) -> dict[str, Any]:
    snapshot = core._published()

    async def send() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        await publish(client, settings.SLI_KEY_PREFIX, snapshot)
        await client.aclose()

    asyncio.run(send())
    return snapshot


def _item(client: Any, world: TenantWorld, deployment: Deployment) -> str:
    url = reverse(
        "serving-deployment-health-live", kwargs={"slug": world.tenant.slug, "pk": deployment.pk}
    )
    page = client.get(url).content.decode()
    return page.split('data-testid="kv-integrity"')[1].split("</section>")[0]


def test_a_corrupt_pool_turns_the_item_bad_and_opens_one_incident(
    client: Any, world_a: TenantWorld, tmp_path: Path
) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    client.force_login(world_a.viewer)
    assert _item(client, world_a, deployment).startswith(' data-state="no_data"')
    core = _core(tmp_path, deployment)
    try:
        snapshot = _publish(core)
        integrity = snapshot["kv"]["integrity"]
        assert integrity["ok"] and integrity["applies"] and integrity["checked"] == 64
        assert snapshot["kv"]["cached_blocks"] > 0
        item = _item(client, world_a, deployment)
        assert item.startswith(' data-state="ok"') and "violations now" in item
        health.tick(now=time.time(), act=True)
        assert not SlaBreach.objects.filter(deployment=deployment).exists()

        pool = core.engine.engine.pool
        cached = next(iter(pool._cached[str(deployment.tenant_id)]))
        pool._blocks[cached].tenant = "someone-else"  # a block handed to an unknown owner
        snapshot = _publish(core)
        assert snapshot["kv"]["integrity"]["counts"]["owner"] >= 1
        item = _item(client, world_a, deployment)
        assert item.startswith(' data-state="bad"') and 'data-kind="owner"' in item
        assert f"block {cached}" in item and "another tenant" in item

        for _ in range(3):  # every tick sees it; one breach, one incident
            health.tick(now=time.time(), act=True)
        breach = SlaBreach.objects.get(deployment=deployment)
        assert breach.objective == "kv-integrity:stable:r1" and breach.severity == "page"
        assert "owner" in breach.detail
        assert Incident.objects.filter(deployment=deployment).count() == 1

        pool._blocks[cached].tenant = str(deployment.tenant_id)  # healed: still shown
        snapshot = _publish(core)
        assert snapshot["kv"]["integrity"]["ok"]
        item = _item(client, world_a, deployment)
        assert item.startswith(' data-state="bad"')  # violated since the replica started
        assert '<strong data-testid="kv-violations-now">0</strong>' in item
    finally:
        core.engine.stop()
