"""KV cache lifetime (prefix caching on/off, max age) and the pool's integrity scan: a clean
engine scans clean; each kind of corruption (refcounts, owners, salts, free list) is caught."""

from __future__ import annotations

from typing import Any

import pytest

from serving.engine.engine import Engine, SamplingParams, tenant_cache_salt
from serving.engine.kv_cache import BlockPool, CachePolicy
from serving.engine.kv_integrity import IntegrityScanner, scan_engine
from serving.engine.model import LlamaModel

SECRET = b"server-secret"
PROMPT = list(range(1, 40))  # two full blocks of 16 and a partial one


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def salts(*tenants: str) -> dict[str, bytes]:
    return {t: tenant_cache_salt(SECRET, t) for t in tenants}


def engine_with_cache(model: LlamaModel) -> Engine:
    """Two tenants' prompts run to the end (their blocks cached), one still running."""
    engine = Engine(model, num_blocks=64, cache_secret=SECRET)
    engine.generate([PROMPT], SamplingParams(max_tokens=3), tenant="a")
    engine.generate([PROMPT], SamplingParams(max_tokens=3), tenant="b")
    engine.add_request(PROMPT + [7, 8], SamplingParams(max_tokens=8), tenant="a")
    engine.step()  # admitted: holds its prefix hits and fresh blocks
    return engine


def scan(engine: Engine, *tenants: str) -> dict[str, Any]:
    return scan_engine(engine, IntegrityScanner(), salts=salts(*tenants)).as_dict()


def test_a_clean_pool_scans_clean(tiny_model: LlamaModel) -> None:
    engine = engine_with_cache(tiny_model)
    assert engine.pool._cached, "the fixture caches blocks"
    assert any(b.ref for b in engine.pool._blocks), "and holds some"
    report = scan(engine, "a", "b")
    assert report["ok"], report["samples"]
    assert report["checked"] == 64


def test_a_refcount_off_by_one_is_caught(tiny_model: LlamaModel) -> None:
    engine = engine_with_cache(tiny_model)
    held = next(b for b in engine.pool._blocks if b.ref)
    held.ref += 1  # a leak: nobody will ever release this reference
    report = scan(engine, "a", "b")
    assert not report["ok"]
    assert report["counts"]["refcount"] == 1
    assert report["samples"][0]["block"] == held.id


def test_an_unknown_or_missing_owner_is_caught(tiny_model: LlamaModel) -> None:
    engine = engine_with_cache(tiny_model)
    cached_id = next(iter(engine.pool._cached["b"]))
    engine.pool._blocks[cached_id].tenant = "mallory"
    report = scan(engine, "a", "b")
    assert report["counts"]["owner"] >= 2  # not cached under its owner, not a known tenant
    assert "not a tenant of this replica" in {s["detail"] for s in report["samples"]} or any(
        "not a tenant" in s["detail"] for s in report["samples"]
    )
    held = next(b for b in engine.pool._blocks if b.ref)
    held.tenant = None
    assert any(s["detail"].endswith("without an owner") for s in scan(engine, "a")["samples"])


def test_a_block_moved_to_another_tenants_salt_is_caught(tiny_model: LlamaModel) -> None:
    """Tenant b's cached block handed to tenant a (owner and bucket moved consistently): its
    chain is rooted at b's salt, so a's lookups could reach b's tokens. Caught as salt."""
    engine = engine_with_cache(tiny_model)
    pool = engine.pool
    block_id = next(iter(pool._cached["b"]))
    del pool._cached["b"][block_id]
    pool._cached["a"][block_id] = None
    pool._blocks[block_id].tenant = "a"
    pool.stats["a"].blocks_used += 1
    pool.stats["b"].blocks_used -= 1
    report = scan(engine, "a", "b")
    assert report["counts"]["salt"] >= 1
    details = {s["detail"] for s in report["samples"] if s["kind"] == "salt"}
    assert "chain not rooted at its owner's salt" in details


def test_a_tampered_hash_and_shared_salts_are_caught(tiny_model: LlamaModel) -> None:
    engine = engine_with_cache(tiny_model)
    pool = engine.pool
    block = next(b for b in pool._blocks if b.tenant == "a" and b.hash is not None)
    block.tokens = bytes(len(block.tokens or b""))  # other tokens under the same hash
    report = scan(engine, "a", "b")
    assert "hash is not sha256(parent || tokens)" in {s["detail"] for s in report["samples"]}
    shared = scan_engine(
        engine_with_cache(tiny_model),
        IntegrityScanner(),
        salts={"a": b"same", "b": b"same"},
    ).as_dict()
    assert any("shares its salt" in s["detail"] for s in shared["samples"])


def test_a_corrupt_free_list_is_caught(tiny_model: LlamaModel) -> None:
    engine = engine_with_cache(tiny_model)
    pool = engine.pool
    cached_id = next(iter(pool._cached["b"]))
    pool._free.add(cached_id)  # free and cached at once: handed out twice
    report = scan(engine, "a", "b")
    assert report["counts"]["free_list"] >= 1
    pool._free.discard(cached_id)
    lost = min(pool._free)
    pool._free.discard(lost)  # a block nobody has: lost for good
    report = scan(engine, "a", "b")
    assert {"block": lost, "detail": "neither free, cached nor held"} in [
        {"block": s["block"], "detail": s["detail"]} for s in report["samples"]
    ]


def test_the_scan_is_bounded_and_goes_round_the_pool(tiny_model: LlamaModel) -> None:
    engine = engine_with_cache(tiny_model)
    scanner = IntegrityScanner(budget=24)
    held = next(b for b in engine.pool._blocks if b.ref)
    held.ref += 5
    found = []
    for _ in range(3):  # 3 x 24 >= 64: every block once
        report = scan_engine(engine, scanner, salts=salts("a", "b"))
        assert report.checked == 24
        found.append(report.counts["refcount"])
    assert sum(found) >= 1


def test_prefix_caching_off_never_matches_across_requests(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, num_blocks=64, cache_secret=SECRET)
    engine.pool.set_policies({}, CachePolicy(prefix_caching=False))
    first = engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="a")[0]
    second = engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="a")[0]
    assert first.cached_tokens == second.cached_tokens == 0
    assert not engine.pool._index and engine.pool.free_count() == 64
    assert first.output_ids == second.output_ids
    assert scan(engine, "a")["ok"]


def test_turning_prefix_caching_off_forgets_what_is_cached(tiny_model: LlamaModel) -> None:
    engine = Engine(tiny_model, num_blocks=64, cache_secret=SECRET)
    engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="a")
    engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="b")
    assert engine.pool._cached["a"]
    forgotten = engine.pool.set_policies({"a": CachePolicy(prefix_caching=False)}, CachePolicy())
    assert forgotten == 2 and not engine.pool._cached.get("a")
    assert engine.pool.stats["a"].blocks_used == 0
    again = engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="b")[0]
    assert again.cached_tokens == 32  # b's policy is unchanged
    assert scan(engine, "a", "b")["ok"]


def test_blocks_older_than_max_age_are_forgotten(tiny_model: LlamaModel) -> None:
    clock = Clock()
    engine = Engine(tiny_model, num_blocks=64, cache_secret=SECRET)
    engine.pool.clock = clock
    engine.pool.set_policies({}, CachePolicy(max_age_s=30))
    engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="a")
    clock.now += 29
    assert engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="a")[0].cached_tokens
    clock.now += 2  # 31 s after the blocks were filled: past their lifetime, hits or not
    assert engine.pool.expire() == 2
    assert engine.pool.free_count() == 64 and not engine.pool._index
    assert engine.pool.stats["a"].expired == 2
    late = engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="a")[0]
    assert late.cached_tokens == 0
    clock.now += 31  # found at lookup, before any expire(): not matched, freed
    assert engine.generate([PROMPT], SamplingParams(max_tokens=2), tenant="a")[0].cached_tokens == 0
    assert scan(engine, "a")["ok"]


def test_a_held_block_past_max_age_is_freed_when_released() -> None:
    clock = Clock()
    pool = BlockPool(4, 2, clock=clock)
    pool.set_policies({}, CachePolicy(max_age_s=5))
    (block,) = pool.allocate_many("a", 1) or []
    pool.register(block, b"h" * 32)
    clock.now += 10
    assert pool.expire() == 1  # not findable any more, still held
    assert pool._blocks[block].ref == 1 and not pool._index
    pool.release([block])
    assert block in pool._free and pool.stats["a"].blocks_used == 0


@pytest.mark.parametrize("raw", [None, {}, {"prefix_caching": True}])
def test_the_default_policy_caches_without_age(raw: dict[str, Any] | None) -> None:
    assert CachePolicy.from_dict(raw) == CachePolicy(True, None)
