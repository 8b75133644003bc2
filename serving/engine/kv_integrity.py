"""The KV block pool's invariants, checked (seed 000 §4.1, "KV-Sanity"): a cheap, bounded scan
the replica runs once a second between two engine steps.

* refcount: every block's reference count is the number of live sequences holding it;
* owner: a held or cached block has an owner, a known tenant; a free block has none;
* salt: a registered block's hash is sha256(parent || its tokens), its chain rooted at
  sha256(owner's salt || model fingerprint), its parent (when still registered) the same
  owner's, and the index finds it under that hash: no block made under one tenant's salt is
  reachable by another tenant's lookup; two tenants never share a salt;
* free_list: free, cached and held blocks are disjoint and together every block; a free block
  has no hash, a cached one has one; each tenant's `blocks_used` counts what it owns.

The per-block checks (hashing included) cover at most `budget` blocks per pass, a cursor going
round the pool; the set checks are set operations and a loop over the held blocks (which the
refcounts need anyway). The pass runs under the engine's lock: it costs a step's worth of time
at most (figures in the module's tests' report: milliseconds for thousands of blocks).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from serving.engine.kv_cache import BlockPool

KINDS = ("refcount", "owner", "salt", "free_list")
SAMPLES = 8  # violations kept in a report, for the page; all are counted


@dataclass
class Violation:
    kind: str
    block: int | None
    tenant: str | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "block": self.block,
            "tenant": self.tenant,
            "detail": self.detail,
        }


@dataclass
class ScanReport:
    checked: int = 0  # blocks whose per-block invariants were checked this pass
    blocks: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    samples: list[Violation] = field(default_factory=list)
    ms: float = 0.0
    at: float = 0.0

    def add(self, kind: str, block: int | None, tenant: str | None, detail: str) -> None:
        self.counts[kind] += 1
        if len(self.samples) < SAMPLES:
            self.samples.append(Violation(kind, block, tenant, detail))

    @property
    def violations(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.violations == 0,
            "violations": self.violations,
            "counts": dict(self.counts),
            "samples": [v.as_dict() for v in self.samples],
            "checked": self.checked,
            "blocks": self.blocks,
            "ms": round(self.ms, 3),
            "at": round(self.at, 3),
        }


def chain_root(salt: bytes, fingerprint: str) -> bytes:
    """The first hash of a tenant's chains on a model (serving.engine.engine.add_request)."""
    return hashlib.sha256(salt + fingerprint.encode()).digest()


def holders_of(sequences: Iterable[Any]) -> dict[int, int]:
    """block id -> how many of `sequences` (each once) hold it in their block table."""
    counts: dict[int, int] = {}
    seen: set[int] = set()
    for seq in sequences:
        if id(seq) in seen:
            continue
        seen.add(id(seq))
        for block_id in seq.block_table:
            counts[block_id] = counts.get(block_id, 0) + 1
    return counts


class IntegrityScanner:
    """Scans one pool pass by pass; `cursor` remembers where the per-block checks stopped."""

    def __init__(self, budget: int = 1024) -> None:
        self.budget = max(1, budget)
        self.cursor = 0

    def scan(
        self,
        pool: BlockPool,
        *,
        holders: Mapping[int, int],
        salts: Mapping[str, bytes],
        known: Iterable[str] = (),
    ) -> ScanReport:
        """One pass. `holders`: block -> live sequences holding it; `salts`: the salt of every
        tenant the replica serves now; `known`: tenants leaving (their blocks still held or
        being given back) whose salt is no longer at hand."""
        started = time.perf_counter()
        report = ScanReport(blocks=pool.num_blocks, at=time.time())
        known_tenants = set(salts) | set(known)
        cached = self._check_sets(pool, holders, report)
        self._check_salts_distinct(salts, report)
        roots: dict[tuple[str, str], bytes] = {}
        count = min(self.budget, pool.num_blocks)
        for step in range(count):
            block = pool._blocks[(self.cursor + step) % pool.num_blocks]
            report.checked += 1
            held = holders.get(block.id, 0)
            if block.ref != held:
                report.add(
                    "refcount", block.id, block.tenant, f"ref {block.ref}, {held} sequences hold it"
                )
            self._check_block(pool, block, cached, report)
            self._check_owner(pool, block, known_tenants, report)
            if block.hash is not None:
                self._check_salt(pool, block, salts, roots, report)
        self.cursor = (self.cursor + count) % pool.num_blocks
        report.ms = (time.perf_counter() - started) * 1000
        return report

    @staticmethod
    def _check_sets(pool: BlockPool, holders: Mapping[int, int], report: ScanReport) -> set[int]:
        """Disjoint and complete free/cached/held sets, each tenant's `blocks_used`, the index's
        size: set operations and loops over the held blocks only (their refcounts need those
        anyway); the cached set, for the per-block checks."""
        free = pool._free
        cached: set[int] = set().union(*pool._cached.values())
        held = {b for b, n in holders.items() if n > 0}
        for name, a, b in (("free", free, cached), ("free", free, held), ("cached", cached, held)):
            other = "cached" if b is cached else "held"
            for block_id in sorted(a & b)[:SAMPLES]:
                report.add("free_list", block_id, None, f"both {name} and {other}")
        others: set[int] = held - cached
        if len(free | cached | held) < pool.num_blocks:
            missing = set(range(pool.num_blocks)) - free - cached - held
            for block_id in sorted(missing)[:SAMPLES]:
                report.add("free_list", block_id, None, "neither free, cached nor held")
            others |= missing
        used = {tenant: len(bucket) for tenant, bucket in pool._cached.items()}
        registered = len(cached)
        for block_id in others - free:
            block = pool._blocks[block_id]
            used[block.tenant or ""] = used.get(block.tenant or "", 0) + 1
            registered += block.hash is not None
        for tenant, stats in pool.stats.items():
            if stats.blocks_used != used.get(tenant, 0):
                report.add(
                    "free_list",
                    None,
                    tenant,
                    f"blocks_used {stats.blocks_used}, owns {used.get(tenant, 0)}",
                )
        if registered != len(pool._index):  # each registered block is checked as findable
            detail = f"{len(pool._index)} hashes indexed, {registered} blocks registered"
            report.add("salt", None, None, detail)
        return cached

    @staticmethod
    def _check_block(pool: BlockPool, block: Any, cached: set[int], report: ScanReport) -> None:
        if block.id in pool._free:
            if block.ref or block.hash is not None or block.tenant is not None:
                report.add("free_list", block.id, block.tenant, "free but in use")
        elif block.id in cached:
            if block.ref or block.hash is None:
                report.add("free_list", block.id, block.tenant, "cached without a hash or in use")
            if block.id not in pool._cached.get(block.tenant or "", {}):
                report.add("owner", block.id, block.tenant, "cached under another tenant")

    @staticmethod
    def _check_salts_distinct(salts: Mapping[str, bytes], report: ScanReport) -> None:
        owners: dict[bytes, str] = {}
        for tenant, salt in sorted(salts.items()):
            if salt in owners:
                report.add("salt", None, tenant, f"shares its salt with {owners[salt]!r}")
            owners[salt] = tenant

    @staticmethod
    def _check_owner(pool: BlockPool, block: Any, known: set[str], report: ScanReport) -> None:
        if block.id in pool._free:
            return  # checked with the sets
        if block.tenant is None:
            report.add("owner", block.id, None, "held or cached without an owner")
        elif block.tenant not in known:
            report.add("owner", block.id, block.tenant, "owner is not a tenant of this replica")

    @staticmethod
    def _check_salt(
        pool: BlockPool,
        block: Any,
        salts: Mapping[str, bytes],
        roots: dict[tuple[str, str], bytes],
        report: ScanReport,
    ) -> None:
        tenant = block.tenant
        if pool._index.get(block.hash) != block.id:
            report.add("salt", block.id, tenant, "registered but not findable by its hash")
        if block.parent is None or block.tokens is None or block.root is None:
            report.add("salt", block.id, tenant, "registered without its chain")
            return
        if hashlib.sha256(block.parent + block.tokens).digest() != block.hash:
            report.add("salt", block.id, tenant, "hash is not sha256(parent || tokens)")
        if tenant in salts:
            key = (tenant, block.fingerprint)
            if key not in roots:
                roots[key] = chain_root(salts[tenant], block.fingerprint)
            if block.root != roots[key]:
                report.add("salt", block.id, tenant, "chain not rooted at its owner's salt")
        if block.parent != block.root:
            parent_id = pool._index.get(block.parent)
            parent = pool._blocks[parent_id] if parent_id is not None else None
            if parent is not None and (parent.tenant != tenant or parent.root != block.root):
                report.add("salt", block.id, tenant, f"parent block {parent_id} is another chain")


def scan_engine(
    engine: Any,
    scanner: IntegrityScanner,
    *,
    salts: Mapping[str, bytes],
    known: Iterable[str] = (),
) -> ScanReport:
    """One pass over an Engine's pool (call it between two steps: under AsyncEngine's lock),
    after forgetting the blocks past their owners' max age."""
    engine.pool.expire()
    sequences = [*engine.sequences.values(), *engine.running, *engine.waiting]
    return scanner.scan(engine.pool, holders=holders_of(sequences), salts=salts, known=known)
