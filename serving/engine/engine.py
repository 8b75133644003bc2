"""Continuous batching over the paged KV cache.

Each `step()` admits waiting sequences whose blocks fit (prefix-cache hits first), runs one
forward pass per model generation with every admitted prefill and every running decode in it,
samples one token per sequence, and registers the blocks that became full. When a running
sequence needs a block its tenant cannot get, the tenant's newest sequence is preempted
(its blocks freed, recomputed later). Sequences keep the model they started on, so a hot
weight swap never mixes weights within one request.

In a shared pool (`set_limits()` given) each tenant runs at most its `max_running` sequences;
the rest wait in that tenant's own order, and free slots go to the tenant with the fewest
running sequences (ties: the one served longest ago), so one tenant's flood never takes
another's slots. Sequences are known by (tenant, request id): a request id chosen by one
tenant can never address, cancel or collide with another tenant's sequence.

This module holds `Engine` (requests, the forward/step loop, sampling, metrics); the sequence
dataclasses, the errors and the admission/preemption half (`Scheduler`) live in
serving.engine.scheduler and are re-exported here.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import time
from collections import deque
from typing import Any

import torch

from serving.engine.kv_cache import BlockPool, TenantStats
from serving.engine.memory import MemoryGuard, allocator_report, engine_shapes
from serving.engine.model import KVCache, LlamaModel, Segment, build_batch
from serving.engine.priority import REALTIME, check_priority
from serving.engine.scheduler import (
    DuplicateRequest,
    EngineFull,
    SamplingParams,
    Scheduler,
    Sequence,
    StepOutput,
)


def tenant_cache_salt(secret: bytes, tenant_id: str) -> bytes:
    """The prefix-cache seed of a tenant: derived on the server, never taken from a client."""
    return hmac.new(secret, f"tenant:{tenant_id}".encode(), hashlib.sha256).digest()


class Engine(Scheduler):
    def __init__(
        self,
        model: LlamaModel,
        *,
        num_blocks: int = 256,
        block_size: int = 16,
        max_num_seqs: int = 32,
        max_prefill_tokens: int = 4096,
        quotas: dict[str, int] | None = None,
        default_quota: int | None = None,
        max_running: dict[str, int] | None = None,
        default_max_running: int | None = None,
        cache_secret: bytes = b"",
        keep_logits: bool = False,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, block_size, dict(quotas or {}), default_quota)
        self.cache = KVCache(
            model.config, num_blocks, block_size, dtype=model.dtype, device=model.device
        )
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        # GPU memory: the admission check and the tenants' caps (serving.engine.memory).
        self.memory = MemoryGuard(
            engine_shapes(model), block_size, num_blocks, max_prefill_tokens, model.device
        )
        self.cache_secret = cache_secret
        self.keep_logits = keep_logits  # tests compare every step against a reference
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.sequences: dict[tuple[str, str], Sequence] = {}  # live ones, by (tenant, id)
        self._ids = itertools.count()
        self._turns = itertools.count(1)
        self._served_turn: dict[str, int] = {}  # tenant -> turn it was last admitted on
        self.max_running: dict[str, int] = {}
        self.default_max_running: int | None = None
        self._fair = False
        self.priority_counts: dict[str, dict[str, int]] = {}  # serving.engine.priority
        self.promoted_at: dict[str, float] = {}
        self.set_limits(max_running or {}, default_max_running)

    # --- requests -------------------------------------------------------------------------
    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        *,
        tenant: str = "default",
        request_id: str | None = None,
        salted: bool = True,
        cache_salt: bytes | None = None,
        priority: str = REALTIME,
    ) -> Sequence:
        """Queue a request. `cache_salt` is the tenant's server-derived prefix-cache salt
        (default: HMAC of this engine's secret and `tenant`); callers never pass a client's.
        `priority`: its key's class, realtime or batch (serving.engine.priority)."""
        params = params or SamplingParams()
        check_priority(priority)
        self.check_admissible(len(prompt_ids), params.max_tokens, tenant)
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
            while (tenant, request_id) in self.sequences:
                request_id = f"req-{next(self._ids)}"
        elif (tenant, request_id) in self.sequences:
            raise DuplicateRequest(f"request id {request_id!r} is already in flight")
        if cache_salt is None:
            cache_salt = tenant_cache_salt(self.cache_secret, tenant)
        salt = cache_salt if salted else b""
        seed = hashlib.sha256(salt + self.model.fingerprint.encode()).digest()
        seq = Sequence(
            id=request_id,
            tenant=tenant,
            prompt_ids=list(prompt_ids),
            params=params,
            seed=seed,
            model=self.model,
            priority=priority,
        )
        if params.seed is not None and params.temperature > 0:
            seq.generator = torch.Generator(device=self.model.device).manual_seed(params.seed)
        self.waiting.append(seq)
        self.sequences[seq.key] = seq
        return seq

    def check_admissible(self, prompt_tokens: int, max_tokens: int, tenant: str) -> None:
        """Raise ValueError (context) or EngineFull (KV quota) for a request that can never
        run; callers check before they promise a client an answer."""
        if prompt_tokens < 1:
            raise ValueError("prompt_ids must not be empty")
        limit = self.model.config.max_position_embeddings
        if prompt_tokens + max_tokens > limit:
            raise ValueError(
                f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds "
                f"the model's context of {limit}"
            )
        running = [len(s.tokens) for s in self.running]  # the batch it would join
        self.memory.check(tenant, prompt_tokens, max_tokens, running)
        need = -(-(prompt_tokens + max_tokens) // self.block_size)
        if need > self.pool.quota(tenant):
            raise EngineFull(
                f"needs {need} KV blocks, tenant {tenant!r} may hold {self.pool.quota(tenant)}"
            )

    def abort(self, request_id: str, *, tenant: str) -> None:
        """Stop `tenant`'s sequence `request_id` (another tenant's of the same id is never
        touched); nothing happens when it is not live."""
        seq = self.sequences.get((tenant, request_id))
        if seq is None:
            return
        if seq in self.running:
            self._finish(seq, "abort")
            return
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.finish_reason = "abort"
        self.sequences.pop(seq.key, None)

    def swap_model(self, model: LlamaModel) -> None:
        """New requests use `model`; running ones finish on the weights they started with."""
        if model.config != self.model.config:
            raise ValueError("a hot swap needs the same architecture and shapes")
        self.model = model

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- execution ------------------------------------------------------------------------
    def _sample(self, seq: Sequence, logits: torch.Tensor) -> int:
        p = seq.params
        if p.temperature == 0:
            return int(torch.argmax(logits).item())
        probs = torch.softmax(logits / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, 0) - sorted_probs < p.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=seq.generator).item())

    def _register_full_blocks(self, seq: Sequence) -> None:
        full = seq.num_computed // self.block_size
        if full <= seq.num_registered:
            return
        new = self.pool.register_chain(  # each block with how its hash was made (kv_integrity)
            seq.block_table,
            seq.seed,
            seq.model.fingerprint,
            seq.tokens[: full * self.block_size],
            start=seq.num_registered,
            previous=seq.last_hash,
        )
        seq.num_registered = full
        seq.last_hash = new[-1]

    def step(self) -> list[StepOutput]:
        prefills, decodes = self._schedule()
        self.running.extend(prefills)
        scheduled = time.monotonic()
        for seq in prefills:
            seq.scheduled_at = seq.scheduled_at or scheduled
        batch_seqs = prefills + decodes
        if not batch_seqs:
            return []
        outputs: list[StepOutput] = []
        by_model: dict[int, list[Sequence]] = {}
        for seq in batch_seqs:
            by_model.setdefault(id(seq.model), []).append(seq)
        for group in by_model.values():
            model = group[0].model
            segments = [
                Segment(s.tokens[s.num_computed :], s.num_computed, s.block_table) for s in group
            ]
            batch = build_batch(segments, self.block_size, model.device)
            logits = model.forward(batch, self.cache)
            now = time.monotonic()
            greedy = logits.argmax(dim=-1).tolist()  # one op for every greedy row
            for row, seq in enumerate(group):
                seq.num_computed = len(seq.tokens)
                self._register_full_blocks(seq)
                if self.keep_logits:
                    seq.logits.append(logits[row].clone())
                if seq.params.temperature == 0:
                    token = greedy[row]
                else:
                    token = self._sample(seq, logits[row])
                seq.output_ids.append(token)
                seq.token_times.append(now)
                queued, cached = None, None
                if seq.first_token_at is None:
                    seq.first_token_at = now
                    queued, cached = (seq.scheduled_at or now) - seq.arrival, seq.cached_tokens
                reason = self._stop_reason(seq, token)
                if reason is not None:
                    self._finish(seq, reason)
                outputs.append(
                    StepOutput(
                        seq.id, token, reason is not None, reason, seq.tenant, queued, cached
                    )
                )
        return outputs

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.params.stop_token_ids:
            return "stop"
        if not seq.params.ignore_eos and token in seq.model.config.eos_token_ids:
            return "stop"
        if len(seq.output_ids) >= seq.params.max_tokens:
            return "length"
        return None

    def run_until_done(self, seqs: list[Sequence] | None = None) -> None:
        while self.has_work() and (seqs is None or not all(s.finished for s in seqs)):
            if not self.step() and not self.running:
                raise EngineFull("waiting requests cannot be scheduled")

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | None = None,
        *,
        tenant: str = "default",
    ) -> list[Sequence]:
        seqs = [self.add_request(p, params, tenant=tenant) for p in prompts]
        self.run_until_done(seqs)
        return seqs

    def metrics(self) -> dict[str, Any]:
        """The pool's snapshot; each tenant's entry also says what it runs, what waits and
        how many it may run at once (its share of the batch)."""
        snapshot = self.pool.snapshot()
        tenants: dict[str, dict[str, Any]] = snapshot["tenants"]
        counts: dict[str, list[int]] = {}
        for seq in self.running:
            counts.setdefault(seq.tenant, [0, 0])[0] += 1
        for seq in self.waiting:
            counts.setdefault(seq.tenant, [0, 0])[1] += 1
        for tenant in set(tenants) | set(counts) | set(self.max_running):
            running, waiting = counts.get(tenant, (0, 0))
            entry = tenants.get(tenant)
            if entry is None:
                entry = tenants[tenant] = {
                    **(self.pool.stats.get(tenant) or TenantStats()).as_dict(),
                    "quota": self.pool.quota(tenant),
                }
            entry.update(running=running, waiting=waiting, max_running=self.tenant_limit(tenant))
            entry.update(self.priority_metrics(tenant))
        return {
            **snapshot,
            "waiting": len(self.waiting),
            "running": len(self.running),
            "device_memory": allocator_report(self.model.device),  # None off CUDA
        }


__all__ = [
    "DuplicateRequest",
    "Engine",
    "EngineFull",
    "SamplingParams",
    "Scheduler",
    "Sequence",
    "StepOutput",
    "tenant_cache_salt",
]
