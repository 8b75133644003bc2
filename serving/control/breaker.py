"""The Serve API client's defences against a slow or failing control plane (seed 000 §2.5: a
control plane slower than 3 s plus unbudgeted retries made a connection storm): a retry budget
and a circuit breaker per dashboard, shared by every client of the process. Django-free.

* Retry budget (a token bucket): every first attempt deposits `retry_ratio` tokens (10 %), the
  bucket also refills at `retry_floor_per_s` and holds at most `retry_cap` tokens; a retry spends
  one. Retries therefore stay under 10 % of requests plus a small floor, whatever the callers do.
* Circuit breaker: `failure_threshold` consecutive failures open it. A failure is no HTTP answer
  (unreachable, timeout), a 5xx, or an answer slower than `slow_call_s` (3 s, the seed's xDS
  resource timeout). Open, every call fails at once without touching the network; after
  `cooldown_s` one probe is let through (half-open): its success closes the breaker, its
  failure opens it for another cool-down.

`observe(callback)` hears every state change and, at most once per `publish_every_s`, a fresh
snapshot: the portal publishes them for /metrics, the status badge and its alert.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

logger = logging.getLogger(__name__)


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class GuardSettings:
    failure_threshold: int = 5
    cooldown_s: float = 10.0
    slow_call_s: float = 3.0
    retry_ratio: float = 0.1
    retry_floor_per_s: float = 0.1
    retry_cap: float = 3.0
    max_retries_per_call: int = 2
    backoff_s: float = 0.25
    publish_every_s: float = 1.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold: must be at least 1")
        for name in ("cooldown_s", "slow_call_s", "backoff_s", "retry_cap", "publish_every_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must not be negative")
        if not 0 <= self.retry_ratio <= 1:
            raise ValueError("retry_ratio: must be between 0 and 1")


class RetryBudget:
    """Token bucket: deposits per request and per second, one token per retry."""

    def __init__(self, settings: GuardSettings, *, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self._tokens = settings.retry_cap
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(
            self._settings.retry_cap,
            self._tokens + (now - self._at) * self._settings.retry_floor_per_s,
        )
        self._at = now

    def deposit(self) -> None:
        self._refill()
        self._tokens = min(self._settings.retry_cap, self._tokens + self._settings.retry_ratio)

    def withdraw(self) -> bool:
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens


class ControlPlaneGuard:
    """Breaker, retry budget and counters of one dashboard; thread-safe."""

    def __init__(
        self,
        endpoint: str,
        settings: GuardSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.settings = settings or GuardSettings()
        self._clock = clock
        self._lock = threading.Lock()
        self._budget = RetryBudget(self.settings, clock=clock)
        self.state = BreakerState.CLOSED
        self._failures = 0  # consecutive
        self._opened_at = 0.0
        self._probing = False
        self._probe_at = 0.0  # when the half-open probe went out
        self._latencies: deque[float] = deque(maxlen=50)
        self.counts = {
            "requests": 0,
            "http_calls": 0,
            "retries": 0,
            "retries_denied": 0,
            "rejected": 0,
            "failures": 0,
            "slow": 0,
            "opened": 0,
        }
        self.opened_wall: float | None = None
        self.last_error = ""
        self._published = 0.0

    def allow(self) -> bool:
        """May a new request go out? Counts it (rejected when the breaker is open)."""
        changed = False
        with self._lock:
            self.counts["requests"] += 1
            now = self._clock()
            cooled = now - self._opened_at >= self.settings.cooldown_s
            if self.state is BreakerState.OPEN and cooled:
                self.state, self._probing, changed = BreakerState.HALF_OPEN, False, True
            # A probe whose outcome never came back (its caller died, or failed before an
            # attempt was recorded) must not hold the breaker half-open for ever: after a
            # cool-down it counts as lost and the next caller probes.
            lost = self._probing and now - self._probe_at >= self.settings.cooldown_s
            if self.state is BreakerState.HALF_OPEN and (not self._probing or lost):
                self._probing, self._probe_at = True, now
                allowed = True
            else:
                allowed = self.state is BreakerState.CLOSED
            if allowed:
                self._budget.deposit()
            else:
                self.counts["rejected"] += 1
        self._notify(changed)
        return allowed

    def retry_allowed(self) -> bool:
        """May a failed attempt be tried again? Spends a token of the budget."""
        with self._lock:
            if self.state is not BreakerState.CLOSED:
                return False
            if self._budget.withdraw():
                self.counts["retries"] += 1
                return True
            self.counts["retries_denied"] += 1
            return False

    def record(self, *, ok: bool, latency_s: float, error: str = "") -> None:
        """One HTTP attempt's outcome (ok: Serve answered, below 500; `error`: why not)."""
        slow = latency_s > self.settings.slow_call_s
        failed = not ok or slow
        changed = False
        with self._lock:
            if failed:
                self.last_error = error or f"answered in {latency_s:.2f} s (slow)"
            self.counts["http_calls"] += 1
            self._latencies.append(latency_s)
            if slow:
                self.counts["slow"] += 1
            if failed:
                self.counts["failures"] += 1
                self._failures += 1
                trip = self.state is BreakerState.HALF_OPEN or (
                    self._failures >= self.settings.failure_threshold
                )
                if trip and self.state is not BreakerState.OPEN:
                    self.state, changed = BreakerState.OPEN, True
                    self.counts["opened"] += 1
                    self.opened_wall = time.time()
                if self.state is BreakerState.OPEN:
                    self._opened_at = self._clock()
            else:
                self._failures = 0
                if self.state is not BreakerState.CLOSED:
                    self.state, changed = BreakerState.CLOSED, True
                    self.opened_wall = None
            self._probing = False
        if changed:
            logger.warning("Serve API circuit breaker for %s: %s", self.endpoint, self.state)
        self._notify(changed)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            latencies = sorted(self._latencies)
            return {
                "endpoint": self.endpoint,
                "state": str(self.state),
                "consecutive_failures": self._failures,
                "last_error": self.last_error[:300],
                "opened_at": self.opened_wall,
                "retry_tokens": round(self._budget.tokens, 3),
                "latency_last_s": self._latencies[-1] if self._latencies else None,
                "latency_p50_s": latencies[len(latencies) // 2] if latencies else None,
                "latency_max_s": latencies[-1] if latencies else None,
                "settings": {
                    "failure_threshold": self.settings.failure_threshold,
                    "cooldown_s": self.settings.cooldown_s,
                    "slow_call_s": self.settings.slow_call_s,
                    "retry_ratio": self.settings.retry_ratio,
                },
                **self.counts,
                "at": time.time(),
            }

    def _notify(self, changed: bool) -> None:
        if _observer is None:
            return
        now = self._clock()
        if not changed and now - self._published < self.settings.publish_every_s:
            return
        self._published = now
        try:
            _observer(self.snapshot(), changed)
        except Exception:  # publishing the state must never fail a Serve API call
            logger.exception("publishing the Serve API guard's state failed")


_guards: dict[str, ControlPlaneGuard] = {}
_guards_lock = threading.Lock()
_settings = GuardSettings()
_observer: Callable[[dict[str, Any], bool], None] | None = None


def guard_for(endpoint: str) -> ControlPlaneGuard:
    """The process's guard of one dashboard URL (made on first use)."""
    with _guards_lock:
        guard = _guards.get(endpoint)
        if guard is None:
            guard = _guards[endpoint] = ControlPlaneGuard(endpoint, _settings)
        return guard


def guards() -> list[ControlPlaneGuard]:
    with _guards_lock:
        return list(_guards.values())


def configure(settings: GuardSettings | None = None) -> None:
    """New settings for the guards made from now on; forgets the existing ones (tests, and a
    process told its limits at start)."""
    global _settings
    with _guards_lock:
        _settings = settings or GuardSettings()
        _guards.clear()


def observe(callback: Callable[[dict[str, Any], bool], None] | None) -> None:
    """callback(snapshot, changed): told of state changes, and of fresh numbers now and then."""
    global _observer
    _observer = callback


def process_label() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
