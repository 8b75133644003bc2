"""An adaptive circuit breaker per model version: failure rate over a rolling window, with a
minimum request count before it may open; open -> half-open after a cool-down; a few probe
requests decide between closed and open again."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    window_s: float = 30.0
    min_requests: int = 20
    failure_rate: float = 0.5
    open_s: float = 10.0
    half_open_probes: int = 3

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> BreakerConfig:
        raw = raw or {}
        fields = ("window_s", "min_requests", "failure_rate", "open_s", "half_open_probes")
        return cls(**{k: type(getattr(cls, k))(raw[k]) for k in fields if k in raw})


class CircuitBreaker:
    def __init__(
        self, config: BreakerConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or BreakerConfig()
        self.clock = clock
        self.state = CLOSED
        self.opened_at = 0.0
        self._events: deque[tuple[float, bool]] = deque()  # (time, failed)
        self._probes_in_flight = 0
        self._probe_successes = 0
        # Cumulative (the router publishes them): times it opened, failures it recorded
        # (upstream errors), requests it turned away (circuit_open).
        self.trips = self.failures = self.turned_away = 0

    def _trim(self, now: float) -> None:
        horizon = now - self.config.window_s
        while self._events and self._events[0][0] < horizon:
            self._events.popleft()

    def failure_rate(self) -> float:
        self._trim(self.clock())
        if not self._events:
            return 0.0
        return sum(1 for _, failed in self._events if failed) / len(self._events)

    def allow(self) -> bool:
        """May a request go to this version now? (Counts a half-open probe when it may.)"""
        now = self.clock()
        if self.state == OPEN:
            if now - self.opened_at < self.config.open_s:
                self.turned_away += 1
                return False
            self.state = HALF_OPEN
            self._probes_in_flight = 0
            self._probe_successes = 0
        if self.state == HALF_OPEN:
            if self._probes_in_flight >= self.config.half_open_probes:
                self.turned_away += 1
                return False
            self._probes_in_flight += 1
        return True

    def record(self, ok: bool) -> None:
        now = self.clock()
        self.failures += not ok
        if self.state == HALF_OPEN:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)
            if not ok:
                self._open(now)
                return
            self._probe_successes += 1
            if self._probe_successes >= self.config.half_open_probes:
                self.state = CLOSED
                self._events.clear()
            return
        self._events.append((now, not ok))
        self._trim(now)
        enough = len(self._events) >= self.config.min_requests
        if self.state == CLOSED and enough and self.failure_rate() >= self.config.failure_rate:
            self._open(now)

    def _open(self, now: float) -> None:
        self.state = OPEN
        self.trips += 1
        self.opened_at = now
        self._events.clear()

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "failure_rate": round(self.failure_rate(), 4),
            "window_requests": len(self._events),
            "trips": self.trips,
            "failures": self.failures,
            "turned_away": self.turned_away,
        }
