"""The parsed fault plan: FaultPlan, one group's faults as a replica applies them, with one
frozen dataclass per fault kind, and share_point (which replicas a drill's share picks)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

from serving.dataplane.faults.spec import MAX_DELAY_MS, validate_group


@dataclass(frozen=True)
class LatencySpike:
    delay_ms: float
    jitter_ms: float = 0.0
    distribution: str = "fixed"
    share: float = 1.0

    def sample_ms(self, rng: random.Random) -> float:
        if self.distribution == "uniform":
            return rng.uniform(
                max(0.0, self.delay_ms - self.jitter_ms), self.delay_ms + self.jitter_ms
            )
        if self.distribution == "exponential":
            if self.delay_ms <= 0:
                return 0.0
            return min(rng.expovariate(1.0 / self.delay_ms), float(MAX_DELAY_MS))
        return self.delay_ms


@dataclass(frozen=True)
class ErrorBurst:
    share: float
    status: int = 503


@dataclass(frozen=True)
class MemoryLeakSpec:
    mb_per_s: float
    max_mb: float = 4096.0
    replica_share: float = 1.0  # leaking replicas: hash of (drill, replica) below the share


@dataclass(frozen=True)
class ReplicaCrash:
    replica_share: float = 1.0
    after_s: float = 0.0


@dataclass(frozen=True)
class ReplicaHang:
    replica_share: float = 1.0


@dataclass(frozen=True)
class KvPollutionProbe:
    identity: str
    key_hash: str
    quota_blocks: int = 16


@dataclass(frozen=True)
class WeightSwapJitter:
    reload: int


@dataclass(frozen=True)
class FaultPlan:
    """One group's faults as the replica applies them."""

    drill: str = ""
    issued_at: float | None = None
    expires_at: float | None = None
    error_rate: float = 0.0
    latency_ms: float = 0.0
    error_burst: ErrorBurst | None = None
    latency_spike: LatencySpike | None = None
    gpu_memory_leak: MemoryLeakSpec | None = None
    replica_crash: ReplicaCrash | None = None
    replica_hang: ReplicaHang | None = None
    kv_pollution_probe: KvPollutionProbe | None = None
    weight_swap_jitter: WeightSwapJitter | None = None

    @classmethod
    def parse(cls, raw: Any) -> FaultPlan:
        clean = validate_group(raw, "faults")

        def part(kind: type[Any], key: str) -> Any:
            return kind(**clean[key]) if key in clean else None

        return cls(
            drill=clean.get("drill", ""),
            issued_at=clean.get("issued_at"),
            expires_at=clean.get("expires_at"),
            error_rate=clean.get("error_rate", 0.0),
            latency_ms=float(clean.get("latency_ms", 0)),
            error_burst=part(ErrorBurst, "error_burst"),
            latency_spike=part(LatencySpike, "latency_spike"),
            gpu_memory_leak=part(MemoryLeakSpec, "gpu_memory_leak"),
            replica_crash=part(ReplicaCrash, "replica_crash"),
            replica_hang=part(ReplicaHang, "replica_hang"),
            kv_pollution_probe=part(KvPollutionProbe, "kv_pollution_probe"),
            weight_swap_jitter=part(WeightSwapJitter, "weight_swap_jitter"),
        )

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    @property
    def kinds(self) -> list[str]:
        """The faults this plan switches on (not counting zero rates)."""
        on = {
            "error_rate": self.error_rate > 0,
            "latency_ms": self.latency_ms > 0,
            "error_burst": self.error_burst is not None,
            "latency_spike": self.latency_spike is not None,
            "gpu_memory_leak": self.gpu_memory_leak is not None,
            "replica_crash": self.replica_crash is not None,
            "replica_hang": self.replica_hang is not None,
            "kv_pollution_probe": self.kv_pollution_probe is not None,
            "weight_swap_jitter": self.weight_swap_jitter is not None,
        }
        return [kind for kind, active in on.items() if active]


NO_FAULTS = FaultPlan()


def share_point(drill: str, replica: str) -> float:
    """Where a replica falls in [0, 1) for a drill: stable across restarts of the portal and
    the same in every process, so `replica_share` picks the same replicas each time."""
    digest = hashlib.sha256(f"{drill}\x00{replica}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / float(1 << 64)
