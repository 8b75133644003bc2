"""Prometheus `/metrics` and `/metrics/rules` (token-protected: `Authorization: Bearer
<METRICS_TOKEN>`; 404 while no token is configured), built with prometheus_client: one
Collector per source, each read at scrape time from where the truth lives (Redis, the
database), rendered by `generate_latest` from a private registry made for the scrape.

Here: the GPU agents' newest samples with DCGM exporter names and units, and the replicas' KV
cache and engine counters with vLLM names, labelled by tenant and deployment. Like
dcgm-exporter on Kubernetes (one series per pod using a GPU), a device's series carry the
tenant and deployment of each replica on it (`tenant=""` when none is); a replica's own GPU
memory is `portal_gpu_process_fb_used_mib`. Simulated samples carry `simulated="true"`.
The SLO state is in `metrics_slo`, the control loop's work and HTTP requests in
`metrics_ops`; docs/metrics.md lists every family.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from serving.ops import contracts
from serving.telemetry import agent as gpu_agent
from serving.telemetry.metrics_ops import (
    CeleryQueueCollector,
    HealthTickCollector,
    HttpCollector,
    ReconcileCollector,
    RollbackCollector,
)
from serving.telemetry.metrics_slo import SloCollector

logger = logging.getLogger(__name__)
MIB = 1 << 20
# What generate_latest writes: text format 0.0.4 (every Prometheus reads it; newer clients
# announce 1.0.0, which Prometheus 2 does not know).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# DCGM field name -> (help, sample key, scale)
DCGM = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gpu_util", 1),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "mem_util", 1),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "mem_used", 1 / MIB),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "mem_free", 1 / MIB),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c", 1),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w", 1),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1),
)
# Device-memory fragmentation (serving.telemetry.providers.fragmentation): sample key ->
# (name, help); `source` says how it was measured (`simulated` for the fake provider).
FRAGMENTATION = (
    (
        "fragmentation",
        "portal_gpu_memory_fragmentation",
        "Device-memory fragmentation: 1 - largest free block / total free (0-1).",
    ),
    (
        "mem_largest_free",
        "portal_gpu_memory_largest_free_mib",
        "Largest free block of device memory (in MiB).",
    ),
)
DEVICE_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "tenant", "deployment"]
PROCESS_LABELS = ["gpu", "UUID", "Hostname", "tenant", "deployment", "replica", "simulated"]
# vLLM metric (counters without `_total`: the exposition adds it) -> (type, help)
VLLM = (
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in tokens."),
    ("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in tokens."),
    ("vllm:num_preemptions", "counter", "Cumulative number of preemptions."),
    ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
)
ENGINE_LABELS = ["model_name", "tenant", "deployment", "group", "replica"]


def _number(value: Any) -> float:
    return float(value) if value is not None else float("nan")


def gpu_families(snapshots: Iterable[Mapping[str, Any]]) -> list[Metric]:
    """DCGM device gauges (one series per device and owner) and each replica's GPU memory."""
    devices = {
        name: GaugeMetricFamily(name, help_text, labels=[*DEVICE_LABELS, "simulated"])
        for name, help_text, *_ in DCGM
    }
    memory = {
        key: GaugeMetricFamily(name, help_text, labels=[*DEVICE_LABELS, "simulated", "source"])
        for key, name, help_text in FRAGMENTATION
    }
    processes = GaugeMetricFamily(
        "portal_gpu_process_fb_used_mib",
        "GPU memory of one replica's process (in MiB).",
        labels=PROCESS_LABELS,
    )
    for snapshot in snapshots:
        simulated = str(bool(snapshot.get("simulated"))).lower()
        by_device: dict[str, set[tuple[str, str]]] = {}
        for p in snapshot.get("processes", []):
            if p.get("tenant"):
                by_device.setdefault(p["device_uuid"], set()).add((p["tenant"], p["deployment"]))
                labels = [p["device_index"], p["device_uuid"], snapshot["node"], p["tenant"]]
                labels += [p["deployment"], p["replica"], simulated]
                processes.add_metric([str(v) for v in labels], p["used_memory"] / MIB)
        for device in snapshot.get("devices", []):
            owners = sorted(by_device.get(device["uuid"], set())) or [("", "")]
            for tenant, deployment in owners:
                labels = [device["index"], device["uuid"], f"nvidia{device['index']}"]
                labels += [device["name"], snapshot["node"], tenant, deployment, simulated]
                for name, _, key, scale in DCGM:
                    value = device[key] * scale if device[key] is not None else None
                    devices[name].add_metric([str(v) for v in labels], _number(value))
                if device.get("fragmentation") is not None:
                    source = [str(device.get("fragmentation_source") or "")]
                    memory["fragmentation"].add_metric(
                        [str(v) for v in labels] + source, float(device["fragmentation"])
                    )
                    memory["mem_largest_free"].add_metric(
                        [str(v) for v in labels] + source,
                        _number(device.get("mem_largest_free")) / MIB,
                    )
    return [*devices.values(), *memory.values(), processes]


def engine_values(replica: Mapping[str, Any], tenant_id: int) -> dict[str, float]:
    kv = replica.get("kv") or {}
    totals = replica.get("totals") or {}
    mine = (kv.get("tenants") or {}).get(str(tenant_id), {})
    blocks = int(kv.get("num_blocks", 0))
    return {
        "vllm:kv_cache_usage_perc": (blocks - int(kv.get("free_blocks", 0))) / blocks
        if blocks
        else 0.0,
        "vllm:num_requests_running": float(kv.get("running", 0)),
        "vllm:num_requests_waiting": float(kv.get("waiting", 0)),
        "vllm:prefix_cache_queries": float(mine.get("prefix_queries", 0)),
        "vllm:prefix_cache_hits": float(mine.get("prefix_hits", 0)),
        "vllm:num_preemptions": float(mine.get("preemptions", 0)),
        "vllm:prompt_tokens": float(totals.get("tokens_in", 0)),
        "vllm:generation_tokens": float(totals.get("tokens_out", 0)),
    }


def engine_families(
    replicas: Iterable[Mapping[str, Any]], owners: Mapping[str, gpu_agent.Owner]
) -> list[Metric]:
    """vLLM's KV cache and engine series, one per replica of a live deployment."""
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        name: (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
            name, help_text, labels=ENGINE_LABELS
        )
        for name, kind, help_text in VLLM
    }
    for replica in replicas:
        owner = owners.get(str(replica.get("app")))
        if owner is None:
            continue
        labels = [str(replica.get("version", "")), owner.tenant, owner.deployment]
        labels += [str(replica.get("group", "")), str(replica.get("replica", ""))]
        for name, value in engine_values(replica, owner.tenant_id).items():
            families[name].add_metric(labels, value)
    return list(families.values())


class _Families(Collector):
    def __init__(self, build: Callable[[], list[Metric]]) -> None:
        self.build = build

    def collect(self) -> Iterator[Metric]:
        yield from self.build()


def _text(families: list[Metric]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(lambda: families))
    return generate_latest(registry).decode()


def gpu_lines(snapshots: Iterable[Mapping[str, Any]]) -> list[str]:
    """The GPU families as exposition lines (the Grafana dashboard's test reads them)."""
    return _text(gpu_families(snapshots)).splitlines()


def engine_lines(
    replicas: Iterable[Mapping[str, Any]], owners: Mapping[str, gpu_agent.Owner]
) -> list[str]:
    return _text(engine_families(replicas, owners)).splitlines()


def _published_replicas() -> list[dict[str, Any]]:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    out = []
    for key in client.scan_iter(match=f"{settings.SLI_KEY_PREFIX}:sli:*", count=500):
        out += [json.loads(v) for v in client.hgetall(key).values()]
    return out


class GpuCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from gpu_families(gpu_agent.latest_snapshots())


class EngineCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from engine_families(_published_replicas(), gpu_agent.owners_map())


class Guarded(Collector):
    """A source that cannot be read (Redis or the database away) leaves its families out of
    this scrape and says so in `portal_metrics_source_up`, instead of failing the scrape."""

    def __init__(self, name: str, inner: Collector, up: dict[str, bool]) -> None:
        self.name, self.inner, self.up = name, inner, up

    def collect(self) -> Iterator[Metric]:
        try:
            families = list(self.inner.collect())
        except Exception:
            logger.warning("/metrics: source %s could not be read", self.name, exc_info=True)
            self.up[self.name] = False
            return
        self.up[self.name] = True
        yield from families


class SourcesUp(Collector):
    def __init__(self, up: dict[str, bool]) -> None:
        self.up = up

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "portal_metrics_source_up",
            "1 when this scrape read the source, 0 when it could not (its families are absent).",
            labels=["source"],
        )
        for name, ok in self.up.items():
            family.add_metric([name], 1.0 if ok else 0.0)
        yield family


def sources() -> dict[str, Collector]:
    return {
        "gpu": GpuCollector(),
        "engine": EngineCollector(),
        "slo": SloCollector(),
        "rollbacks": RollbackCollector(),
        "reconciles": ReconcileCollector(),
        "health_tick": HealthTickCollector(),
        "celery": CeleryQueueCollector(),
        "http": HttpCollector(),
    }


def build_registry(collectors: Mapping[str, Collector] | None = None) -> CollectorRegistry:
    """A private registry for one scrape: every source, guarded, then whether each was read."""
    registry = CollectorRegistry(auto_describe=False)
    up: dict[str, bool] = {}
    for name, collector in (collectors or sources()).items():
        registry.register(Guarded(name, collector, up))
    registry.register(SourcesUp(up))
    return registry


def _refused(request: HttpRequest) -> HttpResponse | None:
    token = settings.METRICS_TOKEN
    if not token:
        raise Http404("/metrics is off: set METRICS_TOKEN.")
    given = request.headers.get("Authorization", "")
    if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return None
    response = HttpResponse("missing or wrong bearer token\n", status=401)
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refused = _refused(request)
    if refused is not None:
        return refused
    return HttpResponse(generate_latest(build_registry()), content_type=CONTENT_TYPE)


@require_GET
def metrics_rules(request: HttpRequest) -> HttpResponse:
    """Every live deployment's contract as Prometheus rules (serving.slo.rules), for the
    Prometheus that scrapes /metrics: `groups:` YAML, one file for the whole platform."""
    refused = _refused(request)
    if refused is not None:
        return refused
    text = contracts.contract_export_rules(entries=contracts.contracts_in_force())
    return HttpResponse(text, content_type="application/yaml")
