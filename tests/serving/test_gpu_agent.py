"""The GPU agent without Ray: NVML's processes (a fake of the pynvml functions, the hardware
edge) mapped to the replicas that published their pid into the real Redis, per-tenant views,
the fan-out through the real Redis channel layer, downsampling into PostgreSQL, /metrics."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.test import Client, override_settings

from serving.telemetry import agent as gpu_agent
from serving.telemetry.agent import AgentConfig, Downsampler, GpuAgent, tenant_group
from serving.telemetry.models import GpuDeviceSample, GpuProcessSample
from serving.telemetry.providers.base import GpuProcess
from serving.telemetry.providers.nvml import NvmlProvider
from serving.telemetry.providers.simulated import SimulatedProvider
from serving.telemetry.services import store_samples
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import Replica, _ready
from tests.telemetry.test_providers import FakeGpu, FakeNvml

pytestmark = pytest.mark.django_db(transaction=True)  # the agent reads from its own threads

GIB = 1 << 30


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, processes: dict[int, list[tuple[int, int]]]) -> Any:
    """A fake of NVML with two devices; `processes[device] = [(pid, used bytes)]`."""
    gpus = [FakeGpu(uuid=f"GPU-{i}", processes=list(processes.get(i, []))) for i in range(2)]
    return FakeNvml(gpus).install(monkeypatch)


def _agent(provider: Any, **config: Any) -> GpuAgent:
    agent = GpuAgent(AgentConfig(node="node-a", **config), provider=provider)
    assert agent.open()
    return agent


def _step(agent: GpuAgent, now: float | None = None) -> dict[str, Any]:
    """One sample in a loop of its own, with Redis clients of that loop (closed after)."""

    async def run() -> dict[str, Any]:
        agent.layer = get_channel_layer()
        agent.redis = aioredis.Redis.from_url(settings.REDIS_URL)
        agent.log = gpu_agent.sample_log()
        try:
            return await agent.step(now)
        finally:
            await agent.log.aclose()
            await agent.redis.aclose()

    return async_to_sync(run)()


def test_nvml_processes_are_attributed_to_the_replicas_that_published_their_pid(
    world_a: TenantWorld, world_b: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = _ready(world_a)
    theirs = _ready(world_b)
    # Real replica snapshots (the data plane's SliRecorder + publish), with pids we choose.
    for deployment, name, pid in ((mine, "a1", 4101), (theirs, "b1", 4202)):
        replica = Replica(deployment, "stable", name)
        monkeypatch.setattr("os.getpid", lambda pid=pid: pid)
        replica.serve(ok=2)
    monkeypatch.undo()
    _fake_nvml(monkeypatch, {0: [(4101, 3 * GIB), (4202, 5 * GIB)], 1: [(9999, GIB)]})
    agent = _agent(NvmlProvider())
    snapshot = _step(agent)
    by_pid = {p["pid"]: p for p in snapshot["processes"]}
    assert by_pid[4101]["tenant_id"] == world_a.tenant.pk
    assert (by_pid[4101]["deployment"], by_pid[4101]["replica"]) == ("assistant", "a1")
    assert by_pid[4202]["tenant_id"] == world_b.tenant.pk
    assert by_pid[9999]["tenant_id"] is None  # not a portal replica: operators see it only
    views = gpu_agent.views(snapshot, agent.replicas, agent.owners)
    a_view = views[tenant_group(world_a.tenant.pk)]
    # Tenant A: the device its replica uses (totals), its own process, not B's nor the stranger.
    assert [d["index"] for d in a_view["devices"]] == [0]
    assert [(p["replica"], p["used_memory"]) for p in a_view["processes"]] == [("a1", 3 * GIB)]
    assert "pid" not in a_view["processes"][0] and "tenant" not in a_view["processes"][0]
    assert world_b.tenant.slug not in json.dumps(a_view)
    assert set(a_view["kv"]) == {"assistant"}
    node_view = views[gpu_agent.node_group("node-a")]
    assert {p["pid"] for p in node_view["processes"]} == {4101, 4202, 9999}


@pytest.mark.parametrize("kind", ["pubsub", "core"])
def test_samples_reach_the_tenant_group_through_the_redis_layer(
    world_a: TenantWorld, kind: str
) -> None:
    """Both layers CHANNEL_LAYER picks: pubsub (the default, what settings build) and core."""
    deployment = _ready(world_a)
    layer = get_channel_layer()
    assert type(layer).__name__ == "RedisPubSubChannelLayer"
    if kind == "core":
        from channels_redis.core import RedisChannelLayer

        layer = RedisChannelLayer(hosts=[settings.REDIS_URL], prefix="portal-test-core")
    provider = SimulatedProvider(devices=2, seed=7)

    async def scenario() -> list[dict[str, Any]]:
        channel = await layer.new_channel()
        await layer.group_add(tenant_group(world_a.tenant.pk), channel)
        agent = GpuAgent(
            AgentConfig(node="node-a", persist=False), provider=provider, layer=layer,
            redis_client=None,
        )  # fmt: skip
        assert agent.open()
        for _ in range(3):
            await agent.step()
        got = [await asyncio.wait_for(layer.receive(channel), 2) for _ in range(3)]
        await layer.group_discard(tenant_group(world_a.tenant.pk), channel)
        await agent.log.aclose()
        return got

    # No Redis client: no replica published a pid, so the simulated provider hosts one
    # stand-in process per serving deployment (demo mode), labelled simulated.
    messages = async_to_sync(scenario)()
    seqs = [gpu_agent.seq_key(m["seq"]) for m in messages]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    sample = json.loads(messages[-1]["data"])
    assert sample["simulated"] is True and sample["provider"] == "simulated"
    assert sample["processes"][0]["deployment"] == deployment.name
    assert sample["devices"] and sample["devices"][0]["name"].startswith("Simulated")


def test_one_second_and_one_minute_rows_are_means_of_the_samples(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = _ready(world_a)
    downsampler = Downsampler("node-a", simulated=False)
    owner = {"tenant_id": world_a.tenant.pk, "deployment_id": deployment.pk, "replica": "a1",
             "device_uuid": "GPU-0", "used_memory": 0}  # fmt: skip
    device = {"index": 0, "uuid": "GPU-0", "name": "Test GPU", "gpu_util": 0.0, "mem_util": 0.0,
              "mem_used": 0, "mem_free": 0, "mem_total": 80 * GIB, "temperature_c": 40.0,
              "power_w": 100.0, "sm_clock_mhz": 1500.0, "xid_errors": 0}  # fmt: skip
    start = 1_800_000_000.0  # on a minute
    rows: list[list[Any]] = [[], []]
    for i in range(5 * 65):  # 65 s at 5 Hz
        at = start + i * 0.2
        sample = {"at": at, "devices": [{**device, "gpu_util": float(i % 5) * 10,
                                          "temperature_c": 40.0 + (i % 5)}],
                  "processes": [{**owner, "used_memory": (i % 5) * GIB}]}  # fmt: skip
        devices, processes = downsampler.add(sample)
        rows[0] += devices
        rows[1] += processes
    seconds = [r for r in rows[0] if r.resolution == 1]
    minutes = [r for r in rows[0] if r.resolution == 60]
    assert len(seconds) == 64 and len(minutes) == 1
    assert all(r.samples == 5 and r.gpu_util == pytest.approx(20.0) for r in seconds)
    assert seconds[0].temperature_max_c == 44.0 and seconds[0].temperature_c == 42.0
    assert minutes[0].samples == 300 and minutes[0].at.timestamp() == start
    assert [r.used_memory for r in rows[1] if r.resolution == 1][0] == 2 * GIB
    store_samples(devices=rows[0], processes=rows[1])
    assert GpuDeviceSample.objects.count() == 65 and GpuProcessSample.objects.count() == 65
    assert GpuProcessSample.objects.filter(tenant=world_a.tenant).count() == 65


def test_without_a_gpu_the_agent_says_so_and_keeps_running(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import pynvml

    FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).install(monkeypatch)
    agent = GpuAgent(AgentConfig(node="node-x", simulate=False))
    assert not agent.open()
    assert "no GPU on this node" in (agent.error or "")
    assert "no GPU on this node" in caplog.text

    async def run() -> None:
        agent.redis = aioredis.Redis.from_url(settings.REDIS_URL)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stop.set)
        try:
            await agent.run(stop)
        finally:
            await agent.redis.aclose()

    async_to_sync(run)()
    [status] = [s for s in gpu_agent.agents_status() if s["node"] == "node-x"]
    assert status["error"] and status["provider"] is None and not status["simulated"]


def test_metrics_need_the_token_and_use_dcgm_and_vllm_names(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = _ready(world_a)
    monkeypatch.setattr("os.getpid", lambda: 4101)
    Replica(deployment, "stable", "a1").serve(ok=3)
    monkeypatch.undo()
    _fake_nvml(monkeypatch, {0: [(4101, 3 * GIB)]})
    _step(_agent(NvmlProvider()))
    client = Client()
    with override_settings(METRICS_TOKEN=""):
        assert client.get("/metrics").status_code == 404  # off unless configured
    with override_settings(METRICS_TOKEN="s3cret-token"):
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
        response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert response.status_code == 200
    text = response.content.decode()
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text
    used = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_FB_USED{")]
    assert any('tenant="acme"' in line and 'deployment="assistant"' in line for line in used)
    assert any('tenant=""' in line and 'gpu="1"' in line for line in used)  # an idle device
    lines = text.splitlines()  # prometheus_client writes a sample's labels sorted by name
    assert any(line.startswith("portal_gpu_process_fb_used_mib{") and 'gpu="0"' in line
               and line.endswith(" 3072.0") for line in lines)  # fmt: skip
    assert "# TYPE vllm:kv_cache_usage_perc gauge" in text
    assert any(line.startswith("vllm:kv_cache_usage_perc{") and 'model_name="' in line
               for line in lines)  # fmt: skip
    assert "vllm:generation_tokens_total{" in text
    # Text format 0.0.4: every sample belongs to a family TYPE'd under its own name (a counter's
    # `_total` included), else Prometheus reads it as untyped.
    typed = {line.split()[2]: line.split()[3] for line in text.splitlines()
             if line.startswith("# TYPE ")}  # fmt: skip
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split()[0]
            base = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
            assert name in typed or typed.get(base) == "histogram", name
    assert typed["vllm:num_preemptions_total"] == "counter"
    assert "vllm:num_preemptions" not in typed


def test_simulated_provider_hosts_the_published_replicas(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    Replica(deployment, "stable", "a1").serve(ok=1)
    provider = SimulatedProvider(devices=2, seed=1)
    agent = _agent(provider, simulate=True)
    snapshot = _step(agent, time.time())
    [process] = snapshot["processes"]
    assert process["tenant_id"] == world_a.tenant.pk and process["replica"] == "a1"
    assert process["pid"] == __import__("os").getpid()
    assert isinstance(provider.processes()[0], GpuProcess)


def test_old_rows_are_pruned(world_a: TenantWorld) -> None:
    from serving.telemetry.tasks import prune_gpu_samples

    deployment = _ready(world_a)
    downsampler = Downsampler("node-a", simulated=True)
    now = time.time()
    rows: list[list[Any]] = [[], []]
    for at in (now - 2 * 3600, now - 31 * 86400, now - 10):  # an old second, an old minute
        for step in range(61 * 5):
            sample = {"at": at + step * 0.2, "devices": [{
                "index": 0, "uuid": "GPU-0", "name": "x", "gpu_util": 1.0, "mem_util": 1.0,
                "mem_used": 1, "mem_free": 1, "mem_total": 2, "temperature_c": 1.0,
                "power_w": 1.0, "sm_clock_mhz": 1.0, "xid_errors": None}],
                "processes": [{"tenant_id": world_a.tenant.pk, "deployment_id": deployment.pk,
                               "replica": "r", "device_uuid": "GPU-0", "used_memory": 1}]}  # fmt: skip
            devices, processes = downsampler.add(sample)
            rows[0] += devices
            rows[1] += processes
    store_samples(devices=rows[0], processes=rows[1])
    before = GpuDeviceSample.objects.count()
    pruned = prune_gpu_samples.delay().get()
    assert pruned["gpu_devices"] > 0 and pruned["gpu_processes"] > 0
    cutoff = now - 3600 - 600
    assert not GpuDeviceSample.objects.filter(resolution=1, at__lt=_dt(cutoff)).exists()
    assert not GpuDeviceSample.objects.filter(resolution=60, at__lt=_dt(now - 30 * 86400)).exists()
    assert GpuDeviceSample.objects.filter(resolution=60, at__lt=_dt(cutoff)).exists()  # kept
    assert GpuDeviceSample.objects.count() == before - pruned["gpu_devices"]


def _dt(ts: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, tz=UTC)
