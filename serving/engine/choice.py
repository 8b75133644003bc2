"""Which engine serves a version slot, and its knobs: `builtin` (this package's paged-KV engine,
float32 eager PyTorch, Llama only, per-tenant block quotas) or `vllm` (vLLM's async engine in
the replica: real checkpoints, bf16/fp16, vLLM's throughput; serving.engine.vllm).

An engine choice is a small JSON object, `{"name": "vllm", "dtype": "bfloat16", ...}`, kept on
a deployment's revision (one per slot) and on a shared pool. `clean_engine` checks one and
fills in the defaults; EngineSpecError names the bad field. Django-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BUILTIN = "builtin"
VLLM = "vllm"
ENGINES = (BUILTIN, VLLM)
DTYPES = ("auto", "float32", "float16", "bfloat16")

# knob -> (lowest, highest, whole number, default): vLLM's settings an operator tunes.
# `cpu_kv_space_gib` is VLLM_CPU_KVCACHE_SPACE on a CPU replica (vLLM's CPU backend sizes its
# KV cache from it); on a GPU replica `gpu_memory_utilization` does.
VLLM_NUMBERS: dict[str, tuple[float, float, bool, Any]] = {
    "max_model_len": (16, 1 << 20, True, None),
    "gpu_memory_utilization": (0.05, 0.99, False, 0.9),
    "cpu_kv_space_gib": (0.0625, 1024, False, 1.0),
    "max_num_seqs": (1, 4096, True, 16),
    "tensor_parallel_size": (1, 64, True, 1),
}
VLLM_DEFAULTS: dict[str, Any] = {
    "dtype": "auto",
    "enable_prefix_caching": True,
    **{k: v[3] for k, v in VLLM_NUMBERS.items()},
}


class EngineSpecError(ValueError):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message, self.field = message, field


def _number(value: Any, field: str, low: float, high: float, integer: bool) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EngineSpecError(f"must be a number in [{low:g}, {high:g}].", field)
    if integer and int(value) != value:
        raise EngineSpecError("must be a whole number.", field)
    if not low <= value <= high:
        raise EngineSpecError(f"must be between {low:g} and {high:g}.", field)
    return int(value) if integer else float(value)


def clean_engine(
    raw: Any, field: str = "engine", *, num_gpus: float = 0.0, max_cpu_kv_gib: float | None = None
) -> dict[str, Any]:
    """A checked engine choice with every knob filled in. `raw` may be a name ("vllm") or an
    object; None is the built-in engine. `num_gpus`: the replica's GPUs (a tensor-parallel
    vLLM replica needs one per shard; a replica on a fraction of a GPU may take at most that
    fraction of its memory, its neighbours on the GPU have the rest). `max_cpu_kv_gib`: the
    platform's bound on a CPU replica's KV cache."""
    if raw is None or raw == "":
        raw = {"name": BUILTIN}
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict):
        raise EngineSpecError('must be an engine name or an object {"name": ...}.', field)
    name = raw.get("name", BUILTIN)
    if name not in ENGINES:
        raise EngineSpecError(f"must be one of {', '.join(ENGINES)}.", f"{field}.name")
    if name == BUILTIN:
        extra = sorted(set(raw) - {"name"})
        if extra:
            raise EngineSpecError(
                "the built-in engine has no such setting (its KV cache is kv_blocks and "
                "block_size).",
                f"{field}.{extra[0]}",
            )
        return {"name": BUILTIN}
    known = set(VLLM_DEFAULTS) | {"name"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise EngineSpecError(
            f"unknown vLLM setting (known: {', '.join(sorted(known - {'name'}))}).",
            f"{field}.{unknown[0]}",
        )
    out: dict[str, Any] = {"name": VLLM}
    dtype = raw.get("dtype", VLLM_DEFAULTS["dtype"])
    if dtype not in DTYPES:
        raise EngineSpecError(f"must be one of {', '.join(DTYPES)}.", f"{field}.dtype")
    out["dtype"] = dtype
    caching = raw.get("enable_prefix_caching", True)
    if not isinstance(caching, bool):
        raise EngineSpecError("must be true or false.", f"{field}.enable_prefix_caching")
    out["enable_prefix_caching"] = caching
    for knob, (low, high, integer, default) in VLLM_NUMBERS.items():
        value = raw.get(knob, default)
        out[knob] = None if value is None else _number(value, f"{field}.{knob}", low, high, integer)
    if 0 < num_gpus < 1 and out["gpu_memory_utilization"] > num_gpus:
        raise EngineSpecError(
            f"a replica on {num_gpus:g} of a GPU may use at most that share of its memory.",
            f"{field}.gpu_memory_utilization",
        )
    if num_gpus == 0 and max_cpu_kv_gib is not None and out["cpu_kv_space_gib"] > max_cpu_kv_gib:
        raise EngineSpecError(
            f"the platform allows at most {max_cpu_kv_gib:g} GiB of KV cache per CPU replica.",
            f"{field}.cpu_kv_space_gib",
        )
    shards = out["tensor_parallel_size"]
    if shards > 1 and num_gpus < shards:
        raise EngineSpecError(
            f"a replica split over {shards} GPUs needs num_gpus >= {shards} (it has {num_gpus:g}).",
            f"{field}.tensor_parallel_size",
        )
    return out


@dataclass(frozen=True)
class EngineSupport:
    """Whether an engine can serve a version, and why not."""

    engine: str
    ok: bool
    reason: str = ""


def builtin_supports(architecture: str) -> EngineSupport:
    from serving.engine.config import SUPPORTED_ARCHITECTURES

    if architecture in SUPPORTED_ARCHITECTURES:
        return EngineSupport(BUILTIN, True)
    return EngineSupport(
        BUILTIN,
        False,
        f"the built-in engine runs {', '.join(SUPPORTED_ARCHITECTURES)}, not {architecture}",
    )


# Faults that act on the built-in engine's own machinery, which vLLM does not have (a drill
# or a deployment asking for one on a vLLM slot is refused, naming it).
VLLM_UNSUPPORTED_FAULTS = {
    "weight_swap_jitter": "vLLM cannot hot-reload weights in place",
    "kv_pollution_probe": "vLLM has no per-tenant KV block quotas to probe",
}


def name_of(engine: dict[str, Any] | None) -> str:
    return str((engine or {}).get("name") or BUILTIN)
