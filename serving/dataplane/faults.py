"""The chaos-drill fault catalogue: what a version slot's `faults` user_config may hold, the
validation the portal runs before a spec becomes a revision, and the injector a replica
applies it with (per request, from background tasks, and in Serve's health check).

A group's faults (`faults.<stable|canary>` of a revision):

* `error_rate` (0..1) and `latency_ms` (whole ms, 0..600000): the original two faults;
* `error_burst`: `share` of the requests fail with a 5xx `status` (default 503);
* `latency_spike`: `share` (default 1) of the requests wait `delay_ms`: `fixed`, `uniform`
  in delay_ms ± `jitter_ms` (floored at 0; jitter is ignored by the other two), or
  `exponential` with mean delay_ms (capped at 600000 ms);
* `gpu_memory_leak`: a background task allocates `mb_per_s` up to `max_mb` (default 4096)
  on the CUDA device (host memory where there is none) and frees it when the fault goes;
* `replica_crash`: selected replicas exit the process `after_s` after `issued_at`;
* `replica_hang`: selected replicas fail Serve's health check, so Serve replaces them;
* `kv_pollution_probe` (stable slot only, needs `expires_at`): a drill-only synthetic tenant
  `identity` ("drill-probe:<run>") that the router accepts with the inference key whose
  SHA-256 is `key_hash` while the fault is in force, with a cache salt the replica derives
  from the slot's tenants' salts and the identity (never sent anywhere) and a block quota of
  `quota_blocks`; its cached blocks are dropped when the fault goes (see VersionCore);
* `weight_swap_jitter`: a `reload` nonce; each new value makes the replica hot-reload its
  artifact even though it did not change (old weights serve until the new ones are ready);
* `drill`, `issued_at`, `expires_at`: who set the faults and when; from `expires_at` on the
  replica ignores every fault of the group, so a drill ends even if nobody reverts it.

Other drill faults need nothing in the data plane: `token_starvation` is traffic the drill
sends, `control_plane_delay` a control-side key (serving.control.serve_api).

A replica is selected for crash/hang when it started before `issued_at` (its replacement
never is: no crash loop) and a hash of (drill, replica id) falls within `replica_share`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("ray.serve")

GROUPS = ("stable", "canary")
MAX_DELAY_MS = 600_000
MAX_TIMESTAMP = 1e11  # unix seconds, year ~5138: refuses milliseconds passed by mistake
DISTRIBUTIONS = ("fixed", "uniform", "exponential")
MB = 1 << 20
_LEAK_CHUNK = 64 * MB  # one allocation: short enough to keep a tick short


class FaultSpecError(ValueError):
    """A faults spec the catalogue refuses; `field` is the dotted path of the bad value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InjectedFault(RuntimeError):
    """A request failed on purpose (`error_burst`); the router answers with `status`."""

    def __init__(self, status: int, kind: str, drill: str = "") -> None:
        super().__init__(_injected_message(kind, drill))
        self.status = status
        self.kind = kind
        self.drill = drill

    @property
    def message(self) -> str:
        return _injected_message(self.kind, self.drill)

    def __reduce__(self) -> tuple[type[InjectedFault], tuple[int, str, str]]:
        # Raised inside a version replica, it must survive Ray's pickling to reach the router.
        return (InjectedFault, (self.status, self.kind, self.drill))


def _injected_message(kind: str, drill: str) -> str:
    return f"injected fault: {kind}" + (f" (drill {drill})" if drill else "")


class ReplicaHung(RuntimeError):
    """What Serve's health check gets from a replica a `replica_hang` fault selected."""


# The schema ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Num:
    low: float
    high: float
    default: float | None = None  # None: required
    integer: bool = False
    low_open: bool = False  # the lower bound itself is refused (a rate of 0 means nothing)

    def check(self, value: Any, field: str) -> float | int:
        low = "(" if self.low_open else "["
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FaultSpecError(field, f"must be a number in {low}{self.low}, {self.high}].")
        if not math.isfinite(value):
            raise FaultSpecError(field, "must be a finite number.")
        if self.integer and int(value) != value:
            raise FaultSpecError(field, "must be a whole number.")
        if value < self.low or value > self.high or (self.low_open and value == self.low):
            lower = f"greater than {self.low}" if self.low_open else f"at least {self.low}"
            raise FaultSpecError(field, f"must be {lower} and at most {self.high}.")
        return int(value) if self.integer else float(value)


@dataclass(frozen=True)
class _Choice:
    values: tuple[str, ...]
    default: str

    def check(self, value: Any, field: str) -> str:
        if value not in self.values:
            raise FaultSpecError(field, f"must be one of {', '.join(self.values)}.")
        return str(value)


@dataclass(frozen=True)
class _Text:
    pattern: str  # the whole value must match
    hint: str
    default: str | None = None

    def check(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or re.fullmatch(self.pattern, value) is None:
            raise FaultSpecError(field, f"must be {self.hint}.")
        return value


_Field = _Num | _Choice | _Text
PROBE_IDENTITY = r"drill-probe:[0-9A-Za-z_-]{1,64}"

FLAT_FAULTS: dict[str, _Num] = {
    "error_rate": _Num(0.0, 1.0),
    "latency_ms": _Num(0, MAX_DELAY_MS, integer=True),
}
NESTED_FAULTS: dict[str, dict[str, _Field]] = {
    "error_burst": {
        "share": _Num(0.0, 1.0),
        "status": _Num(500, 599, default=503, integer=True),
    },
    "latency_spike": {
        "delay_ms": _Num(0.0, MAX_DELAY_MS),
        "jitter_ms": _Num(0.0, MAX_DELAY_MS, default=0.0),
        "distribution": _Choice(DISTRIBUTIONS, "fixed"),
        "share": _Num(0.0, 1.0, default=1.0),
    },
    "gpu_memory_leak": {
        "mb_per_s": _Num(0.0, 10_000.0, low_open=True),
        "max_mb": _Num(0.0, 1_000_000.0, default=4096.0, low_open=True),
        "replica_share": _Num(0.0, 1.0, default=1.0),
    },
    "replica_crash": {
        "replica_share": _Num(0.0, 1.0, default=1.0),
        "after_s": _Num(0.0, 3600.0, default=0.0),
    },
    "replica_hang": {"replica_share": _Num(0.0, 1.0, default=1.0)},
    "kv_pollution_probe": {
        "identity": _Text(PROBE_IDENTITY, 'a synthetic tenant "drill-probe:<run>"'),
        "key_hash": _Text(r"[0-9a-f]{64}", "the SHA-256 of the probe key, 64 hex digits"),
        "quota_blocks": _Num(1, 1 << 22, default=16, integer=True),
    },
    "weight_swap_jitter": {"reload": _Num(1, 1_000_000, integer=True)},
}
META_KEYS = ("drill", "issued_at", "expires_at")
FAULT_KEYS: tuple[str, ...] = (*FLAT_FAULTS, *NESTED_FAULTS, *META_KEYS)
_TIMESTAMP = _Num(0.0, MAX_TIMESTAMP)


def validate_group(raw: Any, field: str) -> dict[str, Any]:
    """One group's faults, normalized (defaults filled in); FaultSpecError names the field."""
    if raw is None or raw == {}:
        return {}
    if not isinstance(raw, Mapping):
        raise FaultSpecError(field, "must be an object.")
    unknown = sorted(str(k) for k in raw if k not in FAULT_KEYS)
    if unknown:
        raise FaultSpecError(
            f"{field}.{unknown[0]}",
            f"unknown fault {unknown[0]!r} (known: {', '.join(sorted(FAULT_KEYS))}).",
        )
    clean: dict[str, Any] = {}
    for key, value in raw.items():
        path = f"{field}.{key}"
        if key == "drill":
            if not isinstance(value, str) or not 1 <= len(value) <= 100:
                raise FaultSpecError(path, "must be a string of 1 to 100 characters.")
            clean[key] = value
        elif key in ("issued_at", "expires_at"):
            clean[key] = _TIMESTAMP.check(value, path)
        elif key in FLAT_FAULTS:
            clean[key] = FLAT_FAULTS[key].check(value, path)
        else:
            clean[key] = _nested(value, path, NESTED_FAULTS[key])
    _cross_checks(clean, field)
    return clean


def _nested(raw: Any, field: str, schema: Mapping[str, _Field]) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise FaultSpecError(field, "must be an object.")
    unknown = sorted(str(k) for k in raw if k not in schema)
    if unknown:
        raise FaultSpecError(
            f"{field}.{unknown[0]}",
            f"unknown setting {unknown[0]!r} (known: {', '.join(sorted(schema))}).",
        )
    clean: dict[str, Any] = {}
    for name, spec in schema.items():
        if name in raw:
            clean[name] = spec.check(raw[name], f"{field}.{name}")
        elif spec.default is None:
            raise FaultSpecError(f"{field}.{name}", "is required.")
        else:
            clean[name] = spec.default
    return clean


def _cross_checks(clean: Mapping[str, Any], field: str) -> None:
    issued, expires = clean.get("issued_at"), clean.get("expires_at")
    if issued is not None and expires is not None and expires <= issued:
        raise FaultSpecError(f"{field}.expires_at", "must be later than issued_at.")
    for kind in ("replica_crash", "replica_hang"):
        # Without it a replica Serve starts in place of a crashed one would crash again.
        if kind in clean and issued is None:
            raise FaultSpecError(
                f"{field}.issued_at", f"is required with {kind}: only replicas started before "
                "it are affected, so their replacements are not.",
            )  # fmt: skip
    # The synthetic identity (and the key the router takes for it) must end by itself.
    if "kv_pollution_probe" in clean and expires is None:
        raise FaultSpecError(
            f"{field}.expires_at", "is required with kv_pollution_probe: the probe identity "
            "and its key must end by themselves.",
        )  # fmt: skip


def validate_faults(raw: Any, field: str = "faults") -> dict[str, dict[str, Any]]:
    """A revision's faults: per group (stable, canary), each validated by validate_group."""
    if raw is None or raw == {}:
        return {}
    if not isinstance(raw, Mapping) or set(raw) - set(GROUPS):
        raise FaultSpecError(field, "faults are given per group: stable, canary.")
    clean = {str(g): validate_group(v, f"{field}.{g}") for g, v in raw.items()}
    if "kv_pollution_probe" in clean.get("canary", {}):
        # Only the router knows the probe key, and it serves the stable slot itself.
        raise FaultSpecError(
            f"{field}.canary.kv_pollution_probe", "only the stable slot can take it (the "
            "router, which accepts the probe key, serves the stable slot in-process).",
        )  # fmt: skip
    return clean


# The parsed plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class LatencySpike:
    delay_ms: float
    jitter_ms: float = 0.0
    distribution: str = "fixed"
    share: float = 1.0

    def sample_ms(self, rng: random.Random) -> float:
        if self.distribution == "uniform":
            return rng.uniform(max(0.0, self.delay_ms - self.jitter_ms),
                               self.delay_ms + self.jitter_ms)  # fmt: skip
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


# The injector ----------------------------------------------------------------------------


class MemoryLeak:
    """Allocates memory at a rate, never freeing it until `stop()` (or the fault expiring):
    CUDA memory where torch sees a GPU, else host memory written to so it is resident."""

    def __init__(
        self,
        spec: MemoryLeakSpec,
        *,
        expired: Callable[[], bool],
        clock: Callable[[], float],
        device: str | None = None,
        tick_s: float = 0.1,
    ) -> None:
        self.spec = spec
        self.expired = expired
        self.clock = clock
        self.device = device
        self.tick_s = tick_s
        self.leaked_bytes = 0
        self._blocks: list[Any] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def leaked_mb(self) -> float:
        return self.leaked_bytes / MB

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(self.clock()))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._release()

    async def _run(self, started: float) -> None:
        try:
            while not self.expired():
                target = min(self.spec.max_mb, self.spec.mb_per_s * (self.clock() - started))
                missing = int(target * MB) - self.leaked_bytes
                while missing > 0 and not self.expired():
                    size = min(missing, _LEAK_CHUNK)
                    self._blocks.append(await asyncio.to_thread(self._allocate, size))
                    self.leaked_bytes += size
                    missing -= size
                await asyncio.sleep(self.tick_s)
            logger.warning("injected gpu_memory_leak expired: freeing %.0f MB", self.leaked_mb)
        finally:
            self._release()

    def _allocate(self, size: int) -> Any:
        if self.device is None:
            self.device = _leak_device()
        if self.device == "cuda":
            import torch

            return torch.empty(size, dtype=torch.uint8, device="cuda").fill_(0x5A)
        import numpy

        return numpy.full(size, 0x5A, dtype=numpy.uint8)  # written: really resident

    def _release(self) -> None:
        self._blocks.clear()
        self.leaked_bytes = 0
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()  # back to the driver, so NVML sees it go


def _leak_device() -> str:
    try:
        import torch
    except ImportError:
        return "host"
    return "cuda" if torch.cuda.is_available() else "host"


class FaultInjector:
    """Applies one version slot's faults in its replica. `configure()` runs on every
    reconfigure, on the replica's event loop (the leak and the crash are tasks on it); a
    change of traffic split or keys leaves a running leak or a pending crash alone, a change
    of the fault (or of its drill, issued_at, expires_at) starts it over."""

    def __init__(
        self,
        replica: str,
        *,
        started_at: float | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        exit_process: Callable[[int], Any] = os._exit,
        leak_device: str | None = None,
        leak_tick_s: float = 0.1,
    ) -> None:
        self.replica = replica
        self.clock = clock
        self.started_at = clock() if started_at is None else started_at
        self.rng = rng or random.Random()  # noqa: S311 (fault injection, not security)
        self.exit_process = exit_process
        self.leak_device = leak_device
        self.leak_tick_s = leak_tick_s
        self.plan = NO_FAULTS
        self.error: str | None = None
        self.leak: MemoryLeak | None = None
        self._leak_key: tuple[Any, ...] | None = None
        self._crash_task: asyncio.Task[None] | None = None
        self._crash_key: tuple[Any, ...] | None = None

    def configure(self, raw: Mapping[str, Any] | None) -> None:
        before = self.plan
        try:
            self.plan, self.error = FaultPlan.parse(raw or {}), None
        except FaultSpecError as exc:  # the portal validates: only a hand-made config gets here
            logger.error("faults ignored: %s", exc)
            self.plan, self.error = NO_FAULTS, str(exc)
        if self.plan != before:
            logger.warning("faults now (drill %r): %s", self.plan.drill or "-",
                           ", ".join(self.plan.kinds) or "none")  # fmt: skip
        self._sync_leak()
        self._sync_crash()

    def close(self) -> None:
        """Stops the leak (freeing it) and any pending crash."""
        self.plan = NO_FAULTS
        self._sync_leak()
        self._sync_crash()

    def active(self) -> FaultPlan:
        """The plan in force now: none once it has expired."""
        return NO_FAULTS if self.plan.expired(self.clock()) else self.plan

    def selected(self, share: float, plan: FaultPlan | None = None) -> bool:
        """Whether crash/hang faults of `plan` apply to this replica (see the module doc)."""
        plan = self.plan if plan is None else plan
        if plan.issued_at is None or self.started_at >= plan.issued_at:
            return False
        return share_point(plan.drill, self.replica) < share

    # Per request.

    def delay_s(self) -> float:
        plan = self.active()
        delay_ms = plan.latency_ms
        spike = plan.latency_spike
        if spike is not None and self.rng.random() < spike.share:
            delay_ms += spike.sample_ms(self.rng)
        return delay_ms / 1000.0

    def failure(self) -> Exception | None:
        plan = self.active()
        if plan.error_rate > 0 and self.rng.random() < plan.error_rate:
            return RuntimeError("injected fault: error_rate")
        burst = plan.error_burst
        if burst is not None and burst.share > 0 and self.rng.random() < burst.share:
            return InjectedFault(burst.status, "error_burst", plan.drill)
        return None

    async def before_request(self) -> None:
        delay = self.delay_s()
        if delay > 0:
            await asyncio.sleep(delay)
        failure = self.failure()
        if failure is not None:
            raise failure

    # The KV pollution probe's synthetic tenant.

    def probe_identity(self, key_hash: str | None) -> str | None:
        """The synthetic tenant of an active `kv_pollution_probe` whose key hashes to
        `key_hash` (constant-time), or None: the key is refused outside the fault's TTL."""
        probe = self.active().kv_pollution_probe
        if probe is None or not key_hash:
            return None
        return probe.identity if hmac.compare_digest(key_hash, probe.key_hash) else None

    def probe_tenant(self, tenant: str, salts: Mapping[str, bytes]) -> tuple[bytes, int] | None:
        """(cache salt, block quota) of `tenant` when it is the active probe identity. The
        salt is derived here from the slot's real tenants' salts and the identity: distinct
        from each of them, unguessable, never stored or sent anywhere."""
        probe = self.active().kv_pollution_probe
        if probe is None or tenant != probe.identity or not salts:
            return None
        seed = b"".join(salts[t] for t in sorted(salts))
        salt = hmac.new(seed, f"tenant:{probe.identity}".encode(), hashlib.sha256).digest()
        return salt, probe.quota_blocks

    def reload_key(self) -> tuple[str, float | None, int] | None:
        """(drill, issued_at, nonce) of the `weight_swap_jitter` in force, None without one:
        a replica reloads its weights whenever this changes to a new value."""
        plan = self.active()
        jitter = plan.weight_swap_jitter
        return (plan.drill, plan.issued_at, jitter.reload) if jitter is not None else None

    # Serve's health check.

    def hung(self) -> bool:
        hang = self.active().replica_hang
        return hang is not None and self.selected(hang.replica_share)

    def check_health(self) -> None:
        if self.hung():
            raise ReplicaHung(f"injected fault: replica_hang (drill {self.plan.drill or '-'})")

    # Background faults.

    @property
    def leaked_mb(self) -> float:
        return self.leak.leaked_mb if self.leak is not None else 0.0

    def _sync_leak(self) -> None:
        plan = self.plan
        spec = None if plan.expired(self.clock()) else plan.gpu_memory_leak
        if spec is not None and share_point(plan.drill, self.replica) >= spec.replica_share:
            spec = None  # not one of the replicas the drill's blast radius picked
        key = None if spec is None else (plan.drill, plan.issued_at, plan.expires_at, spec)
        if key == self._leak_key:
            return
        if self.leak is not None:
            self.leak.stop()
            self.leak = None
        self._leak_key = key
        if spec is not None:
            self.leak = MemoryLeak(
                spec, expired=lambda: self.active().gpu_memory_leak != spec,
                clock=self.clock, device=self.leak_device, tick_s=self.leak_tick_s,
            )  # fmt: skip
            self.leak.start()

    def _sync_crash(self) -> None:
        plan = self.plan
        crash = plan.replica_crash
        chosen = (
            crash is not None
            and not plan.expired(self.clock())
            and self.selected(crash.replica_share, plan)
        )
        key = (plan.drill, plan.issued_at, plan.expires_at, crash) if chosen else None
        if key == self._crash_key:
            return
        if self._crash_task is not None:
            self._crash_task.cancel()
            self._crash_task = None
        self._crash_key = key
        if key is not None:
            self._crash_task = asyncio.get_running_loop().create_task(self._crash_later(key))

    @property
    def crash_pending(self) -> bool:
        return self._crash_task is not None and not self._crash_task.done()

    async def _crash_later(self, key: tuple[Any, ...]) -> None:
        plan = self.plan
        crash = plan.replica_crash
        if crash is None or plan.issued_at is None:
            return
        wait = plan.issued_at + crash.after_s - self.clock()
        if wait > 0:
            await asyncio.sleep(wait)
        if self._crash_key != key or self.active().replica_crash is None:
            return  # removed, changed or expired meanwhile
        logger.error(
            "injected fault: replica_crash (drill %s): replica %s exits now",
            plan.drill or "-", self.replica,
        )  # fmt: skip
        for handler in logging.getLogger().handlers + logger.handlers:
            handler.flush()
        self.exit_process(1)

    def snapshot(self) -> dict[str, Any]:
        plan, now = self.plan, self.clock()
        return {
            "drill": plan.drill or None,
            "active": self.active().kinds,
            "expired": plan.expired(now),
            "issued_at": plan.issued_at,
            "expires_at": plan.expires_at,
            "fault_leaked_mb": round(self.leaked_mb, 1),
            "crash_pending": self.crash_pending,
            "hung": self.hung(),
            "started_at": self.started_at,
            "error": self.error,
        }
