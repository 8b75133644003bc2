"""A tenant's GPU memory cap per replica (Quota.max_gpu_memory_mb_per_replica), checked when a
deployment is created or changed: one replica of each of its version slots must fit, sized
from the version's config and the engine's settings the same way the engine sizes itself
(serving.engine.memory):

- built-in engine: weights (parameters x 4 bytes; the artifact's unpacked size where the
  config gives no parameter count) + the whole KV cache (`kv_blocks`, allocated up front) +
  the activations of its largest step;
- vLLM on a GPU: the share of the replica's GPUs it takes (`gpu_memory_utilization`); on CPU,
  weights + its KV space (`cpu_kv_space_gib`).

A shared deployment's replicas are its pool's (the platform's): there the engine holds the
tenant's KV blocks and activations under the cap at run time. The cap reaches every replica
through its user_config (`gpu_memory_mb`), and the engine refuses to grow past it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from portal.exceptions import QuotaExceeded
from serving.control.specs import DeploymentSpec
from serving.deployments import replica_limits
from serving.deployments.models import KvMode
from serving.engine.memory import CAP_FIELD, MIB, Shapes, mib, replica_bytes
from serving.registry.models import ModelVersion
from tenants.models import Quota

# The built-in engine's batch in a dedicated deployment.
DEDICATED_MAX_NUM_SEQS = DeploymentSpec.max_num_seqs
GIB = 1 << 30
# (version field of the spec, its engine field, the field an error names for the version)
SLOTS = (
    ("stable_version_id", "engine", "version"),
    ("canary_version_id", "canary_engine", "canary_version"),
)


def slot_bytes(
    version: ModelVersion, engine: dict[str, Any], spec: dict[str, Any]
) -> tuple[dict[str, int], str]:
    """What one replica of this slot holds ({weights, kv_cache, activations, total}) and the
    spec field that sizes the part beyond the weights."""
    summary = dict(version.config_summary or {})
    shapes = Shapes.of(summary)
    weights = shapes.weight_bytes() if shapes.parameters else int(version.size_bytes or 0)
    if engine.get("name") == "vllm":
        if float(spec["num_gpus"]) > 0:
            per_gpu = float(
                getattr(settings, "REPLICA_MB_PER_GPU", replica_limits.DEFAULT_MB_PER_GPU)
            )
            share = float(engine["gpu_memory_utilization"]) * float(spec["num_gpus"])
            total = int(share * per_gpu) * MIB
            sizes = {"weights": weights, "kv_cache": max(0, total - weights), "activations": 0}
            return {**sizes, "total": total}, "engine.gpu_memory_utilization"
        kv = int(float(engine["cpu_kv_space_gib"]) * GIB)
        sizes = {"weights": weights, "kv_cache": kv, "activations": 0, "total": weights + kv}
        return sizes, "engine.cpu_kv_space_gib"
    if not shapes.known:
        sizes = {"weights": weights, "kv_cache": 0, "activations": 0, "total": weights}
        return sizes, "kv_blocks"
    sizes = replica_bytes(
        shapes,
        kv_blocks=int(spec["kv_blocks"]),
        block_size=int(spec["block_size"]),
        max_num_seqs=DEDICATED_MAX_NUM_SEQS,
    )
    sizes["weights"] = weights
    sizes["total"] = weights + sizes["kv_cache"] + sizes["activations"]
    return sizes, "kv_blocks"


def check_replica_memory(*, quota: Quota, spec: dict[str, Any]) -> None:
    """QuotaExceeded naming the field when one replica of a slot would need more GPU memory
    than the tenant's cap: the version's (its weights alone are too big) or the engine
    setting that sizes the rest (`kv_blocks`, vLLM's `engine.gpu_memory_utilization`)."""
    if spec.get("kv_mode") == KvMode.SHARED:
        return
    cap = int(quota.max_gpu_memory_mb_per_replica) * MIB
    ids = [spec[field] for field, _, _ in SLOTS if spec.get(field)]
    versions = ModelVersion.objects.filter(pk__in=ids).only("config_summary", "size_bytes")
    by_id = {v.pk: v for v in versions}
    for version_field, engine_field, name in SLOTS:
        version = by_id.get(spec.get(version_field) or 0)
        if version is None:
            continue
        engine = spec.get(engine_field) or spec.get("engine") or {"name": "builtin"}
        sizes, sized_by = slot_bytes(version, engine, spec)
        if sizes["total"] <= cap:
            continue
        field = name if sizes["weights"] > cap else sized_by
        if field == "engine.gpu_memory_utilization" and engine_field == "canary_engine":
            field = "canary_engine.gpu_memory_utilization"
        raise QuotaExceeded(
            f"one replica of this {name.replace('_', ' ')} needs {mib(sizes['total'])} of GPU "
            f"memory (weights {mib(sizes['weights'])}, KV cache {mib(sizes['kv_cache'])}, "
            f"activations {mib(sizes['activations'])}); the tenant's cap is {mib(cap)} per "
            f"replica ({CAP_FIELD}).",
            field=field,
        )
