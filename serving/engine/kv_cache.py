"""Block accounting for the paged KV cache: allocation, prefix cache, tenant quotas, metrics.

Blocks hold `block_size` tokens. A full block is registered under a chained hash
h_i = sha256(h_{i-1} || tokens of block i) whose chain starts at the request's cache seed
(HMAC of a server secret and the tenant id, mixed with the model's fingerprint), so equal
prompts of two tenants never share or even find each other's blocks.

In a shared pool every tenant has a block quota. A tenant at its quota recycles its own least
recently used cached blocks, never another tenant's; when it has none left, the scheduler
preempts one of its own sequences.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
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

    def as_dict(self) -> dict[str, int]:
        return {
            "blocks_used": self.blocks_used,
            "prefix_queries": self.prefix_queries,
            "prefix_hits": self.prefix_hits,
            "evictions": self.evictions,
            "preemptions": self.preemptions,
        }


@dataclass
class _Block:
    id: int
    ref: int = 0
    hash: bytes | None = None
    tenant: str | None = None


@dataclass
class BlockPool:
    num_blocks: int
    block_size: int = 16
    # tenant -> max blocks; tenants not listed get `default_quota` (None: the whole pool)
    quotas: dict[str, int] = field(default_factory=dict)
    default_quota: int | None = None

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
        block = self._blocks[block_id]
        if block.hash is not None:
            del self._index[block.hash]
        block.hash = None
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
        block.ref, block.tenant, block.hash = 1, tenant, None
        return block_id

    def allocate_many(self, tenant: str, count: int) -> list[int] | None:
        if count > self.available_for(tenant):
            return None
        blocks = [self.allocate(tenant) for _ in range(count)]
        return [b for b in blocks if b is not None]  # all are: available_for() said so

    def release(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            block = self._blocks[block_id]
            block.ref -= 1
            if block.ref > 0:
                continue
            tenant = block.tenant or ""
            if block.hash is not None:
                self._cached.setdefault(tenant, OrderedDict())[block_id] = None
            else:
                block.tenant = None
                self._free.add(block_id)
                self.tenant_stats(tenant).blocks_used -= 1

    # --- prefix cache ---------------------------------------------------------------------
    def match_prefix(self, tenant: str, hashes: list[bytes], queried_tokens: int) -> list[int]:
        """Blocks already holding the first blocks of a prompt (their refcounts taken)."""
        stats = self.tenant_stats(tenant)
        stats.prefix_queries += queried_tokens
        found: list[int] = []
        for block_hash in hashes:
            block_id = self._index.get(block_hash)
            if block_id is None:
                break
            block = self._blocks[block_id]
            if block.tenant != tenant:  # cannot happen with salted seeds; refuse regardless
                break
            if block.ref == 0:
                del self._cached[tenant][block_id]
            block.ref += 1
            found.append(block_id)
        stats.prefix_hits += len(found) * self.block_size
        return found

    def register(self, block_id: int, block_hash: bytes) -> None:
        """Make a full block findable by its chained hash (first writer wins)."""
        block = self._blocks[block_id]
        if block.hash is not None or block_hash in self._index:
            return
        block.hash = block_hash
        self._index[block_hash] = block_id

    def snapshot(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "free_blocks": self.free_count(),
            "cached_blocks": len(self._index),
            "fragmentation": round(self.fragmentation(), 4),
            "tenants": {t: {**s.as_dict(), "quota": self.quota(t)} for t, s in self.stats.items()},
        }
