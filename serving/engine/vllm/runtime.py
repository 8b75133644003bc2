"""vLLM's async engine (AsyncLLM, V1) inside a version replica, behind the built-in engine's
interface (serving.engine.async_engine.AsyncEngine): `submit()` gives a stream of TokenEvents
that `close()` aborts, `check_admissible()` refuses what cannot fit, `metrics()` is the same
KV snapshot shape. The version server (serving.dataplane.version) therefore tokenizes, applies
the chat template and the stop sequences, counts SLIs and enforces tenants the same way for
both engines.

Priority classes: vLLM runs its "priority" scheduling policy and each request's key class is
its `priority`, aged by deadline (serving.engine.priority.vllm_priority).

Isolation: every request carries its tenant's server-derived salt as vLLM's `cache_salt`, so
vLLM's prefix cache never matches a block across tenants. The salt comes from the replica's
user_config, never from the client.

Stats come from vLLM itself: a stat logger (`VllmStats`) registered with the engine receives
every scheduler step's SchedulerStats (prefix-cache queries and hits, KV usage, running,
waiting) and IterationStats (preemptions); each finished request's `num_cached_tokens`
(vLLM's per-request prefix-cache hit) is counted per tenant.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.engine.async_engine import TokenEvent
from serving.engine.engine import DuplicateRequest
from serving.engine.priority import REALTIME, PriorityRules, vllm_priority

GIB = 1 << 30


@dataclass
class TenantCounters:
    prefix_queries: int = 0  # prompt tokens sent (each looked up in vLLM's prefix cache)
    prefix_hits: int = 0  # of those, tokens vLLM found cached (RequestOutput.num_cached_tokens)
    preemptions: int = 0
    requests: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "prefix_queries": self.prefix_queries,
            "prefix_hits": self.prefix_hits,
            "preemptions": self.preemptions,
            "requests": self.requests,
            "blocks_used": 0,
            "evictions": 0,
        }


@dataclass
class VllmStats:
    """vLLM's own counters, as its stat logger hands them over once per engine step (in this
    process, on the engine's output loop). Cumulative since the engine started."""

    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    kv_usage: float = 0.0
    running: int = 0
    waiting: int = 0
    steps: int = 0
    ttft_s: list[float] = field(default_factory=list)

    def logger(self) -> Any:
        """A vLLM StatLoggerBase that feeds this object (vLLM calls it per engine index)."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        stats = self

        class _Logger(StatLoggerBase):  # type: ignore[misc]
            def __init__(self, vllm_config: Any = None, engine_index: int = 0) -> None:
                self.engine_index = engine_index

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                stats.steps += 1
                if scheduler_stats is not None:
                    prefix = scheduler_stats.prefix_cache_stats  # deltas since the last step
                    stats.prefix_queries += int(prefix.queries)
                    stats.prefix_hits += int(prefix.hits)
                    stats.kv_usage = float(scheduler_stats.kv_cache_usage)
                    stats.running = int(scheduler_stats.num_running_reqs)
                    stats.waiting = int(scheduler_stats.num_waiting_reqs)
                if iteration_stats is not None:
                    stats.preemptions += int(iteration_stats.num_preempted_reqs)

            def log_engine_initialized(self) -> None:
                pass

        return lambda config, index: _Logger(config, index)


def engine_args(path: Path, options: dict[str, Any]) -> Any:
    """AsyncEngineArgs from an engine choice (serving.engine.choice.clean_engine's output)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    gpu = bool(options.get("gpu"))
    kwargs: dict[str, Any] = {
        "model": str(path),
        "tokenizer": str(path),
        "dtype": options.get("dtype") or "auto",
        "max_num_seqs": int(options.get("max_num_seqs") or 16),
        "enable_prefix_caching": bool(options.get("enable_prefix_caching", True)),
        "tensor_parallel_size": int(options.get("tensor_parallel_size") or 1),
        "gpu_memory_utilization": float(options.get("gpu_memory_utilization") or 0.9),
        "disable_log_stats": True,  # our stat logger still gets every step's stats
        "scheduling_policy": "priority",  # key priority classes (serving.engine.priority)
        "seed": 0,
    }
    if options.get("max_model_len"):
        kwargs["max_model_len"] = int(options["max_model_len"])
    if not gpu:
        # The KV cache of a CPU replica, in bytes (VLLM_CPU_KVCACHE_SPACE, whole GiB, would
        # override it: it is cleared for this process and its engine's children).
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        kwargs["kv_cache_memory_bytes"] = int(float(options.get("cpu_kv_space_gib") or 1) * GIB)
        kwargs["enforce_eager"] = True  # no torch.compile on a CPU replica (minutes of startup)
    return AsyncEngineArgs(**kwargs)


class VllmStream:
    """One request's tokens as TokenEvents; `close()` aborts it in vLLM if it still runs."""

    def __init__(self, engine: VllmEngine, request_id: str, outputs: Any, tenant: str) -> None:
        self.engine, self.request_id, self.tenant = engine, request_id, tenant
        self._outputs = outputs
        self._pending: list[TokenEvent] = []
        self._done = False

    def __aiter__(self) -> VllmStream:
        return self

    async def __anext__(self) -> TokenEvent:
        while not self._pending:
            if self._done:
                raise StopAsyncIteration
            try:
                out = await self._outputs.__anext__()
            except StopAsyncIteration:
                self._done = True
                raise
            self._take(out)
        return self._pending.pop(0)

    def _take(self, out: Any) -> None:
        now = time.time()
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        cached = None  # vLLM's per-request prefix-cache hit, known once the request finished
        if out.finished:
            self._done = True
            cached = int(out.num_cached_tokens or 0)
            counters = self.engine.tenant(self.tenant)
            counters.prefix_hits += cached
            counters.requests += 1
        reason = _finish_reason(completion.finish_reason) if out.finished else None
        for i, token in enumerate(ids):
            last = out.finished and i == len(ids) - 1
            hit = cached if last else None
            self._pending.append(
                TokenEvent(int(token), last, reason if last else None, now, cached_tokens=hit)
            )
        if out.finished and not ids:  # vLLM may end a stream with no new token
            self._pending.append(TokenEvent(-1, True, reason, now, cached_tokens=cached))

    def close(self) -> None:
        self.engine.forget(self.request_id)
        if not self._done:
            self._done = True
            self.engine.abort_later(self.request_id)
        aclose = getattr(self._outputs, "aclose", None)
        if aclose is not None:
            asyncio.ensure_future(aclose())


def _finish_reason(reason: str | None) -> str:
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(reason or "", "stop")


class VllmEngine:
    """AsyncLLM in this process (its engine core and workers in child processes)."""

    def __init__(self, path: Path, options: dict[str, Any]) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        self.options = dict(options)
        self.stats = VllmStats()
        self.llm: Any = AsyncLLM.from_engine_args(
            engine_args(path, options), stat_loggers=[self.stats.logger()]
        )
        self.max_model_len = int(self.llm.vllm_config.model_config.max_model_len)
        cache = self.llm.vllm_config.cache_config
        self.block_size = int(cache.block_size or 16)
        self.num_blocks = int(getattr(cache, "num_gpu_blocks", 0) or 0)
        self.tenants: dict[str, TenantCounters] = {}
        self._active: set[str] = set()
        self.epoch = time.monotonic()  # vLLM priorities count from here

    def tenant(self, tenant: str) -> TenantCounters:
        return self.tenants.setdefault(tenant, TenantCounters())

    def check_admissible(self, prompt_tokens: int, max_tokens: int, tenant: str) -> None:
        """The built-in engine's refusal for a request that cannot fit the context (400)."""
        if prompt_tokens + max_tokens > self.max_model_len:
            raise ValueError(
                f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds "
                f"this model's context of {self.max_model_len} tokens"
            )

    def submit(
        self,
        prompt_ids: list[int],
        params: Any,
        *,
        tenant: str,
        request_id: str,
        cache_salt: bytes,
        priority: str = REALTIME,
    ) -> VllmStream:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        key = f"{tenant}:{request_id}"
        if key in self._active:
            raise DuplicateRequest(f"request id {request_id!r} is already running")
        sampling = SamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            output_kind=RequestOutputKind.DELTA,
        )
        # The tenant's salt, server-derived: vLLM hashes it into the first block's key, so a
        # prefix cached under one salt is never found under another.
        prompt: Any = {"prompt_token_ids": list(prompt_ids), "cache_salt": cache_salt.hex()}
        # The key's class as vLLM's priority, aged by deadline (batch yields for at most the
        # built-in engine's time bound): serving.engine.priority.vllm_priority.
        rank = vllm_priority(
            priority, now=time.monotonic(), epoch=self.epoch, bound_s=PriorityRules.batch_max_wait_s
        )
        outputs = self.llm.generate(prompt, sampling, key, priority=rank)
        self._active.add(key)
        counters = self.tenant(tenant)
        counters.prefix_queries += len(prompt_ids)
        return VllmStream(self, key, outputs, tenant)

    def forget(self, key: str) -> None:
        self._active.discard(key)

    def abort_later(self, key: str) -> None:
        asyncio.ensure_future(self.llm.abort(key))

    def metrics(self) -> dict[str, Any]:
        """The built-in engine's KV snapshot shape, from vLLM's own counters; preemptions
        are vLLM's engine-wide count, attributed to the slot's tenants by their requests."""
        used = round(self.num_blocks * self.stats.kv_usage)
        tenants = {t: c.as_dict() for t, c in self.tenants.items()}
        if len(tenants) == 1:
            next(iter(tenants.values()))["preemptions"] = self.stats.preemptions
        return {
            "engine": "vllm",
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "free_blocks": self.num_blocks - used,
            "cached_blocks": 0,
            "fragmentation": 0.0,
            "tenants": tenants,
            "running": self.stats.running,
            "waiting": self.stats.waiting,
            "vllm": {
                "prefix_cache_queries": self.stats.prefix_queries,
                "prefix_cache_hits": self.stats.prefix_hits,
                "num_preemptions": self.stats.preemptions,
                "kv_cache_usage_perc": round(self.stats.kv_usage, 6),
                "steps": self.stats.steps,
            },
        }

    # The built-in engine's tenant controls: vLLM has no per-tenant block quotas or batch
    # shares (a shared vLLM pool bounds each tenant by its request slots in the router).
    def set_quotas(self, quotas: dict[str, int], default: int | None) -> None:
        pass

    def set_limits(self, limits: dict[str, int], default: int | None) -> None:
        pass

    def drop_tenant(self, tenant: str) -> None:
        self.tenants.pop(tenant, None)

    def shutdown(self) -> None:
        """Stops vLLM's engine core and workers (child processes); idempotent. The engine is
        dropped here so its own finalizer never runs at interpreter exit."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown()
            del llm
            gc.collect()
