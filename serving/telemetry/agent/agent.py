"""One node's GPU agent: the sampling loop (sample, attribute, publish, downsample, store), its
status, and the readers of what the agents last published (rows are stored through
serving.telemetry.services)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from serving.control.names import BadName, deployment_app
from serving.telemetry.agent.attribution import (
    Owner,
    attribute,
    owners_map,
    views,
)
from serving.telemetry.agent.downsample import Downsampler
from serving.telemetry.agent.log import sample_log
from serving.telemetry.keys import EVENT, gpu_keys, node_group
from serving.telemetry.providers.base import (
    DeviceSample,
    GpuProcess,
    NoGpu,
    Provider,
    open_provider,
)
from serving.telemetry.providers.fragmentation import enrich_devices

logger = logging.getLogger(__name__)


def _db(func: Any) -> Any:
    """A database call of the agent's loop, in a thread: its connection is handled like a
    request's (closed when CONN_MAX_AGE says so), since no request cycle ends it here."""

    def call(*args: Any) -> Any:
        try:
            return func(*args)
        finally:
            close_old_connections()

    return sync_to_async(call)


def _store(rows: tuple[list[Any], list[Any]]) -> None:
    from serving.telemetry.services import store_samples

    store_samples(devices=rows[0], processes=rows[1])


def _live_deployments() -> list[tuple[int, str]]:
    """(id, app) of deployments that should be serving (for the simulated provider's demo)."""
    from serving.deployments.models import Deployment
    from serving.ops.health import PROBE_STATUSES

    rows = Deployment.objects.filter(deleted_at__isnull=True, status__in=PROBE_STATUSES)
    live = []
    for pk, slug, name in rows.values_list("pk", "tenant__slug", "name"):
        with contextlib.suppress(BadName):
            live.append((pk, deployment_app(slug, name)))
    return live


# --- the agent ------------------------------------------------------------------------------


@dataclass
class AgentConfig:
    node: str = field(default_factory=socket.gethostname)
    hz: float = 5.0
    process_interval_s: float = 5.0
    simulate: bool = False
    persist: bool = True


class GpuAgent:
    """One node's sampling loop. `run()` until `stop` is set; `step()` is one sample (tests).
    `redis_client` reads the replicas' published pids and receives the node's status and newest
    snapshot; without one (tests, benchmarks) the agent publishes to the channel layer and the
    sample log only."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        provider: Provider | None = None,
        layer: Any = None,
        redis_client: Any = None,
    ) -> None:
        self.config = config
        self.provider = provider
        self.layer = layer
        self.redis = redis_client
        self.log = sample_log(config.hz)
        self.processes: list[GpuProcess] = []
        self.replicas: list[Mapping[str, Any]] = []
        self.owners: dict[str, Owner] = {}
        self._owners_at = 0.0
        self._processes_at = float("-inf")
        self.downsampler: Downsampler | None = None
        self.samples = 0
        self.error: str | None = None

    def open(self) -> bool:
        """Open the provider; without a GPU (and without simulation) say so and keep running
        (the status tells the pages), rather than crash-loop under a supervisor."""
        if self.provider is None:
            try:
                self.provider = open_provider(simulate=self.config.simulate)
            except NoGpu as exc:
                self.error = f"no GPU on this node: {exc}; the simulated provider is off"
                logger.warning("%s", self.error)
                return False
        self.downsampler = Downsampler(self.config.node, self.provider.simulated)
        if self.provider.simulated:
            logger.warning(
                "GPU agent on %s: SIMULATED provider, the samples are not real", self.config.node
            )
        return True

    async def _refresh(self, now: float) -> None:
        """Every few seconds: NVML's process list, the replicas' pids, the deployments."""
        if self.provider is None:
            raise RuntimeError("open() the agent first")
        if now - self._owners_at >= 30 or not self.owners:
            self.owners = await _db(owners_map)()
            self._owners_at = now
        self.replicas = await self._published_replicas()
        ray_node = getattr(self.provider, "ray_node", None)
        if ray_node:  # a Ray node's sampler (gpu_relay): only its own replicas' pids
            self.replicas = [r for r in self.replicas if r.get("node") in (None, ray_node)]
        if self.provider.simulated:
            await self._attach_simulated()
        self.processes = await asyncio.to_thread(self.provider.processes)
        self._processes_at = now

    async def _published_replicas(self) -> list[Mapping[str, Any]]:
        if self.redis is None:
            return []
        out = []
        async for key in self.redis.scan_iter(match=gpu_keys()["sli"] + "*", count=500):
            for raw in (await self.redis.hgetall(key)).values():
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    continue
        return out

    async def _attach_simulated(self) -> None:
        """Simulated GPUs host the replicas that published a pid; where none did (no Serve
        replica running, or an agent without a Redis client) one stand-in process per serving
        deployment, so a demo shows attribution. Both only ever on the simulated provider,
        whose every sample says so."""
        provider: Any = self.provider
        count = len(await asyncio.to_thread(provider.devices))
        wanted: dict[int, tuple[int, int]] = {}
        for replica in self.replicas:
            pid = replica.get("pid")
            if isinstance(pid, int):
                kv = replica.get("kv") or {}
                used = (2 << 30) + int(kv.get("num_blocks", 0)) * (2 << 20)
                wanted[pid] = (zlib.crc32(str(replica.get("replica")).encode()) % count, used)
        if not self.replicas:
            for deployment_id, app in await _db(_live_deployments)():
                pid = 4_000_000 + deployment_id  # above Linux's pid_max: never a real process
                wanted[pid] = (zlib.crc32(app.encode()) % count, 6 << 30)
                self.replicas.append(
                    {
                        "app": app,
                        "group": "stable",
                        "replica": f"simulated-{deployment_id}",
                        "pid": pid,
                        "kv": {},
                    }
                )
        for process in provider.processes():
            if process.pid not in wanted:
                provider.detach(process.pid)
        for pid, (device, used) in wanted.items():
            provider.attach(pid, device, used)

    async def step(self, now: float | None = None) -> dict[str, Any]:
        """Sample, attribute, publish, downsample; returns the node snapshot."""
        if self.provider is None or self.downsampler is None:
            raise RuntimeError("open() the agent first")
        given = now
        now = time.time() if now is None else now
        if now - self._processes_at >= self.config.process_interval_s:
            await self._refresh(now)
            # The refresh (ORM reads, NVML's process list) takes time: stamp the devices' read.
            now = time.time() if given is None else now
        devices: list[DeviceSample] = await asyncio.to_thread(self.provider.devices)
        processes = attribute(self.processes, self.replicas, self.owners)
        snapshot: dict[str, Any] = {
            "at": round(now, 3),
            "node": self.config.node,
            "simulated": self.provider.simulated,
            "provider": self.provider.name,
            # Fragmentation from NVML's free memory and the replicas' allocator reports.
            "devices": enrich_devices([d.to_dict() for d in devices], processes, self.replicas),
            "processes": processes,
        }
        await self.publish(snapshot)
        if self.config.persist:
            rows = self.downsampler.add(snapshot)
            if rows[0] or rows[1]:
                await _db(_store)(rows)
        self.samples += 1
        return snapshot

    async def publish(self, snapshot: dict[str, Any]) -> None:
        payloads = {
            group: json.dumps(view, separators=(",", ":"))
            for group, view in views(snapshot, self.replicas, self.owners).items()
        }
        seqs = await self.log.append_many(payloads)
        if self.layer is not None:
            await asyncio.gather(
                *(
                    self.layer.group_send(
                        group,
                        {
                            "type": EVENT,
                            "seq": seqs[group],
                            "node": self.config.node,
                            "data": payloads[group],
                        },
                    )
                    for group in payloads
                )
            )
        if self.redis is not None:
            keys = gpu_keys()
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hset(keys["latest"], self.config.node, payloads[node_group(self.config.node)])
                pipe.hset(keys["status"], self.config.node, json.dumps(self.status(snapshot)))
                await pipe.execute()

    def status(self, snapshot: Mapping[str, Any] | None = None) -> dict[str, Any]:
        provider = self.provider
        return {
            "node": self.config.node,
            "at": snapshot["at"] if snapshot else time.time(),
            "provider": provider.name if provider else None,
            "simulated": bool(provider and provider.simulated),
            "devices": len(snapshot["devices"]) if snapshot else 0,
            "hz": self.config.hz,
            "error": self.error,
        }

    async def run(self, stop: asyncio.Event) -> None:
        if not self.open():
            await self._report_status()
            await stop.wait()
            return
        period = 1.0 / self.config.hz
        next_at = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    await self.step()
                except Exception:  # one bad sample (NVML hiccup, Redis blip) is not fatal
                    logger.exception("GPU sample on %s failed", self.config.node)
                next_at += period
                delay = next_at - time.monotonic()
                if delay < 0:  # fell behind (a slow NVML call): skip, never burst
                    next_at = time.monotonic()
                    delay = 0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
        finally:
            await self.log.aclose()
            if self.provider is not None:
                self.provider.close()

    async def _report_status(self) -> None:
        status = self.status()
        if self.redis is not None:
            await self.redis.hset(gpu_keys()["status"], self.config.node, json.dumps(status))


def agents_status(redis_client: Any = None) -> list[dict[str, Any]]:
    """Every node agent's last status (provider, simulated, error), newest report first; an
    agent silent for 10 s is marked stale."""
    import redis

    client = redis_client or redis.Redis.from_url(settings.REDIS_URL)
    raw = client.hgetall(gpu_keys()["status"])
    statuses = [json.loads(v) for v in raw.values()]
    now = time.time()
    for status in statuses:
        status["stale"] = now - float(status.get("at") or 0) > 10
    return sorted(statuses, key=lambda s: -float(s.get("at") or 0))


def latest_snapshots(redis_client: Any = None) -> list[dict[str, Any]]:
    """The newest full snapshot of every node (operators' view; /metrics)."""
    import redis

    client = redis_client or redis.Redis.from_url(settings.REDIS_URL)
    return [json.loads(v) for v in client.hgetall(gpu_keys()["latest"]).values()]
