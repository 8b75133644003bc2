"""Sequence state and the scheduler of the engine: what a request is and how it gets a slot.

The request and sequence dataclasses, the engine's errors, and `Scheduler`, the part of the
`Engine` that admits waiting sequences into the batch (prefix-cache hits first, per-tenant
limits in a shared pool, fewest running first), makes room for decodes by preempting a tenant's
newest sequence, and frees the blocks of finished ones. `Engine` (serving.engine.engine) runs
the forward pass over what it schedules.

Priority classes (an inference key's `realtime` or `batch`): realtime sequences are admitted
before waiting batch ones; when room is needed (a decode block, a tenant's share of the batch,
an engine slot) batch ones are preempted first, newest first. Per-tenant limits stay hard caps:
a realtime sequence takes the place of its own tenant's batch one, or another tenant's only
while that tenant runs more sequences than its own, so marking every key realtime wins a tenant
nothing beyond its share. Blocks come only from the tenant's own sequences (its quota).

Starvation bound (aging): each tenant's oldest waiting batch sequence is promoted to realtime
rank once it has waited `batch_max_wait_steps` scheduling steps as the oldest, or
`batch_max_wait_s` seconds since it arrived and since the tenant's last promotion; a promoted
sequence keeps its arrival order and is never again preempted for priority. One promoted
sequence per tenant waits at a time, so under a realtime flood a tenant's batch queue still
advances one sequence per bound, and realtime work meets at most that one.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from serving.engine.kv_cache import BlockPool, chain_hashes
from serving.engine.model import LlamaModel
from serving.engine.priority import BATCH, REALTIME, PriorityRules


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
    scheduled_at: float | None = None  # first admitted into a batch (its queue time ends)
    token_times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    finish_reason: str | None = None
    preempted: int = 0
    generator: torch.Generator | None = None
    admitted_once: bool = False
    logits: list[torch.Tensor] = field(default_factory=list)
    priority: str = REALTIME  # the key's class: batch waits behind realtime until it ages
    waited_steps: int = 0  # scheduling steps waited as its tenant's oldest batch sequence
    aged: bool = False  # batch that waited past the bound: ranks as realtime from then on

    @property
    def rank(self) -> int:
        """0: admitted first and preempted last (realtime, or batch that aged); 1: batch."""
        return 1 if self.priority == BATCH and not self.aged else 0

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
    queued_s: float | None = None  # on a sequence's first token: arrival until scheduled
    cached_tokens: int | None = None  # on its first token: prompt tokens found in the cache

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.request_id)


class EngineFull(Exception):
    """A request can never fit: its prompt needs more blocks than its tenant may hold."""


class DuplicateRequest(Exception):
    """The tenant already has a live sequence under this request id."""


class Scheduler(PriorityRules):
    """Admission, preemption and fair shares over the block pool; `Engine` sets the state."""

    pool: BlockPool
    block_size: int
    max_num_seqs: int
    max_prefill_tokens: int
    waiting: deque[Sequence]
    running: list[Sequence]
    sequences: dict[tuple[str, str], Sequence]  # live ones, by (tenant, id)
    _turns: itertools.count[int]
    _served_turn: dict[str, int]  # tenant -> turn it was last admitted on
    max_running: dict[str, int]
    default_max_running: int | None
    _fair: bool

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
        """Room for one more token; preempts the tenant's newest sequences if it must, its
        batch ones first (a batch sequence never preempts a realtime one: it yields)."""
        if seq.num_computed < len(seq.block_table) * self.block_size:
            return True
        while True:
            block = self.pool.allocate(seq.tenant)
            if block is not None:
                seq.block_table.append(block)
                return True
            victims = [
                s
                for s in self.running
                if s.tenant == seq.tenant and s is not seq and s.rank >= seq.rank
            ]
            if not victims:
                self._preempt(seq)
                return False
            self._preempt(max(victims, key=lambda s: (s.rank, s.arrival)))

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

    # --- scheduling -------------------------------------------------------------------------
    def _schedule(self) -> tuple[list[Sequence], list[Sequence]]:
        self._age_waiting()
        for seq in sorted(self.running, key=lambda s: (s.rank, s.arrival)):
            if seq in self.running:  # an earlier one may have preempted it
                self._ensure_decode_block(seq)
        prefills = self._schedule_fair() if self._fair else self._schedule_in_order()
        # After admissions: a realtime admission may have preempted a running batch sequence.
        return prefills, sorted(self.running, key=lambda s: s.arrival)

    def _schedule_in_order(self) -> list[Sequence]:
        """One tenant's engine: waiting sequences in arrival order, realtime ones first."""
        prefills: list[Sequence] = []
        budget = self.max_prefill_tokens
        blocked: set[str] = set()
        running = self._running_counts()
        for seq in self._by_priority(self.waiting):
            if seq.tenant in blocked:  # keep each tenant's order
                continue
            if prefills and len(seq.tokens) > budget:
                break
            if len(self.running) + len(prefills) >= self.max_num_seqs:
                victim = self._room_victim(seq, running, own_only=False)
                if victim is None:
                    break
                self._preempt_for_priority(victim, running)
            if not self._admit_preempting(seq, running):
                blocked.add(seq.tenant)
                continue
            self.waiting.remove(seq)
            prefills.append(seq)
            running[seq.tenant] = running.get(seq.tenant, 0) + 1
            budget -= len(seq.tokens) - seq.num_computed
        return prefills

    def _schedule_fair(self) -> list[Sequence]:
        """Admissions in a shared pool: realtime heads first, then each tenant below its limit
        in turn, fewest running first (ties: served longest ago), each tenant's own sequences
        in their order (realtime first). A tenant at its limit admits a realtime sequence only
        in place of its own batch one."""
        queues: dict[str, deque[Sequence]] = {}
        for seq in self._by_priority(self.waiting):
            queues.setdefault(seq.tenant, deque()).append(seq)
        running = self._running_counts()

        def may_run(tenant: str) -> bool:
            if running.get(tenant, 0) < self.tenant_limit(tenant):
                return True
            return self._room_victim(queues[tenant][0], running, own_only=True) is not None

        candidates = {t for t in queues if may_run(t)}
        prefills: list[Sequence] = []
        budget = self.max_prefill_tokens
        while candidates:
            tenant = min(
                candidates,
                key=lambda t: (
                    queues[t][0].rank,
                    running.get(t, 0),
                    self._served_turn.get(t, 0),
                    t,
                ),
            )
            seq = queues[tenant][0]
            if prefills and len(seq.tokens) > budget:
                candidates.discard(tenant)  # waits for a step with room; others may fit
                continue
            if running.get(tenant, 0) >= self.tenant_limit(tenant):
                victim = self._room_victim(seq, running, own_only=True)
                if victim is None:
                    candidates.discard(tenant)
                    continue
                self._preempt_for_priority(victim, running)
            if len(self.running) + len(prefills) >= self.max_num_seqs:
                victim = self._room_victim(seq, running, own_only=False)
                if victim is None:
                    if seq.rank:  # batch heads only from here on: none fits
                        break
                    candidates.discard(tenant)
                    continue
                self._preempt_for_priority(victim, running)
            if not self._admit_preempting(seq, running):
                candidates.discard(tenant)  # keep the tenant's order: its next ones wait
                continue
            queues[tenant].popleft()
            prefills.append(seq)
            budget -= len(seq.tokens) - seq.num_computed
            running[tenant] = running.get(tenant, 0) + 1
            self._served_turn[tenant] = next(self._turns)
            if not queues[tenant] or not may_run(tenant):
                candidates.discard(tenant)
        if prefills:
            admitted = set(map(id, prefills))
            self.waiting = deque(s for s in self.waiting if id(s) not in admitted)
        return prefills
