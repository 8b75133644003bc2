"""Block accounting: allocation, release, prefix registration, quotas, fragmentation."""

from __future__ import annotations

import pytest

from serving.engine.kv_cache import BlockPool, chain_hashes


def test_fragmentation_is_one_minus_largest_free_run_over_free() -> None:
    pool = BlockPool(8, 4)
    assert pool.fragmentation() == 0.0  # all free, one run
    blocks = pool.allocate_many("t", 8)
    assert blocks == list(range(8))
    assert pool.fragmentation() == 0.0  # nothing free
    pool.release([0, 2, 4, 5])  # free runs: [0], [2], [4, 5]
    assert pool.fragmentation() == pytest.approx(1 - 2 / 4)
    pool.release([1, 3])  # 0..5 contiguous
    assert pool.fragmentation() == 0.0


def test_cached_blocks_are_reused_and_evicted_lru_within_the_tenant() -> None:
    pool = BlockPool(4, 2, quotas={"a": 2})
    hashes = chain_hashes(b"seed", [1, 2, 3, 4], 2)
    first = pool.allocate_many("a", 2)
    assert first is not None
    for block, block_hash in zip(first, hashes, strict=True):
        pool.register(block, block_hash)
    pool.release(first)
    assert pool.tenant_stats("a").blocks_used == 2  # cached blocks still count
    assert pool.match_prefix("a", hashes, 4) == first
    pool.release(first)
    fresh = pool.allocate("a")  # at quota: recycles its least recently used cached block
    assert fresh == first[0]
    assert pool.tenant_stats("a").evictions == 1
    assert pool.match_prefix("a", hashes, 4) == []  # the chain is broken at block 0


def test_chained_hashes_depend_on_the_seed_and_every_earlier_token() -> None:
    tokens = list(range(32))
    a = chain_hashes(b"tenant-a", tokens, 16)
    assert len(a) == 2
    assert chain_hashes(b"tenant-b", tokens, 16)[0] != a[0]
    changed = [99, *tokens[1:]]
    assert chain_hashes(b"tenant-a", changed, 16)[1] != a[1]  # block 1 differs via block 0
    assert chain_hashes(b"tenant-a", tokens[:31], 16) == a[:1]  # partial blocks not hashed
    assert chain_hashes(b"x", tokens, 16, start=1, previous=a[0]) == a[1:]


def test_other_tenants_cached_blocks_are_never_taken() -> None:
    pool = BlockPool(4, 2)
    a_blocks = pool.allocate_many("a", 3)
    assert a_blocks is not None
    for i, block in enumerate(a_blocks):
        pool.register(block, bytes([i]) * 32)
    pool.release(a_blocks)  # all three cached, owned by a
    assert pool.allocate_many("b", 2) is None  # only one truly free block
    assert pool.allocate("b") == 3
    assert pool.allocate("b") is None
    assert pool.tenant_stats("a").evictions == 0
