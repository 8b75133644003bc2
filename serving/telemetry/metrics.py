"""Prometheus `/metrics` (token-protected: `Authorization: Bearer <METRICS_TOKEN>`): the GPU
agents' newest samples with DCGM exporter names and units, and the replicas' KV cache and
engine counters with vLLM names, labelled by tenant and deployment.

Like dcgm-exporter on Kubernetes (one series per pod using a GPU), a device's series carry
the tenant and deployment of each replica on it (`tenant=""` when none is); a replica's own
GPU memory is `portal_gpu_process_fb_used_mib`. Simulated samples carry `simulated="true"`.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from serving.telemetry import agent as gpu_agent

MIB = 1 << 20

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
# vLLM metric -> (type, help, replica kv/totals key)
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


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: Any) -> str:
    return repr(float(value)) if value is not None else "NaN"


def gpu_lines(snapshots: Iterable[Mapping[str, Any]]) -> list[str]:
    out: list[str] = []
    series: dict[str, list[str]] = {name: [] for name, *_ in DCGM}
    processes: list[str] = []
    for snapshot in snapshots:
        by_device: dict[str, set[tuple[str, str]]] = {}
        for p in snapshot.get("processes", []):
            if p.get("tenant"):
                by_device.setdefault(p["device_uuid"], set()).add((p["tenant"], p["deployment"]))
                processes.append(
                    "portal_gpu_process_fb_used_mib"
                    + _labels(
                        {
                            "gpu": p["device_index"],
                            "UUID": p["device_uuid"],
                            "Hostname": snapshot["node"],
                            "tenant": p["tenant"],
                            "deployment": p["deployment"],
                            "replica": p["replica"],
                            "simulated": str(bool(snapshot.get("simulated"))).lower(),
                        }
                    )
                    + f" {_number(p['used_memory'] / MIB)}"
                )
        for device in snapshot.get("devices", []):
            owners = sorted(by_device.get(device["uuid"], set())) or [("", "")]
            for tenant, deployment in owners:
                labels = _labels(
                    {
                        "gpu": device["index"],
                        "UUID": device["uuid"],
                        "device": f"nvidia{device['index']}",
                        "modelName": device["name"],
                        "Hostname": snapshot["node"],
                        "tenant": tenant,
                        "deployment": deployment,
                        "simulated": str(bool(snapshot.get("simulated"))).lower(),
                    }
                )
                for name, _, key, scale in DCGM:
                    series[name].append(f"{name}{labels} {_number(device[key] * scale)}")
    for name, help_text, *_ in DCGM:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *series[name]]
    out += [
        "# HELP portal_gpu_process_fb_used_mib GPU memory of one replica's process (in MiB).",
        "# TYPE portal_gpu_process_fb_used_mib gauge",
        *processes,
    ]
    return out


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


def engine_lines(
    replicas: Iterable[Mapping[str, Any]], owners: Mapping[str, gpu_agent.Owner]
) -> list[str]:
    rows: dict[str, list[str]] = {name: [] for name, *_ in VLLM}
    for replica in replicas:
        owner = owners.get(str(replica.get("app")))
        if owner is None:
            continue
        labels = _labels(
            {
                "model_name": replica.get("version", ""),
                "tenant": owner.tenant,
                "deployment": owner.deployment,
                "group": replica.get("group", ""),
                "replica": replica.get("replica", ""),
            }
        )
        for name, value in engine_values(replica, owner.tenant_id).items():
            suffix = "_total" if dict((n, t) for n, t, _ in VLLM)[name] == "counter" else ""
            rows[name].append(f"{name}{suffix}{labels} {_number(value)}")
    out: list[str] = []
    for name, kind, help_text in VLLM:
        # Text format 0.0.4: the family is named as its samples are (a counter's `_total`
        # included), or Prometheus reads the samples as untyped.
        family = f"{name}_total" if kind == "counter" else name
        out += [f"# HELP {family} {help_text}", f"# TYPE {family} {kind}", *rows[name]]
    return out


def _published_replicas() -> list[dict[str, Any]]:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    out = []
    for key in client.scan_iter(match=f"{settings.SLI_KEY_PREFIX}:sli:*", count=500):
        out += [json.loads(v) for v in client.hgetall(key).values()]
    return out


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if not token:
        raise Http404("/metrics is off: set METRICS_TOKEN.")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        response = HttpResponse("missing or wrong bearer token\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    lines = gpu_lines(gpu_agent.latest_snapshots())
    lines += engine_lines(_published_replicas(), gpu_agent.owners_map())
    return HttpResponse(
        "\n".join(lines) + "\n", content_type="text/plain; version=0.0.4; charset=utf-8"
    )
