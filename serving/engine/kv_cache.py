"""Block accounting for the paged KV cache: allocation, prefix cache, tenant quotas, metrics.

Blocks hold `block_size` tokens. A full block is registered under a chained hash
h_i = sha256(h_{i-1} || tokens of block i) whose chain starts at the request's cache seed
(HMAC of a server secret and the tenant id, mixed with the model's fingerprint), so equal
prompts of two tenants never share or even find each other's blocks.

In a shared pool every tenant has a block quota. A tenant at its quota recycles its own least
recently used cached blocks, never another tenant's; when it has none left, the scheduler
preempts one of its own sequences.

Each tenant's blocks follow a `CachePolicy` (a deployment's `kv_cache` setting): with prefix
caching off none of its blocks is registered, so no block is ever matched across requests; with
a `max_age_s` a registered block lives at most that long from when it was filled: past it, it is
never matched again and goes back to the free list as soon as nobody holds it (`expire()`).
A registered block keeps how its hash was made (parent hash, tokens, chain root, fingerprint),
so the integrity scan (serving.engine.kv_integrity) can check it against its owner's salt.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def chain_hashes(
    seed: bytes,
    token_ids: list[int],
    block_size: int,
    start: int = 0,
    previous: bytes | None = None,
) -> list[bytes]:
    """Hashes of the full blocks of `token_ids` from block index `start` on."""
    hashes: list[bytes] = []
    prev = previous if previous is not None else seed
    full = len(token_ids) // block_size
    for index in range(start, full):
        chunk = np.asarray(token_ids[index * block_size : (index + 1) * block_size], np.int64)
        prev = hashlib.sha256(prev + chunk.tobytes()).digest()
        hashes.append(prev)
    return hashes


@dataclass
class TenantStats:
    blocks_used: int = 0  # blocks the tenant holds: in use or cached
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of those, tokens found
    evictions: int = 0  # cached blocks recycled
    preemptions: int = 0  # sequences preempted for lack of blocks
    expired: int = 0  # cached blocks forgotten for their age or a policy turned off

    def as_dict(self) -> dict[str, int]:
        return {
            "blocks_used": self.blocks_used,
            "prefix_queries": self.prefix_queries,
            "prefix_hits": self.prefix_hits,
            "evictions": self.evictions,
            "preemptions": self.preemptions,
            "expired": self.expired,
        }


@dataclass(frozen=True)
class CachePolicy:
    """How long a tenant's KV blocks may be found again: `prefix_caching` off, never (each
    request computes its own); `max_age_s`, at most that long after the block was filled."""

    prefix_caching: bool = True
    max_age_s: float | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, object] | None) -> CachePolicy:
        raw = raw or {}
        age = raw.get("max_age_s")
        return cls(
            prefix_caching=bool(raw.get("prefix_caching", True)),
            max_age_s=None if age is None else max(0.0, float(age)),  # type: ignore[arg-type]
        )


@dataclass
class _Block:
    id: int
    ref: int = 0
    hash: bytes | None = None
    tenant: str | None = None
    # How `hash` was made (a registered block): sha256(parent || tokens), its chain starting
    # at `root` = sha256(owner's salt || fingerprint); when it was registered.
    parent: bytes | None = None
    tokens: bytes | None = None
    root: bytes | None = None
    fingerprint: str = ""
    registered_at: float = 0.0

    def forget_hash(self) -> None:
        self.hash = self.parent = self.tokens = self.root = None
        self.fingerprint, self.registered_at = "", 0.0


@dataclass
class BlockPool:
    num_blocks: int
    block_size: int = 16
    # tenant -> max blocks; tenants not listed get `default_quota` (None: the whole pool)
    quotas: dict[str, int] = field(default_factory=dict)
    default_quota: int | None = None
    # tenant -> its cache policy; tenants not listed get `default_policy`
    policies: dict[str, CachePolicy] = field(default_factory=dict)
    default_policy: CachePolicy = field(default_factory=CachePolicy)
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self._blocks = [_Block(i) for i in range(self.num_blocks)]
        self._free: set[int] = set(range(self.num_blocks))  # ref 0, no hash
        self._cached: dict[str, OrderedDict[int, None]] = {}  # ref 0 with hash, LRU first
        self._index: dict[bytes, int] = {}
        self.stats: dict[str, TenantStats] = {}

    # --- accounting -----------------------------------------------------------------------
    def quota(self, tenant: str) -> int:
        value = self.quotas.get(tenant, self.default_quota)
        return self.num_blocks if value is None else min(value, self.num_blocks)

    def tenant_stats(self, tenant: str) -> TenantStats:
        stats = self.stats.get(tenant)
        if stats is None:
            stats = self.stats[tenant] = TenantStats()
        return stats

    def free_count(self) -> int:
        """Blocks that can be handed out now: free plus cached-but-unused."""
        return len(self._free) + sum(len(c) for c in self._cached.values())

    def available_for(self, tenant: str) -> int:
        """Blocks `tenant` could obtain now without preempting anything."""
        own_cached = len(self._cached.get(tenant, ()))
        headroom = max(0, self.quota(tenant) - self.tenant_stats(tenant).blocks_used)
        return own_cached + min(headroom, len(self._free))

    def fragmentation(self) -> float:
        """1 - largest run of adjacent free blocks / all free blocks (0 when none is free)."""
        free = sorted(self._free | {b for c in self._cached.values() for b in c})
        if not free:
            return 0.0
        longest = run = 1
        for a, b in zip(free, free[1:], strict=False):
            run = run + 1 if b == a + 1 else 1
            longest = max(longest, run)
        return 1.0 - longest / len(free)

    # --- allocation -----------------------------------------------------------------------
    def _evict_own(self, tenant: str) -> int | None:
        cached = self._cached.get(tenant)
        if not cached:
            return None
        block_id, _ = cached.popitem(last=False)
        self._unregister(self._blocks[block_id])
        self.tenant_stats(tenant).evictions += 1
        return block_id  # still owned by `tenant`: blocks_used unchanged

    def allocate(self, tenant: str) -> int | None:
        """One block for `tenant`, or None when it must wait or preempt."""
        stats = self.tenant_stats(tenant)
        block_id: int | None = None
        if stats.blocks_used < self.quota(tenant) and self._free:
            block_id = min(self._free)  # lowest id first keeps the free space contiguous
            self._free.remove(block_id)
            stats.blocks_used += 1
        else:
            block_id = self._evict_own(tenant)
        if block_id is None:
            return None
        block = self._blocks[block_id]
        block.ref, block.tenant = 1, tenant
        block.forget_hash()
        return block_id

    def allocate_many(self, tenant: str, count: int) -> list[int] | None:
        if count > self.available_for(tenant):
            return None
        blocks = [self.allocate(tenant) for _ in range(count)]
        return [b for b in blocks if b is not None]  # all are: available_for() said so

    def release(self, block_ids: list[int]) -> None:
        now = self.clock()
        for block_id in block_ids:
            block = self._blocks[block_id]
            block.ref -= 1
            if block.ref > 0:
                continue
            tenant = block.tenant or ""
            if block.hash is not None and self._expired(block, now):
                self._unregister(block)
                self.tenant_stats(tenant).expired += 1
            if block.hash is not None:
                self._cached.setdefault(tenant, OrderedDict())[block_id] = None
            else:
                self._free_block(block)

    def _free_block(self, block: _Block) -> None:
        self.tenant_stats(block.tenant or "").blocks_used -= 1
        block.tenant = None
        self._free.add(block.id)

    def _unregister(self, block: _Block) -> None:
        """Make a block unfindable (it stays with whoever holds it)."""
        if block.hash is not None and self._index.get(block.hash) == block.id:
            del self._index[block.hash]
        block.forget_hash()

    # --- lifetime -------------------------------------------------------------------------
    def policy(self, tenant: str) -> CachePolicy:
        return self.policies.get(tenant, self.default_policy)

    def _expired(self, block: _Block, now: float) -> bool:
        age = self.policy(block.tenant or "").max_age_s
        return age is not None and now - block.registered_at > age

    def set_policies(self, policies: dict[str, CachePolicy], default: CachePolicy) -> int:
        """New cache policies, applied at once: a tenant whose prefix caching is now off, or
        whose blocks are now too old, loses them (`expire()`); how many were forgotten."""
        self.policies, self.default_policy = dict(policies), default
        return self.expire()

    def expire(self, now: float | None = None) -> int:
        """Forget every registered block past its owner's max age or whose owner's prefix
        caching is off: an unused one goes back to the free list, a used one is no longer
        findable (and is freed when released). How many were forgotten."""
        now = self.clock() if now is None else now
        registered = [self._blocks[block_id] for block_id in self._index.values()]
        stale = [
            block
            for block in registered
            if not self.policy(block.tenant or "").prefix_caching or self._expired(block, now)
        ]
        for block in stale:
            tenant = block.tenant or ""
            self._unregister(block)
            self.tenant_stats(tenant).expired += 1
            if block.ref == 0:
                self._cached.get(tenant, OrderedDict()).pop(block.id, None)
                self._free_block(block)
        return len(stale)

    # --- prefix cache ---------------------------------------------------------------------
    def match_prefix(self, tenant: str, hashes: list[bytes], queried_tokens: int) -> list[int]:
        """Blocks already holding the first blocks of a prompt (their refcounts taken)."""
        stats = self.tenant_stats(tenant)
        stats.prefix_queries += queried_tokens
        found: list[int] = []
        if not self.policy(tenant).prefix_caching:
            return found  # nothing of this tenant is ever found again
        now = self.clock()
        for block_hash in hashes:
            block_id = self._index.get(block_hash)
            if block_id is None:
                break
            block = self._blocks[block_id]
            if block.tenant != tenant:  # cannot happen with salted seeds; refuse regardless
                break
            if self._expired(block, now):  # too old to be found: gone now, or once released
                self._unregister(block)
                stats.expired += 1
                if block.ref == 0:
                    del self._cached[tenant][block_id]
                    self._free_block(block)
                break
            if block.ref == 0:
                del self._cached[tenant][block_id]
            block.ref += 1
            found.append(block_id)
        stats.prefix_hits += len(found) * self.block_size
        return found

    def register(
        self,
        block_id: int,
        block_hash: bytes,
        *,
        parent: bytes | None = None,
        tokens: bytes | None = None,
        root: bytes | None = None,
        fingerprint: str = "",
    ) -> None:
        """Make a full block findable by its chained hash (first writer wins), unless its
        owner's prefix caching is off. `parent`, `tokens`, `root` and `fingerprint` say how
        the hash was made (`register_chain` gives them; the integrity scan checks them)."""
        block = self._blocks[block_id]
        if block.hash is not None or block_hash in self._index:
            return
        if not self.policy(block.tenant or "").prefix_caching:
            return
        block.hash, block.parent, block.tokens = block_hash, parent, tokens
        block.root, block.fingerprint = root, fingerprint
        block.registered_at = self.clock()
        self._index[block_hash] = block_id

    def register_chain(
        self,
        block_table: list[int],
        seed: bytes,
        fingerprint: str,
        token_ids: list[int],
        *,
        start: int = 0,
        previous: bytes | None = None,
    ) -> list[bytes]:
        """Register the full blocks of `token_ids` from block `start` on (the sequence's
        `block_table`, its chain rooted at `seed` made with the model `fingerprint`); their
        hashes, the last one continuing the chain."""
        hashes = chain_hashes(seed, token_ids, self.block_size, start=start, previous=previous)
        parent = previous if previous is not None else seed
        for index, block_hash in enumerate(hashes, start=start):
            chunk = token_ids[index * self.block_size : (index + 1) * self.block_size]
            self.register(
                block_table[index],
                block_hash,
                parent=parent,
                tokens=np.asarray(chunk, np.int64).tobytes(),
                root=seed,
                fingerprint=fingerprint,
            )
            parent = block_hash
        return hashes

    def snapshot(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "free_blocks": self.free_count(),
            "cached_blocks": len(self._index),
            "fragmentation": round(self.fragmentation(), 4),
            "prefix_caching": self.default_policy.prefix_caching,
            "max_age_s": self.default_policy.max_age_s,
            "tenants": {t: {**s.as_dict(), "quota": self.quota(t)} for t, s in self.stats.items()},
        }
