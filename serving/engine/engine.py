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
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from serving.engine.kv_cache import BlockPool, TenantStats, chain_hashes
from serving.engine.model import KVCache, LlamaModel, Segment, build_batch


def tenant_cache_salt(secret: bytes, tenant_id: str) -> bytes:
    """The prefix-cache seed of a tenant: derived on the server, never taken from a client."""
    return hmac.new(secret, f"tenant:{tenant_id}".encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must not be negative")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


@dataclass(eq=False)  # identity: sequences are compared and removed by who they are
class Sequence:
    id: str
    tenant: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: bytes
    model: LlamaModel
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the cache
    num_registered: int = 0  # full blocks registered in the prefix cache
    last_hash: bytes | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (first admission)
    first_token_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    finish_reason: str | None = None
    preempted: int = 0
    generator: torch.Generator | None = None
    admitted_once: bool = False
    logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.id)


@dataclass(frozen=True)
class StepOutput:
    request_id: str
    token_id: int
    finished: bool
    finish_reason: str | None
    tenant: str = "default"

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.request_id)


class EngineFull(Exception):
    """A request can never fit: its prompt needs more blocks than its tenant may hold."""


class DuplicateRequest(Exception):
    """The tenant already has a live sequence under this request id."""


class Engine:
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
        self.set_limits(max_running or {}, default_max_running)

    def set_limits(self, max_running: dict[str, int], default: int | None) -> None:
        """Per-tenant running-sequence limits (a shared pool); none at all: one tenant's
        engine, scheduled in plain arrival order."""
        self.max_running = {t: max(1, int(n)) for t, n in max_running.items()}
        self.default_max_running = None if default is None else max(1, int(default))
        self._fair = bool(self.max_running) or self.default_max_running is not None

    def tenant_limit(self, tenant: str) -> int:
        """How many sequences `tenant` may run at once."""
        limit = self.max_running.get(tenant, self.default_max_running)
        return self.max_num_seqs if limit is None else min(limit, self.max_num_seqs)

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
    ) -> Sequence:
        """Queue a request. `cache_salt` is the tenant's server-derived prefix-cache salt
        (default: HMAC of this engine's secret and `tenant`); callers never pass a client's."""
        params = params or SamplingParams()
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

    # --- scheduling -----------------------------------------------------------------------
    def _free_blocks(self, seq: Sequence) -> None:
        self.pool.release(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0
        seq.num_registered = 0
        seq.last_hash = None

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        seq.finished_at = time.monotonic()
        self._free_blocks(seq)
        if seq in self.running:
            self.running.remove(seq)
        if self.sequences.get(seq.key) is seq:
            del self.sequences[seq.key]

    def _preempt(self, seq: Sequence) -> None:
        self._free_blocks(seq)
        self.running.remove(seq)
        seq.preempted += 1
        self.pool.tenant_stats(seq.tenant).preemptions += 1
        self.waiting.appendleft(seq)

    def _ensure_decode_block(self, seq: Sequence) -> bool:
        """Room for one more token; preempts the tenant's newest sequences if it must."""
        if seq.num_computed < len(seq.block_table) * self.block_size:
            return True
        while True:
            block = self.pool.allocate(seq.tenant)
            if block is not None:
                seq.block_table.append(block)
                return True
            victims = [s for s in self.running if s.tenant == seq.tenant and s is not seq]
            if not victims:
                self._preempt(seq)
                return False
            self._preempt(max(victims, key=lambda s: s.arrival))

    def _admit(self, seq: Sequence) -> bool:
        tokens = seq.tokens
        hashes = chain_hashes(seq.seed, tokens, self.block_size)
        usable = (len(tokens) - 1) // self.block_size  # keep >= 1 token to compute
        queried = len(seq.prompt_ids) if not seq.admitted_once else 0
        hits = self.pool.match_prefix(seq.tenant, hashes[:usable], queried)
        need = -(-len(tokens) // self.block_size) - len(hits)
        fresh = self.pool.allocate_many(seq.tenant, need)
        if fresh is None:
            self.pool.release(hits)
            if queried:  # counted again on the next attempt
                stats = self.pool.tenant_stats(seq.tenant)
                stats.prefix_queries -= queried
                stats.prefix_hits -= len(hits) * self.block_size
            return False
        seq.block_table = hits + fresh
        seq.num_computed = len(hits) * self.block_size
        seq.num_registered = len(hits)
        seq.last_hash = hashes[len(hits) - 1] if hits else None
        if not seq.admitted_once:
            seq.cached_tokens = seq.num_computed
            seq.admitted_once = True
        return True

    def _schedule(self) -> tuple[list[Sequence], list[Sequence]]:
        for seq in sorted(self.running, key=lambda s: s.arrival):
            if seq in self.running:  # an earlier one may have preempted it
                self._ensure_decode_block(seq)
        decodes = sorted(self.running, key=lambda s: s.arrival)
        if self._fair:
            return self._schedule_fair(), decodes
        prefills: list[Sequence] = []
        budget = self.max_prefill_tokens
        blocked: set[str] = set()
        for seq in list(self.waiting):
            if len(self.running) + len(prefills) >= self.max_num_seqs:
                break
            if seq.tenant in blocked:  # keep each tenant's order
                continue
            if prefills and len(seq.tokens) > budget:
                break
            if not self._admit(seq):
                blocked.add(seq.tenant)
                continue
            self.waiting.remove(seq)
            prefills.append(seq)
            budget -= len(seq.tokens) - seq.num_computed
        return prefills, decodes

    def _schedule_fair(self) -> list[Sequence]:
        """Admissions in a shared pool: each tenant below its limit in turn, fewest running
        first (ties: served longest ago), each tenant's own sequences in their order."""
        queues: dict[str, deque[Sequence]] = {}
        for seq in self.waiting:
            queues.setdefault(seq.tenant, deque()).append(seq)
        running: dict[str, int] = {}
        for seq in self.running:
            running[seq.tenant] = running.get(seq.tenant, 0) + 1
        candidates = {t for t in queues if running.get(t, 0) < self.tenant_limit(t)}
        prefills: list[Sequence] = []
        budget = self.max_prefill_tokens
        while candidates and len(self.running) + len(prefills) < self.max_num_seqs:
            tenant = min(
                candidates,
                key=lambda t: (running.get(t, 0), self._served_turn.get(t, 0), t),
            )
            seq = queues[tenant][0]
            if prefills and len(seq.tokens) > budget:
                candidates.discard(tenant)  # waits for a step with room; others may fit
                continue
            if not self._admit(seq):
                candidates.discard(tenant)  # keep the tenant's order: its next ones wait
                continue
            queues[tenant].popleft()
            prefills.append(seq)
            budget -= len(seq.tokens) - seq.num_computed
            running[tenant] = running.get(tenant, 0) + 1
            self._served_turn[tenant] = next(self._turns)
            if not queues[tenant] or running[tenant] >= self.tenant_limit(tenant):
                candidates.discard(tenant)
        if prefills:
            admitted = set(map(id, prefills))
            self.waiting = deque(s for s in self.waiting if id(s) not in admitted)
        return prefills

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
        new = chain_hashes(
            seq.seed, seq.tokens[: full * self.block_size], self.block_size,
            start=seq.num_registered, previous=seq.last_hash,
        )  # fmt: skip
        for index, block_hash in enumerate(new, start=seq.num_registered):
            self.pool.register(seq.block_table[index], block_hash)
        seq.num_registered = full
        seq.last_hash = new[-1]

    def step(self) -> list[StepOutput]:
        prefills, decodes = self._schedule()
        self.running.extend(prefills)
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
                if seq.first_token_at is None:
                    seq.first_token_at = now
                reason = self._stop_reason(seq, token)
                if reason is not None:
                    self._finish(seq, reason)
                outputs.append(StepOutput(seq.id, token, reason is not None, reason, seq.tenant))
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
        return {**snapshot, "waiting": len(self.waiting), "running": len(self.running)}
