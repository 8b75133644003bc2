"""The GPU agent of one node: samples its GPUs (NVML, or the labelled simulated provider) at
5 Hz, maps NVML's compute processes to Ray Serve replicas (the pid each replica publishes with
its SLI window) and so to deployments and tenants, and fans every sample out:

- Channels groups `tenant-<id>.gpu` (the devices the tenant's replicas use, its own processes
  and the KV cache of its deployments, never another tenant's process details) and
  `node-<name>.gpu` (everything, for platform operators);
- a short log per group (a Redis stream, 5 minutes) that a reconnecting browser resumes from;
- the node's newest snapshot (for /metrics) and its status (simulated, no GPU, alive);
- 1 s and 1 min rows in PostgreSQL for history (one insert batch a second).

Process lists are read at most every 5 s (NVML takes milliseconds per call). Runs as its own
process (`manage.py gpu_agent`, one per GPU node) or, in embedded mode without Redis, as a task
of the web server's event loop, since the in-memory channel layer lives in that process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import zlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from serving.control.names import BadName, deployment_app
from serving.telemetry.providers.base import (
    DeviceSample,
    GpuProcess,
    NoGpu,
    Provider,
    open_provider,
)

logger = logging.getLogger(__name__)

LOG_SECONDS = 300  # a reconnect can resume from up to 5 minutes back
EVENT = "gpu.sample"  # handled by GpuConsumer.gpu_sample


def tenant_group(tenant_id: int) -> str:
    return f"tenant-{tenant_id}.gpu"


def node_group(node: str) -> str:
    # Channels group names allow ASCII letters, digits, hyphens, underscores and periods.
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in node)[:80]
    return f"node-{safe}.gpu"


def _keys() -> dict[str, str]:
    prefix = settings.SLI_KEY_PREFIX
    return {
        "log": f"{prefix}:gpu:log:",  # + group name
        "latest": f"{prefix}:gpu:latest",  # hash node -> newest snapshot (JSON)
        "status": f"{prefix}:gpu:agents",  # hash node -> agent status (JSON)
        "sli": f"{prefix}:sli:",
    }


# --- attribution -------------------------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    """Who a replica serves: the deployment (and its tenant) behind a Serve app."""

    tenant_id: int
    tenant: str
    deployment_id: int
    deployment: str


def replicas_by_pid(snapshots: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """The replicas' published SLI snapshots by the pid each reported (os.getpid())."""
    out: dict[int, Mapping[str, Any]] = {}
    for snapshot in snapshots:
        pid = snapshot.get("pid")
        if isinstance(pid, int) and pid > 0:
            out[pid] = snapshot
    return out


def attribute(
    processes: Iterable[GpuProcess],
    replicas: Mapping[int, Mapping[str, Any]],
    owners: Mapping[str, Owner],
) -> list[dict[str, Any]]:
    """Each NVML compute process, with the replica, deployment and tenant it belongs to where
    its pid is a replica's (`tenant_id` None: not a portal replica, shown to operators only)."""
    out = []
    for process in processes:
        replica = replicas.get(process.pid)
        owner = owners.get(str(replica.get("app"))) if replica is not None else None
        row: dict[str, Any] = {
            **process.to_dict(),
            "tenant_id": None,
            "tenant": None,
            "deployment_id": None,
            "deployment": None,
            "group": None,
            "replica": None,
        }
        if replica is not None and owner is not None:
            row.update(
                tenant_id=owner.tenant_id,
                tenant=owner.tenant,
                deployment_id=owner.deployment_id,
                deployment=owner.deployment,
                group=replica.get("group"),
                replica=replica.get("replica"),
            )
        out.append(row)
    return out


def kv_of(snapshot: Mapping[str, Any], tenant_id: int) -> dict[str, Any]:
    """One replica's KV cache as the dashboard shows it: usage, the tenant's prefix hit rate,
    fragmentation (1 - largest free run / free blocks)."""
    kv = snapshot.get("kv") or {}
    total = int(kv.get("num_blocks", 0))
    free = int(kv.get("free_blocks", 0))
    mine = (kv.get("tenants") or {}).get(str(tenant_id), {})
    queries = int(mine.get("prefix_queries", 0))
    return {
        "replica": snapshot.get("replica"),
        "group": snapshot.get("group"),
        "blocks_total": total,
        "blocks_used": total - free,
        "usage": round((total - free) / total, 4) if total else 0.0,
        "prefix_queries": queries,
        "prefix_hits": int(mine.get("prefix_hits", 0)),
        "prefix_hit_rate": round(int(mine.get("prefix_hits", 0)) / queries, 4) if queries else None,
        "fragmentation": float(kv.get("fragmentation", 0.0)),
        "preemptions": int(mine.get("preemptions", 0)),
    }


def views(
    snapshot: Mapping[str, Any],
    replicas: Iterable[Mapping[str, Any]],
    owners: Mapping[str, Owner],
) -> dict[str, dict[str, Any]]:
    """What each group is sent: the node group everything, each tenant group only the devices
    its processes use, its own processes and its deployments' KV caches."""
    devices = snapshot["devices"]
    processes = snapshot["processes"]
    head = {k: snapshot[k] for k in ("at", "node", "simulated", "provider")}
    out: dict[str, dict[str, Any]] = {
        node_group(snapshot["node"]): {**head, "devices": devices, "processes": processes}
    }
    tenants = {p["tenant_id"] for p in processes if p["tenant_id"] is not None}
    kv: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for replica in replicas:
        owner = owners.get(str(replica.get("app")))
        if owner is not None:
            tenants.add(owner.tenant_id)
            kv.setdefault(owner.tenant_id, {}).setdefault(owner.deployment, []).append(
                kv_of(replica, owner.tenant_id)
            )
    for tenant_id in sorted(tenants):
        mine = [p for p in processes if p["tenant_id"] == tenant_id]
        used = {p["device_uuid"] for p in mine}
        out[tenant_group(tenant_id)] = {
            **head,
            "devices": [d for d in devices if d["uuid"] in used],
            "processes": [
                {
                    k: p[k]
                    for k in (
                        "device_index",
                        "device_uuid",
                        "used_memory",
                        "deployment",
                        "group",
                        "replica",
                    )
                }
                for p in mine
            ],  # fmt: skip
            "kv": kv.get(tenant_id, {}),
        }
    return out


# --- the log a reconnect resumes from -----------------------------------------------------


def seq_key(seq: str) -> tuple[int, int]:
    """Order of two sequence ids ("<ms>-<n>", as Redis streams number their entries)."""
    ms, _, n = seq.partition("-")
    try:
        return int(ms), int(n or 0)
    except ValueError:
        return 0, 0


class MemoryLog:
    """The log in this process (embedded mode: the in-memory channel layer is per process)."""

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self.streams: dict[str, deque[tuple[str, str]]] = {}
        self._last = (0, 0)

    def _next(self) -> str:
        ms = int(time.time() * 1000)
        self._last = (ms, 0) if ms > self._last[0] else (self._last[0], self._last[1] + 1)
        return f"{self._last[0]}-{self._last[1]}"

    async def append_many(self, items: Mapping[str, str]) -> dict[str, str]:
        seqs = {}
        for group, payload in items.items():
            seq = self._next()
            stream = self.streams.setdefault(group, deque(maxlen=self.maxlen))
            stream.append((seq, payload))
            seqs[group] = seq
        return seqs

    async def aclose(self) -> None:
        """Nothing to close: the log lives as long as the process."""

    async def since(self, group: str, seq: str, limit: int) -> list[tuple[str, str]]:
        after = seq_key(seq)
        stream = self.streams.get(group, deque())
        return [(s, p) for s, p in stream if seq_key(s) > after][-limit:]


class RedisLog:
    """The log in Redis streams, one per group, trimmed to about LOG_SECONDS of samples."""

    def __init__(self, client: Any, prefix: str, maxlen: int) -> None:
        self.client, self.prefix, self.maxlen = client, prefix, maxlen

    async def append_many(self, items: Mapping[str, str]) -> dict[str, str]:
        groups = list(items)
        async with self.client.pipeline(transaction=False) as pipe:
            for group in groups:
                pipe.xadd(
                    self.prefix + group, {"d": items[group]}, maxlen=self.maxlen, approximate=True
                )
                pipe.expire(self.prefix + group, LOG_SECONDS * 2)
            ids = await pipe.execute()
        return {g: _text(i) for g, i in zip(groups, ids[::2], strict=True)}

    async def aclose(self) -> None:
        await self.client.aclose()

    async def since(self, group: str, seq: str, limit: int) -> list[tuple[str, str]]:
        rows = await self.client.xrange(self.prefix + group, min=f"({seq}", max="+", count=limit)
        return [(_text(i), _text(fields[b"d"])) for i, fields in rows]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_MEMORY_LOG: MemoryLog | None = None


def sample_log(hz: float = 5.0) -> MemoryLog | RedisLog:
    """The log this installation uses: Redis streams, or this process's memory without Redis."""
    global _MEMORY_LOG
    maxlen = int(LOG_SECONDS * hz)
    if settings.REDIS_URL:
        import redis.asyncio as aioredis

        return RedisLog(aioredis.Redis.from_url(settings.REDIS_URL), _keys()["log"], maxlen)
    if _MEMORY_LOG is None:
        _MEMORY_LOG = MemoryLog(maxlen)
    return _MEMORY_LOG


# --- downsampling -------------------------------------------------------------------------


@dataclass
class _Span:
    start: float
    n: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)


_MEANS = ("gpu_util", "mem_util", "mem_used", "temperature_c", "power_w", "sm_clock_mhz")
_PEAKS = {"mem_used": "mem_used_max", "temperature_c": "temperature_max_c"}


class Downsampler:
    """Means (and peaks) of every device and every replica's GPU memory over each second and
    each minute; `add()` returns the rows of the spans that ended."""

    def __init__(self, node: str, simulated: bool) -> None:
        self.node, self.simulated = node, simulated
        self.spans: dict[tuple[int, str, Any], _Span] = {}

    def add(self, snapshot: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
        now = float(snapshot["at"])
        items: list[tuple[str, Any, dict[str, Any]]] = [
            ("device", d["uuid"], d) for d in snapshot["devices"]
        ]
        items += [
            ("process", (p["device_uuid"], p["deployment_id"], p["replica"], p["tenant_id"]), p)
            for p in snapshot["processes"]
            if p["tenant_id"] is not None
        ]
        devices: list[Any] = []
        processes: list[Any] = []
        for resolution in (1, 60):
            start = now - now % resolution
            seen = set()
            for kind, key, values in items:
                span_key = (resolution, kind, key)
                seen.add(span_key)
                span = self.spans.get(span_key)
                if span is not None and span.start < start:
                    self._emit(resolution, kind, span, devices, processes)
                    span = None
                if span is None:
                    span = self.spans[span_key] = _Span(start=start)
                self._fold(span, kind, values)
            # A device or replica that went away: its last span is written once it ends.
            for span_key in [k for k in self.spans if k[0] == resolution and k not in seen]:
                if self.spans[span_key].start < start:
                    self._emit(resolution, span_key[1], self.spans.pop(span_key), devices,
                               processes)  # fmt: skip
        return devices, processes

    @staticmethod
    def _fold(span: _Span, kind: str, values: Mapping[str, Any]) -> None:
        span.n += 1
        names = _MEANS if kind == "device" else ("used_memory",)
        for name in names:
            value = float(values.get(name) or 0)
            span.sums[name] = span.sums.get(name, 0.0) + value
            if name in _PEAKS:
                span.peaks[name] = max(span.peaks.get(name, value), value)
        span.last = dict(values)

    def _emit(
        self, resolution: int, kind: str, span: _Span, devices: list[Any], processes: list[Any]
    ) -> None:
        from serving.telemetry.models import GpuDeviceSample, GpuProcessSample

        at = datetime.fromtimestamp(span.start, tz=UTC)
        mean = {k: v / span.n for k, v in span.sums.items()}
        last = span.last
        if kind == "device":
            devices.append(GpuDeviceSample(
                node=self.node, device_uuid=last["uuid"], device_index=last["index"],
                name=str(last["name"])[:128], simulated=self.simulated, resolution=resolution,
                at=at, samples=span.n, gpu_util=mean["gpu_util"], mem_util=mean["mem_util"],
                mem_used=int(mean["mem_used"]), mem_used_max=int(span.peaks["mem_used"]),
                mem_total=int(last["mem_total"]), temperature_c=mean["temperature_c"],
                temperature_max_c=span.peaks["temperature_c"], power_w=mean["power_w"],
                sm_clock_mhz=mean["sm_clock_mhz"], xid_errors=last.get("xid_errors"),
            ))  # fmt: skip
        else:
            processes.append(GpuProcessSample(
                tenant_id=last["tenant_id"], deployment_id=last["deployment_id"],
                replica=str(last["replica"])[:128], node=self.node,
                device_uuid=last["device_uuid"], resolution=resolution, at=at,
                used_memory=int(mean["used_memory"]),
            ))  # fmt: skip


SECOND_RETENTION_S = 3600 + 600  # 1 s rows: an hour (and a margin)
MINUTE_RETENTION_S = 30 * 86400


def prune(*, now: float) -> dict[str, int]:
    """Drop 1 s rows older than an hour and 1 min rows older than 30 days."""
    from serving.telemetry.models import GpuDeviceSample, GpuProcessSample, GpuResolution

    out = {}
    for model, name in ((GpuDeviceSample, "gpu_devices"), (GpuProcessSample, "gpu_processes")):
        seconds, _ = model.objects.filter(  # type: ignore[attr-defined]
            resolution=GpuResolution.SECOND,
            at__lt=datetime.fromtimestamp(now - SECOND_RETENTION_S, tz=UTC),
        ).delete()
        minutes, _ = model.objects.filter(  # type: ignore[attr-defined]
            resolution=GpuResolution.MINUTE,
            at__lt=datetime.fromtimestamp(now - MINUTE_RETENTION_S, tz=UTC),
        ).delete()
        out[name] = seconds + minutes
    return out


def _db(func: Any) -> Any:
    """A database call of the agent's loop, in a thread: its connection is handled like a
    request's (closed when CONN_MAX_AGE says so), since no request cycle ends it here."""

    def call(*args: Any) -> Any:
        try:
            return func(*args)
        finally:
            close_old_connections()

    return sync_to_async(call)


def _store(devices: list[Any], processes: list[Any]) -> None:
    from serving.telemetry.models import GpuDeviceSample, GpuProcessSample

    if devices:
        GpuDeviceSample.objects.bulk_create(devices)
    if processes:
        GpuProcessSample.objects.bulk_create(processes)


def owners_map() -> dict[str, Owner]:
    """Serve app name (`<tenant slug>.<deployment>`) -> owner, for every live deployment."""
    from serving.deployments.models import Deployment

    rows = Deployment.objects.filter(deleted_at__isnull=True).values_list(
        "tenant_id", "tenant__slug", "pk", "name"
    )
    owners = {}
    for tenant_id, slug, pk, name in rows:
        with contextlib.suppress(BadName):  # never compiled, so no replica publishes it
            owners[deployment_app(slug, name)] = Owner(tenant_id, slug, pk, name)
    return owners


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
    """One node's sampling loop. `run()` until `stop` is set; `step()` is one sample (tests)."""

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
        async for key in self.redis.scan_iter(match=_keys()["sli"] + "*", count=500):
            for raw in (await self.redis.hgetall(key)).values():
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    continue
        return out

    async def _attach_simulated(self) -> None:
        """Simulated GPUs host the replicas that published a pid; without Redis (nothing is
        published) one stand-in process per serving deployment, so a demo shows attribution.
        Both only ever on the simulated provider, whose every sample says so."""
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
                    {"app": app, "group": "stable", "replica": f"simulated-{deployment_id}",
                     "pid": pid, "kv": {}}
                )  # fmt: skip
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
        snapshot: dict[str, Any] = {
            "at": round(now, 3),
            "node": self.config.node,
            "simulated": self.provider.simulated,
            "provider": self.provider.name,
            "devices": [d.to_dict() for d in devices],
            "processes": attribute(self.processes, replicas_by_pid(self.replicas), self.owners),
        }
        await self.publish(snapshot)
        if self.config.persist:
            rows = self.downsampler.add(snapshot)
            if rows[0] or rows[1]:
                await _db(_store)(*rows)
        self.samples += 1
        return snapshot

    async def publish(self, snapshot: dict[str, Any]) -> None:
        payloads = {
            group: json.dumps(view, separators=(",", ":"))
            for group, view in views(snapshot, self.replicas, self.owners).items()
        }
        seqs = await self.log.append_many(payloads)
        if self.layer is not None:
            await asyncio.gather(*(
                self.layer.group_send(
                    group,
                    {"type": EVENT, "seq": seqs[group], "node": self.config.node,
                     "data": payloads[group]},  # fmt: skip
                )
                for group in payloads
            ))  # fmt: skip
        if self.redis is not None:
            keys = _keys()
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hset(keys["latest"], self.config.node, payloads[node_group(self.config.node)])
                pipe.hset(keys["status"], self.config.node, json.dumps(self.status(snapshot)))
                await pipe.execute()
        else:
            _LOCAL_STATUS[self.config.node] = self.status(snapshot)
            _LOCAL_LATEST[self.config.node] = snapshot

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
            await self.redis.hset(_keys()["status"], self.config.node, json.dumps(status))
        else:
            _LOCAL_STATUS[self.config.node] = status


_LOCAL_STATUS: dict[str, dict[str, Any]] = {}  # embedded mode: the agent runs in this process
_LOCAL_LATEST: dict[str, dict[str, Any]] = {}


def agents_status(redis_client: Any = None) -> list[dict[str, Any]]:
    """Every node agent's last status (provider, simulated, error), newest report first; an
    agent silent for 10 s is marked stale."""
    if settings.REDIS_URL:
        import redis

        client = redis_client or redis.Redis.from_url(settings.REDIS_URL)
        raw = client.hgetall(_keys()["status"])
        statuses = [json.loads(v) for v in raw.values()]
    else:
        statuses = list(_LOCAL_STATUS.values())
    now = time.time()
    for status in statuses:
        status["stale"] = now - float(status.get("at") or 0) > 10
    return sorted(statuses, key=lambda s: -float(s.get("at") or 0))


def latest_snapshots(redis_client: Any = None) -> list[dict[str, Any]]:
    """The newest full snapshot of every node (operators' view; /metrics)."""
    if settings.REDIS_URL:
        import redis

        client = redis_client or redis.Redis.from_url(settings.REDIS_URL)
        return [json.loads(v) for v in client.hgetall(_keys()["latest"]).values()]
    return [views(s, [], {})[node_group(s["node"])] for s in _LOCAL_LATEST.values()]
