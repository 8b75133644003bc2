"""FaultInjector: applies one version slot's faults in its replica (per request, from background
tasks, in Serve's health check) and answers for the KV pollution probe's synthetic tenant."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from serving.dataplane.faults.leak import MemoryLeak
from serving.dataplane.faults.plan import NO_FAULTS, FaultPlan, share_point
from serving.dataplane.faults.spec import FaultSpecError, InjectedFault, ReplicaHung

logger = logging.getLogger("ray.serve")


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
        # What the faults of the plan's drill did here (requests failed, delayed): the drill
        # confirms from these that its fault took effect (incidents.drills.detection).
        # They outlive the fault (a drill stepped late still finds them) until another drill.
        self.effects: dict[str, int] = {}
        self.effects_drill: str | None = None
        self.effects_since: float | None = None  # when the drill's faults arrived here

    def configure(self, raw: Mapping[str, Any] | None) -> None:
        before = self.plan
        try:
            self.plan, self.error = FaultPlan.parse(raw or {}), None
        except FaultSpecError as exc:  # the portal validates: only a hand-made config gets here
            logger.error("faults ignored: %s", exc)
            self.plan, self.error = NO_FAULTS, str(exc)
        if self.plan.drill and self.plan.drill != self.effects_drill:
            self.effects, self.effects_drill = {}, self.plan.drill  # another drill: from zero
            self.effects_since = round(self.clock(), 3)
        if self.plan != before:
            logger.warning(
                "faults now (drill %r): %s",
                self.plan.drill or "-",
                ", ".join(self.plan.kinds) or "none",
            )
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
        """Whether crash/hang faults of `plan` apply to this replica (see the package doc,
        serving.dataplane.faults)."""
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
            self._count("latency_spike")
        return delay_ms / 1000.0

    def _count(self, kind: str) -> None:
        self.effects[kind] = self.effects.get(kind, 0) + 1

    def failure(self) -> Exception | None:
        plan = self.active()
        if plan.error_rate > 0 and self.rng.random() < plan.error_rate:
            self._count("error_rate")
            return RuntimeError("injected fault: error_rate")
        burst = plan.error_burst
        if burst is not None and burst.share > 0 and self.rng.random() < burst.share:
            self._count("error_burst")
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
                spec,
                expired=lambda: self.active().gpu_memory_leak != spec,
                clock=self.clock,
                device=self.leak_device,
                tick_s=self.leak_tick_s,
            )
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
            plan.drill or "-",
            self.replica,
        )
        for handler in logging.getLogger().handlers + logger.handlers:
            handler.flush()
        self.exit_process(1)

    def report(self) -> dict[str, Any]:
        """What the replica publishes with its SLI window (serving.dataplane.version): the
        drill whose faults are in, which are active, what they did here (requests failed or
        delayed, MB leaked and on which device: `simulated` without a GPU), whether this
        replica is hung or about to crash, and when it started (its replacement starts after
        the drill's `issued_at`)."""
        plan = self.plan
        return {
            "drill": plan.drill or None,
            "issued_at": plan.issued_at,
            "active": self.active().kinds,
            "effects": dict(self.effects),
            "effects_drill": self.effects_drill,
            "effects_since": self.effects_since,
            "leak": self.leak.report() if self.leak is not None else None,
            "hung": self.hung(),
            "crash_pending": self.crash_pending,
            "started_at": round(self.started_at, 3),
        }

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
