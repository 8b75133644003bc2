"""GPU_AGENT_MODE=ray, the portal's side: one relay (`manage.py gpu_agent --relay`, which the
`up` supervisor runs in that mode) reads every node's sampler stream (serving.dataplane.gpu_node)
and hands each sample to that node's `GpuAgent`, which attributes it, fans it out to the
Channels groups, keeps the resume log and downsamples it into PostgreSQL, exactly as a
`manage.py gpu_agent` process on the node would. Only the reading of the GPUs moved to Ray.

A node shows up when its sampler first reports (`<prefix>:gpu:nodes`); a restarted relay
starts from the streams' newest entries (nothing stored twice). Pids are matched with the
replicas that published the same Ray node, so two nodes' equal pids never mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from django.conf import settings

from serving.telemetry.agent import AgentConfig, GpuAgent
from serving.telemetry.providers.base import DeviceSample, GpuProcess
from serving.telemetry.providers.nodes import node_stream, nodes_key

logger = logging.getLogger(__name__)
DISCOVER_EVERY_S = 5.0
READ_COUNT = 100  # entries per stream and read; a relay that fell behind catches up in steps


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RemoteProvider:
    """A node's GPUs as its sampler last read them. On a simulated node the agent may host
    replicas' pids on the fake devices (as SimulatedProvider.attach), here on the relay."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.name = "remote"
        self.simulated = False
        self.ray_node: str | None = None
        self._devices: list[DeviceSample] = []
        self._processes: list[GpuProcess] = []
        self._hosted: dict[tuple[int, int], int] = {}

    def update(self, sample: dict[str, Any]) -> None:
        self._devices = [DeviceSample(**d) for d in sample.get("devices") or []]
        self._processes = [GpuProcess(**p) for p in sample.get("processes") or []]
        self.simulated = bool(sample.get("simulated"))
        self.name = f"{sample.get('provider') or 'unknown'} (Ray sampler)"
        self.ray_node = sample.get("ray_node") or None

    def devices(self) -> list[DeviceSample]:
        return list(self._devices)

    def processes(self) -> list[GpuProcess]:
        uuids = {d.index: d.uuid for d in self._devices}
        hosted = [
            GpuProcess(
                pid=pid, device_index=device, device_uuid=uuids.get(device, ""), used_memory=memory
            )
            for (pid, device), memory in self._hosted.items()
        ]
        return self._processes + hosted

    def attach(self, pid: int, device_index: int, used_memory: int) -> None:
        if not self.simulated:
            raise RuntimeError("only a simulated node's devices can host a process")
        self._hosted[(pid, device_index)] = used_memory

    def detach(self, pid: int) -> None:
        for key in [key for key in self._hosted if key[0] == pid]:
            del self._hosted[key]

    def close(self) -> None:
        self._hosted.clear()


class Relay:
    """Every node's samples to its agent. `run()` until `stop` is set; `step()` is one read."""

    def __init__(self, *, layer: Any, redis_client: Any, persist: bool = True) -> None:
        self.layer, self.redis, self.persist = layer, redis_client, persist
        self.prefix = settings.SLI_KEY_PREFIX
        self.agents: dict[str, GpuAgent] = {}
        self.idle: dict[str, GpuAgent] = {}  # nodes whose sampler reports no GPU, no samples
        self.providers: dict[str, RemoteProvider] = {}
        self.cursors: dict[str, str] = {}  # stream -> last entry read
        self.samples = 0

    async def discover(self) -> list[str]:
        """Nodes whose samplers reported; a node that says "no GPU" gets that status."""
        reports = await self.redis.hgetall(nodes_key(self.prefix))
        for raw_node, raw in reports.items():
            node = _text(raw_node)
            stream = node_stream(self.prefix, node)
            if stream not in self.cursors:  # from its newest entry on: nothing stored twice
                newest = await self.redis.xrevrange(stream, count=1)
                self.cursors[stream] = _text(newest[0][0]) if newest else "0-0"
            try:
                report = json.loads(raw)
            except ValueError:
                continue
            if node not in self.agents and report.get("error") and not report.get("samples"):
                idle = self.idle.get(node)
                if idle is None:  # one per silent node, kept: its status is renewed each time
                    idle = GpuAgent(
                        AgentConfig(node=node, persist=False), layer=None, redis_client=self.redis
                    )
                    self.idle[node] = idle
                idle.error = str(report["error"])
                await idle._report_status()
        return sorted(self.cursors)

    def _agent(self, node: str, sample: dict[str, Any]) -> GpuAgent:
        provider = self.providers.setdefault(node, RemoteProvider(node))
        provider.update(sample)
        agent = self.agents.get(node)
        if agent is None:
            hz = settings.GPU_AGENT_HZ
            agent = GpuAgent(
                AgentConfig(node=node, hz=hz, persist=self.persist),
                provider=provider,
                layer=self.layer,
                redis_client=self.redis,
            )
            agent.open()
            self.agents[node] = agent
            logger.info("GPU relay: node %s (%s)", node, provider.name)
        return agent

    async def step(self, block_ms: int = 1000) -> int:
        """One read of every stream; each entry becomes one agent step. Returns the count."""
        if not self.cursors:
            return 0
        read = await self.redis.xread(self.cursors, count=READ_COUNT, block=block_ms)
        done = 0
        for raw_stream, entries in read or []:
            stream = _text(raw_stream)
            for raw_id, fields in entries:
                self.cursors[stream] = _text(raw_id)
                try:
                    sample = json.loads(fields[b"d"] if b"d" in fields else fields["d"])
                    agent = self._agent(str(sample["node"]), sample)
                    await agent.step(now=float(sample["at"]))
                except Exception:  # one bad entry (or a database hiccup) is not fatal
                    logger.exception("GPU relay: a sample from %s failed", stream)
                    continue
                done += 1
        self.samples += done
        return done

    async def run(self, stop: asyncio.Event) -> None:
        discovered_at = float("-inf")
        try:
            while not stop.is_set():
                if time.monotonic() - discovered_at >= DISCOVER_EVERY_S:
                    await self.discover()
                    discovered_at = time.monotonic()
                if not self.cursors:  # no sampler has reported yet
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=1.0)
                    continue
                try:
                    await self.step()
                except Exception:  # Redis away: try again shortly
                    logger.exception("GPU relay: reading the node streams failed")
                    await asyncio.sleep(1.0)
        finally:
            for agent in [*self.agents.values(), *self.idle.values()]:
                await agent.log.aclose()
