"""Device-memory fragmentation through the GPU sample pipeline: the agent (a simulated node, and
a real-GPU node whose NVML is faked at the hardware edge while its replica publishes its CUDA
allocator report through the real Redis), the tenant's GPU page (labelled simulated where it is)
and /metrics."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import Client, override_settings

from serving.dataplane.sli import SliRecorder, publish
from serving.telemetry.keys import gpu_keys
from serving.telemetry.providers.nvml import NvmlProvider
from serving.telemetry.providers.simulated import SimulatedProvider
from tests.conftest import TenantWorld
from tests.serving.test_gpu_agent import _agent, _fake_nvml, _step
from tests.serving.test_ops_loop import _ready

pytestmark = pytest.mark.django_db(transaction=True)  # the agent reads from its own threads

GIB = 1 << 30


@pytest.fixture(autouse=True)
def _no_old_nodes() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(gpu_keys()["latest"], gpu_keys()["status"])
    client.close()


def _publish_replica(app: str, name: str, pid: int, kv: dict[str, Any]) -> None:
    """A replica's SLI window with its KV stats, published as a version replica does."""
    recorder = SliRecorder(app, "stable", "tiny:v1", name)
    snapshot = {**recorder.roll(kv=kv), "pid": pid}

    async def send() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        await publish(client, settings.SLI_KEY_PREFIX, snapshot)
        await client.aclose()

    asyncio.run(send())


def test_the_page_shows_the_simulated_fragmentation_as_simulated(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = _ready(world_a)
    app = f"{world_a.tenant.slug}.{deployment.name}"
    _publish_replica(app, "a1", os.getpid(), {"num_blocks": 64, "free_blocks": 48})
    provider = SimulatedProvider(devices=2, seed=11)
    agent = _agent(provider, simulate=True)
    for _ in range(3):
        snapshot = _step(agent)
    [process] = snapshot["processes"]
    assert process["tenant_id"] == world_a.tenant.pk
    [device] = [d for d in snapshot["devices"] if d["uuid"] == process["device_uuid"]]
    assert device["fragmentation_source"] == "simulated"
    assert 0 <= device["fragmentation"] <= 1 and device["mem_largest_free"] <= device["mem_free"]

    page = world_a.client("owner")
    dashboard = page.get(f"/t/{world_a.tenant.slug}/gpus/")
    assert dashboard.status_code == 200
    assert f"/t/{world_a.tenant.slug}/gpus/memory/" in dashboard.content.decode()
    panel = page.get(f"/t/{world_a.tenant.slug}/gpus/memory/")
    assert panel.status_code == 200
    html = panel.content.decode()
    assert 'data-testid="gpu-memory-simulated"' in html and "SIMULATED" in html
    assert f'data-fragmentation="{device["fragmentation"]}"' in html
    assert "(simulated)" in html and "not a real measurement" in html
    # The neighbour's page shows none of this tenant's devices; a stranger gets nothing.
    other = world_b.client("owner").get(f"/t/{world_a.tenant.slug}/gpus/memory/")
    assert other.status_code in (403, 404)
    mine = world_b.client("owner").get(f"/t/{world_b.tenant.slug}/gpus/memory/")
    assert "None of your replicas is on a GPU" in mine.content.decode()
    assert "data-fragmentation" not in mine.content.decode()

    with override_settings(METRICS_TOKEN="s3cret-token"):
        text = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token").content.decode()
    assert "# TYPE portal_gpu_memory_fragmentation gauge" in text
    lines = [line for line in text.splitlines()
             if line.startswith("portal_gpu_memory_fragmentation{")]  # fmt: skip
    assert len(lines) == 2  # both simulated devices
    assert all('simulated="true"' in line and 'source="simulated"' in line for line in lines)
    assert any(f'tenant="{world_a.tenant.slug}"' in line for line in lines)
    assert "portal_gpu_memory_largest_free_mib{" in text


def test_a_real_gpu_combines_nvml_with_the_replicas_allocator_report(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = _ready(world_a)
    app = f"{world_a.tenant.slug}.{deployment.name}"
    # What serving.engine.memory.allocator_report publishes on a GPU replica (kv.device_memory).
    report = {"device": 0, "reserved": 30 * GIB, "allocated": 20 * GIB,
              "inactive": 10 * GIB, "largest_inactive": 2 * GIB, "driver_free": 6 * GIB,
              "total": 80 * GIB, "source": "cuda_caching_allocator"}  # fmt: skip
    _publish_replica(app, "a1", 4101, {"num_blocks": 64, "free_blocks": 48,
                                        "device_memory": report})  # fmt: skip
    fake = _fake_nvml(monkeypatch, {0: [(4101, 30 * GIB)]})
    fake.gpus[0].mem_free = 6 * GIB
    snapshot = _step(_agent(NvmlProvider()))
    first, second = snapshot["devices"]
    # 6 GiB outside the allocator + 10 GiB free inside it; the largest block is the 6 GiB.
    assert first["fragmentation_source"] == "nvml+cuda_allocator"
    assert first["mem_largest_free"] == 6 * GIB
    assert first["fragmentation"] == round(1 - 6 / 16, 4)
    assert second["fragmentation_source"] == "nvml" and second["fragmentation"] == 0.0

    html = world_a.client("owner").get(f"/t/{world_a.tenant.slug}/gpus/memory/").content.decode()
    assert "NVML + CUDA caching allocator" in html and "SIMULATED" not in html
    assert f'data-fragmentation="{first["fragmentation"]}"' in html
