"""GPU_AGENT_MODE=ray without Ray: the samplers' application in the compiled Serve config (one
replica per node, no route, no CPU), the node count from Ray's state API, the sampler loop
itself (Django-free, real Redis, the labelled simulation) and the relay that turns its stream
into the tenant's GPU stream, with pids matched on their own Ray node.
The Ray test (tests/serving/test_ops_ray.py) declares the samplers on the real cluster."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from serving.control.compile import GPU_NODES_APP, GpuNodesSpec, compile_config, restart_free
from serving.dataplane.gpu_node import GpuNodeSampler, Sampler
from serving.deployments import reconcile as control
from serving.telemetry import agent as gpu_agent
from serving.telemetry.providers.nodes import node_stream, nodes_key
from serving.telemetry.relay import Relay, RemoteProvider
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import Replica, _ready

pytestmark = pytest.mark.django_db(transaction=True)  # the relay's agents read from threads

GIB = 1 << 30


def test_the_samplers_are_one_unrouted_replica_per_node() -> None:
    telemetry = {"redis_url": "redis://127.0.0.1:6379/15", "prefix": "p"}
    config = compile_config([], telemetry=telemetry, gpu_nodes=GpuNodesSpec(nodes=3, hz=5))
    (app,) = config["applications"]
    (sampler,) = app["deployments"]
    assert app["name"] == GPU_NODES_APP and app["route_prefix"] is None
    assert app["import_path"] == "serving.dataplane.gpu_node:build_gpu_nodes"
    assert (sampler["num_replicas"], sampler["max_replicas_per_node"]) == (3, 1)
    assert sampler["ray_actor_options"] == {"num_cpus": 0}  # never takes a GPU or a CPU
    assert sampler["user_config"] == {"telemetry": telemetry, "hz": 5, "simulate": False}
    # Another rate is a live reconfigure; no samplers in process mode (nodes=0 or no spec).
    faster = compile_config([], telemetry=telemetry, gpu_nodes=GpuNodesSpec(nodes=3, hz=10))
    assert restart_free(config, faster)
    assert compile_config([], gpu_nodes=GpuNodesSpec(nodes=0))["applications"] == []
    assert compile_config([])["applications"] == []


class _Nodes:
    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self._nodes = nodes

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes


def test_the_node_count_is_the_gpu_nodes_or_every_node_of_a_cpu_cluster(
    settings: Any,
) -> None:
    settings.GPU_AGENT_MODE = "ray"
    gpu = {"state": "ALIVE", "resources_total": {"CPU": 8, "GPU": 1}}
    cpu = {"state": "ALIVE", "resources_total": {"CPU": 4}}
    dead = {"state": "DEAD", "resources_total": {"GPU": 8}}
    assert control.gpu_node_count(_Nodes([gpu, gpu, cpu, dead])) == 2  # type: ignore[arg-type]
    assert control.gpu_node_count(_Nodes([cpu, cpu, dead])) == 2  # type: ignore[arg-type]
    spec = control.gpu_nodes_spec(_Nodes([gpu]))  # type: ignore[arg-type]
    assert spec is not None and spec.nodes == 1
    settings.GPU_AGENT_MODE = "process"
    assert control.gpu_nodes_spec(_Nodes([gpu])) is None  # type: ignore[arg-type]


def _entries(client: redis.Redis, stream: str) -> list[dict[str, Any]]:
    return [json.loads(fields[b"d"]) for _, fields in client.xrange(stream)]


def test_the_sampler_streams_its_nodes_gpus_labelled_simulated() -> None:
    """Outside Ray (no node id): the host's name; simulated because there is no GPU here."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    prefix = "portal-test-sampler"
    client.delete(*(client.keys(f"{prefix}:*") or ["-"]))
    sampler = Sampler(redis_url=settings.REDIS_URL, prefix=prefix, hz=20, simulate=True).start()
    try:
        deadline = time.monotonic() + 10
        stream = node_stream(prefix, sampler.node)
        while client.xlen(stream) < 5:
            assert time.monotonic() < deadline and sampler.alive, sampler.error
            time.sleep(0.05)
    finally:
        sampler.stop()
    samples = _entries(client, stream)
    assert all(s["simulated"] and s["node"] == sampler.node for s in samples)
    assert samples[0]["devices"][0]["name"].startswith("Simulated")
    ats = [s["at"] for s in samples]
    assert ats == sorted(ats)
    report = json.loads(client.hget(nodes_key(prefix), sampler.node) or b"{}")
    assert report["provider"] == "simulated" and report["error"] is None
    # One sample a second: it reports at once (and then about every second), too.
    client.delete(nodes_key(prefix))
    slow = Sampler(redis_url=settings.REDIS_URL, prefix=prefix, hz=1, simulate=True).start()
    try:
        deadline = time.monotonic() + 5
        while not client.hget(nodes_key(prefix), slow.node):
            assert time.monotonic() < deadline, "a 1 Hz sampler never reported"
            time.sleep(0.05)
    finally:
        slow.stop()
    # Without simulation and without a GPU it says so, and the deployment stays healthy.
    quiet = Sampler(redis_url=settings.REDIS_URL, prefix=prefix, hz=20, simulate=False).start()
    try:
        deadline = time.monotonic() + 10
        while not quiet.error:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "no GPU on this node" in quiet.error and quiet.alive
    finally:
        quiet.stop()
    client.delete(*(client.keys(f"{prefix}:*") or ["-"]))


def test_the_deployment_restarts_its_sampler_only_when_its_settings_change() -> None:
    replica = GpuNodeSampler.func_or_class()  # the class behind @serve.deployment
    telemetry = {"redis_url": settings.REDIS_URL, "prefix": "portal-test-sampler"}
    replica.reconfigure({"telemetry": telemetry, "hz": 20, "simulate": True})
    first = replica.sampler
    try:
        replica.reconfigure({"telemetry": telemetry, "hz": 20, "simulate": True})
        assert replica.sampler is first and first is not None and first.alive
        replica.check_health()
        replica.reconfigure({"telemetry": telemetry, "hz": 10, "simulate": True})
        assert replica.sampler is not first and not first.alive
    finally:
        if replica.sampler is not None:
            replica.sampler.stop()


def test_the_relay_attributes_a_nodes_samples_by_its_own_replicas(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas with the same pid on two Ray nodes: node A's sample shows only A's."""
    deployment = _ready(world_a)
    for name, node in (("on-a", "ray-node-a"), ("on-b", "ray-node-b")):
        replica = Replica(deployment, "stable", name)
        replica.recorder.node = node
        monkeypatch.setattr("os.getpid", lambda: 4242)
        replica.serve(ok=2)
    monkeypatch.undo()
    client = redis.Redis.from_url(settings.REDIS_URL)
    prefix = settings.SLI_KEY_PREFIX
    node = "host-a"
    client.delete(node_stream(prefix, node), nodes_key(prefix))
    device = {"index": 0, "uuid": "GPU-0", "name": "Test GPU", "gpu_util": 50.0,
              "mem_util": 10.0, "mem_used": 9 * GIB, "mem_free": 71 * GIB, "mem_total": 80 * GIB,
              "temperature_c": 50.0, "power_w": 300.0, "sm_clock_mhz": 1900.0,
              "xid_errors": 0}  # fmt: skip
    sample = {"at": time.time(), "node": node, "ray_node": "ray-node-a", "simulated": False,
              "provider": "nvml", "devices": [device],
              "processes": [{"pid": 4242, "device_index": 0, "device_uuid": "GPU-0",
                             "used_memory": 3 * GIB}]}  # fmt: skip
    client.hset(nodes_key(prefix), node, json.dumps({"node": node, "samples": 1, "error": None}))
    group = gpu_agent.tenant_group(world_a.tenant.pk)

    async def scenario() -> tuple[dict[str, Any], Relay]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        relay = Relay(layer=layer, redis_client=aioredis.Redis.from_url(settings.REDIS_URL),
                      persist=False)  # fmt: skip
        old = {**sample, "at": sample["at"] - 60}  # before the relay (re)started: not again
        client.xadd(node_stream(prefix, node), {"d": json.dumps(old)})
        try:
            assert await relay.discover() == [node_stream(prefix, node)]
            client.xadd(node_stream(prefix, node), {"d": json.dumps(sample)})
            assert await relay.step(block_ms=2000) == 1
            message = await layer.receive(channel)
        finally:
            await layer.group_discard(group, channel)
            for agent in relay.agents.values():
                await agent.log.aclose()
            await relay.redis.aclose()
        return message, relay

    message, relay = async_to_sync(scenario)()
    view = json.loads(message["data"])
    assert message["node"] == node and view["node"] == node and view["simulated"] is False
    assert [p["replica"] for p in view["processes"]] == ["on-a"]  # not node B's pid 4242
    assert view["devices"][0]["uuid"] == "GPU-0"
    assert relay.providers[node].name == "nvml (Ray sampler)"
    client.delete(node_stream(prefix, node), nodes_key(prefix))


def test_a_simulated_nodes_devices_host_its_replicas_on_the_relay() -> None:
    provider = RemoteProvider("host-a")
    provider.update({"simulated": False, "provider": "nvml", "devices": [], "processes": []})
    with pytest.raises(RuntimeError):
        provider.attach(1, 0, GIB)  # a real GPU's processes are NVML's, never made up
    provider.update({"simulated": True, "provider": "simulated", "processes": [],
                     "devices": [{"index": 0, "uuid": "SIM-GPU-0", "name": "Simulated GPU",
                                  "gpu_util": 1.0, "mem_util": 1.0, "mem_used": 0, "mem_free": 1,
                                  "mem_total": 1, "temperature_c": 30.0, "power_w": 50.0,
                                  "sm_clock_mhz": 1000.0, "xid_errors": None}]})  # fmt: skip
    provider.attach(7, 0, GIB)
    assert [(p.pid, p.device_uuid, p.used_memory) for p in provider.processes()] == [
        (7, "SIM-GPU-0", GIB)
    ]
    provider.detach(7)
    assert provider.processes() == []


def test_a_node_without_a_gpu_is_reported_with_its_reason(world_a: TenantWorld) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    prefix = settings.SLI_KEY_PREFIX
    client.delete(nodes_key(prefix))
    client.hset(nodes_key(prefix), "cpu-node", json.dumps(
        {"node": "cpu-node", "samples": 0, "error": "no GPU on this node: no driver"}
    ))  # fmt: skip

    async def scenario() -> None:
        relay = Relay(layer=None, redis_client=aioredis.Redis.from_url(settings.REDIS_URL))
        try:
            await relay.discover()
            await relay.discover()  # again: the same idle agent renews the status
            assert list(relay.idle) == ["cpu-node"]
        finally:
            for agent in relay.idle.values():
                await agent.log.aclose()
            await relay.redis.aclose()

    async_to_sync(scenario)()
    status = {s["node"]: s for s in gpu_agent.agents_status()}["cpu-node"]
    assert status["error"] == "no GPU on this node: no driver" and status["devices"] == 0
    client.delete(nodes_key(prefix))


def test_up_runs_the_relay_in_ray_mode_and_the_local_agent_otherwise(settings: Any) -> None:
    from portal.management.commands.up import Command

    command = Command()
    command.target = None  # PORTAL_RAY=off: no head part
    opts = {"host": "127.0.0.1", "port": 8000, "no_gpu_agent": False, "no_worker": True,
            "no_beat": True}  # fmt: skip
    settings.GPU_AGENT_MODE = "process"
    agent = {p.name: p.argv for p in command.plan(opts)}["gpu-agent"]
    assert agent[-1] == "gpu_agent"
    settings.GPU_AGENT_MODE = "ray"
    assert {p.name: p.argv for p in command.plan(opts)}["gpu-agent"][-1] == "--relay"
