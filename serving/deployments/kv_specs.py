"""A deployment's KV cache lifetime settings (`kv_cache`, seed 000 §4.1): prefix caching on or
off and a max age for cached blocks, checked (`clean_kv_cache`) and compiled into its version
slots' user_config (serving.control.compile), so a change reaches the replicas without a
restart; a shared deployment's apply to its own blocks in the pool only (serving.engine.kv_cache:
a tenant's policy never reaches another tenant's blocks, and salts keep chains apart whatever
the policy).

On a vLLM slot prefix caching maps to vLLM's `enable_prefix_caching`, an init arg: changing it
rolls the slot's replicas (each replacement started before the old one drains). vLLM keeps no
per-block age, so `max_age_s` is refused for a vLLM slot (or a vLLM pool).
"""

from __future__ import annotations

from typing import Any

from portal.exceptions import ValidationFailed
from serving.deployments.models import KvMode, SharedPool
from serving.deployments.spec_checks import number, settings_object
from serving.engine.choice import VLLM, name_of

KV_CACHE_KEYS = ("prefix_caching", "max_age_s")
MAX_AGE_S = (1, 7 * 86400)  # a second to a week: the seed's 30 s fits, nothing unbounded


def clean_kv_cache(spec: dict[str, Any], field: str = "kv_cache") -> dict[str, Any]:
    """`spec["kv_cache"]` checked: {"prefix_caching": bool (default true), "max_age_s":
    seconds (default none: blocks live until evicted)}; {} for the defaults."""
    raw = settings_object(spec.get(field), field, KV_CACHE_KEYS)
    out: dict[str, Any] = {}
    if "prefix_caching" in raw:
        if not isinstance(raw["prefix_caching"], bool):
            raise ValidationFailed("must be true or false.", field=f"{field}.prefix_caching")
        out["prefix_caching"] = raw["prefix_caching"]
    if raw.get("max_age_s") is not None:
        low, high = MAX_AGE_S
        out["max_age_s"] = number(raw["max_age_s"], f"{field}.max_age_s", low, high)
        engine = _vllm_slot(spec)
        if engine is not None:
            raise ValidationFailed(
                f"vLLM keeps no per-block age ({engine} runs on vLLM): max_age_s needs the "
                "built-in engine; prefix_caching false is what vLLM can do.",
                field=f"{field}.max_age_s",
            )
    return out


def _vllm_slot(spec: dict[str, Any]) -> str | None:
    """Which part of the deployment runs on vLLM (its slots, or its shared pool), if any."""
    if spec.get("kv_mode") == KvMode.SHARED:
        pools = SharedPool.objects.filter(pk=spec.get("pool_id") or 0)
        found = pools.values_list("engine", flat=True).first()
        return "its pool" if found and name_of(found) == VLLM else None
    for key, what in (("engine", "the stable slot"), ("canary_engine", "the canary")):
        engine = spec.get(key)
        if isinstance(engine, dict) and engine.get("name") == VLLM:
            return what
    return None
