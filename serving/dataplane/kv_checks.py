"""A version slot's KV cache lifetime and integrity (seed 000 §4.1): the cache policies its
user_config gives (a deployment's `kv_cache`: prefix caching on/off, max age; in a shared pool
each tenant's own), applied to the engine's block pool without a restart, and the pool's
integrity scan (serving.engine.kv_integrity), run once a second with the SLI window's publish
and published in it (`kv.integrity`), which the portal's health page shows.

vLLM's engine has no block pool of ours: prefix caching there is its `enable_prefix_caching`
init arg (serving.control.compile: changing it rolls the replicas), a max age is refused by the
spec checks, and the report says the scan does not apply.
"""

from __future__ import annotations

import logging
from typing import Any

from serving.engine.kv_cache import CachePolicy
from serving.engine.kv_integrity import IntegrityScanner, scan_engine

logger = logging.getLogger("ray.serve")


def policies_of(config: dict[str, Any]) -> tuple[dict[str, CachePolicy], CachePolicy]:
    """(per-tenant policies, the slot's default) from a version slot's user_config."""
    default = CachePolicy.from_dict(config.get("kv_cache"))
    tenants = {
        str(tenant): CachePolicy.from_dict(entry["kv_cache"])
        for tenant, entry in (config.get("tenants") or {}).items()
        if isinstance(entry, dict) and entry.get("kv_cache")
    }
    return tenants, default


def _pool_engine(engine: Any) -> Any:
    """The built-in Engine behind an AsyncEngine; None for vLLM (no pool of ours)."""
    inner = getattr(engine, "engine", None)
    return inner if inner is not None and hasattr(inner, "pool") else None


class KvChecks:
    """The slot's cache policy and the last integrity reports (kept since the replica started,
    so a violation that a later pass no longer sees still shows)."""

    def __init__(self) -> None:
        self.scanner = IntegrityScanner()
        self.passes = 0
        self.violations_total = 0
        self.last_bad: dict[str, Any] | None = None
        self.forgotten = 0
        self.policies: dict[str, CachePolicy] = {}
        self.default = CachePolicy()
        # The last pass's report: what stats and the SLI window carry between passes.
        self.last: dict[str, Any] = {"applies": False, "reason": "not scanned yet"}

    def policy(self, tenant: str) -> CachePolicy:
        return self.policies.get(tenant, self.default)

    def configure(self, engine: Any, config: dict[str, Any]) -> None:
        tenants, default = policies_of(config)
        self.policies, self.default = tenants, default
        inner = _pool_engine(engine)
        if inner is None:
            return
        with engine._lock:  # between two steps, like every change to the pool
            self.forgotten += inner.pool.set_policies(tenants, default)

    def report(self, engine: Any, core: Any) -> dict[str, Any]:
        """One scan pass (between two steps) and what it found; `core` the VersionCore
        (its tenants' salts, its departing tenants). Run once a second by the publish only:
        a stats call reads `last`, so polling a replica never holds its engine lock."""
        inner = _pool_engine(engine)
        if inner is None:
            reason = "no block pool (vLLM)" if engine else "no engine"
            self.last = {"applies": False, "reason": reason}
            return self.last
        salts = salts_of(core)
        known = set(core._departed) | set(core._probe_identities)
        try:
            with engine._lock:
                result = scan_engine(inner, self.scanner, salts=salts, known=known).as_dict()
        except Exception as exc:  # a scan that breaks is itself a finding, never an outage
            logger.exception("KV integrity scan failed")
            sample = {"kind": "scan", "block": None, "tenant": None, "detail": str(exc)[:200]}
            result = {"ok": False, "violations": 1, "counts": {"scan": 1}, "samples": [sample]}
        self.passes += 1
        self.violations_total += int(result.get("violations", 0))
        if not result.get("ok"):
            self.last_bad = result
        self.last = {
            "applies": True,
            **result,
            "passes": self.passes,
            "violations_total": self.violations_total,
            "last_bad": self.last_bad,
        }
        return self.last


def salts_of(core: Any) -> dict[str, bytes]:
    """The salt of every tenant the slot serves now, a drill's probe identity included."""
    salts = {tenant: entry["salt"] for tenant, entry in core.tenants.items()}
    probe = core.chaos.active().kv_pollution_probe
    if probe is not None:
        derived = core.chaos.probe_tenant(probe.identity, salts)
        if derived is not None:
            salts[probe.identity] = derived[0]
    return salts
