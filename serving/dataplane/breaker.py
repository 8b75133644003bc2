"""An adaptive circuit breaker per model version: failure rate over a rolling window, with a
minimum request count before it may open; open -> half-open after a cool-down; a few probe
requests decide between closed and open again.

A canary's breaker (`CanaryBreaker`) is also held against its stable: its minimum is scaled to
the canary's traffic share (20 requests at 20% of the traffic: 4, at least 3), slow calls count
as bad as well as errors, and it opens as soon as its last few calls hold more bad ones than the
stable's own rate makes believable (a one-sided binomial test at `canary_alpha`). A failing
canary is left within a few of its calls, not a window's worth; a canary as good as its stable
is not (tests/dataplane/test_breaker.py, bench/rollback.py).

A canary call that fails makes the canary suspect (`CanaryBreaker.suspect`): the router answers
its clients from the stable and mirrors their calls to the canary (serving.dataplane.mirror)
until it has answered `mirror_clean` of them per failure, or the mirrors' failures open it."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from itertools import islice
from typing import Any

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    window_s: float = 30.0
    min_requests: int = 20
    failure_rate: float = 0.5
    open_s: float = 10.0
    half_open_probes: int = 3
    # The canary against its stable: the test's significance (0: no comparison), and what a
    # slow call is (0: more than SLOW_FACTOR x the stable's p95 in the window, >= SLOW_FLOOR_MS).
    canary_alpha: float = 0.001
    slow_ms: float = 0.0
    # Clean calls a canary owes for each failed call before its clients come back from the
    # stable, their calls mirrored to it meanwhile (0: no mirroring; serving.dataplane.mirror).
    mirror_clean: int = 20

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> BreakerConfig:
        raw = raw or {}
        names = [f.name for f in fields(cls)]
        return cls(**{k: type(getattr(cls, k))(raw[k]) for k in names if k in raw})


SLOW_FACTOR, SLOW_FLOOR_MS, WARMUP_ANSWERS = 3.0, 250.0, 20
# The scaled minimum's floor; the rate the canary is tested against: twice the stable's (as
# bad as the stable is no reason to leave it), at least 1%.
CANARY_FLOOR, CANARY_BASE_RATE, CANARY_WORSE = 3, 0.01, 2.0
# How long a canary that has never answered may fail before its failures count: its calls go to
# the stable meanwhile (Serve bringing up its replicas, weights loading).
STARTUP_GRACE_S = 30.0
# A failed canary call makes it suspect only while the rate it is held to (twice the stable's)
# is below this: beside a flaky stable one failure is no news, and its clients would be gone
# more often than not.
SUSPECT_BELOW = 0.05
OWED_CAP = 10  # at most this many times `mirror_clean` clean calls owed


class CircuitBreaker:
    def __init__(
        self, config: BreakerConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or BreakerConfig()
        self.clock = clock
        self.state = CLOSED
        self.opened_at = 0.0
        self._events: deque[tuple[float, bool, float]] = deque()  # (time, failed, seconds)
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
        return sum(1 for _, failed, _ in self._events if failed) / len(self._events)

    def min_requests(self) -> int:
        return self.config.min_requests

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

    def record(self, ok: bool, seconds: float = 0.0) -> None:
        """One call's outcome; `seconds`: how long it took to answer (its first token for a
        stream), which a canary's breaker holds against its stable's."""
        now = self.clock()
        self.failures += not ok
        if self.state == HALF_OPEN:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)
            if not ok or self._bad_now(ok, seconds):
                self._open(now)
                return
            self._probe_successes += 1
            if self._probe_successes >= self.config.half_open_probes:
                self.state = CLOSED
                self._events.clear()
            return
        self._events.append((now, not ok, seconds))
        self._trim(now)
        if self.state != CLOSED:
            return
        enough = len(self._events) >= self.min_requests()
        if (enough and self.failure_rate() >= self.config.failure_rate) or self._worse(now):
            self._open(now)

    def _bad_now(self, ok: bool, seconds: float) -> bool:
        """Is a successful call still a bad one (a canary's slow call)? Not for this breaker."""
        return False

    def _worse(self, now: float) -> bool:
        """Does something besides the failure rate open it (a canary's comparison)? No."""
        return False

    def _open(self, now: float) -> None:
        self.state = OPEN
        self.trips += 1
        self.opened_at = now
        self._events.clear()

    def slow_threshold_s(self) -> float:
        """A call slower than this is slow: `slow_ms`, else SLOW_FACTOR x this breaker's p95
        call time in the window (at least SLOW_FLOOR_MS; the floor alone below 20 calls)."""
        if self.config.slow_ms > 0:
            return self.config.slow_ms / 1000
        floor = SLOW_FLOOR_MS / 1000
        times = sorted(seconds for _, failed, seconds in self._events if not failed)
        if len(times) < 20:
            return floor
        return max(floor, SLOW_FACTOR * times[min(len(times) - 1, int(0.95 * len(times)))])

    def bad_rate(self, slow_s: float) -> float:
        """The share of calls in the window that failed or took longer than `slow_s`,
        smoothed (one half bad call more: a clean window is not a rate of zero)."""
        self._trim(self.clock())
        bad = sum(1 for _, failed, seconds in self._events if failed or seconds > slow_s)
        return (bad + 0.5) / (len(self._events) + 1)

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "failure_rate": round(self.failure_rate(), 4),
            "window_requests": len(self._events),
            "trips": self.trips,
            "failures": self.failures,
            "turned_away": self.turned_away,
        }


def binomial_tail(bad: int, n: int, p: float) -> float:
    """P(X >= bad) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(bad, n + 1))


class CanaryBreaker(CircuitBreaker):
    """A canary's breaker, held against its stable's (`baseline`) at its traffic `share`
    (0-1; the router sets both on every reconfigure)."""

    def __init__(
        self,
        config: BreakerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        baseline: CircuitBreaker,
        share: float,
    ) -> None:
        super().__init__(config, clock)
        self.baseline, self.share = baseline, share
        # (computed at, the slow threshold in s, the stable's bad rate at it)
        self._baseline: tuple[float, float, float] = (-1.0, SLOW_FLOOR_MS / 1000, 0.0)
        self.last_test = 1.0  # the last comparison's p-value (published)
        self.first_answer_at: float | None = None
        self.first_failure_at: float | None = None  # the first call it failed before answering
        self.answers = 0
        self.clean_owed = 0  # clean calls it owes for its failures (suspect while any)
        self.mirrored = 0  # cumulative: client calls the stable answered while it was suspect

    def starting(self) -> bool:
        """Not answered yet, and its first failure is under STARTUP_GRACE_S old: its calls
        still go to the stable (replicas coming up, weights loading). A canary that failed
        every call for longer is broken, not starting: its failures count from then on."""
        if self.first_answer_at is not None:
            return False
        now = self.clock()
        if self.first_failure_at is None:
            self.first_failure_at = now
        return now - self.first_failure_at < STARTUP_GRACE_S

    def suspect(self) -> bool:
        """It owes clean calls for its failures (`mirror_clean` each): its clients go to the
        stable (while that one is closed), their calls are mirrored here."""
        return self.clean_owed > 0 and self.state == CLOSED and self.baseline.state == CLOSED

    def min_requests(self) -> int:
        """The minimum scaled to the canary's share of the traffic: as much of the stable's
        time as the stable needs, not a canary's 1/share times longer."""
        scaled = math.ceil(self.config.min_requests * max(0.0, min(1.0, self.share)))
        return max(CANARY_FLOOR, min(self.config.min_requests, scaled))

    def _against(self, now: float) -> tuple[float, float]:
        """(the slow threshold, the stable's bad rate at it), recomputed at most once a
        second: a busy stable's window is long."""
        at, slow, rate = self._baseline
        if now - at >= 1.0:
            slow = self.baseline.slow_threshold_s()
            rate = max(CANARY_BASE_RATE, CANARY_WORSE * self.baseline.bad_rate(slow))
            self._baseline = (now, slow, rate)
        return slow, rate

    def _bad_now(self, ok: bool, seconds: float) -> bool:
        return seconds > self._against(self.clock())[0]

    def record(self, ok: bool, seconds: float = 0.0) -> None:
        """Its warm-up is never slow: a call sent before the canary's first answer (it waited
        for Serve to bring up the first replica) and its first WARMUP_ANSWERS (a cold
        engine). Errors always count."""
        if ok:
            now = self.clock()
            if self.first_answer_at is None:
                self.first_answer_at = now
            self.answers += 1
            if self.answers <= WARMUP_ANSWERS or now - seconds < self.first_answer_at:
                seconds = 0.0
            if self.clean_owed and not self._bad_now(ok, seconds):
                self.clean_owed -= 1
        elif self._against(self.clock())[1] < SUSPECT_BELOW:
            # Each failure adds `mirror_clean` clean calls owed: a canary failing more than
            # one call in mirror_clean + 1 keeps its clients away until its rollback, and one
            # failing 30% answers 10 in a row (and gets them back) in 3% of its faults.
            owed = self.clean_owed + self.config.mirror_clean
            self.clean_owed = min(owed, OWED_CAP * self.config.mirror_clean)
        super().record(ok, seconds)

    def _open(self, now: float) -> None:
        super()._open(now)
        self.clean_owed = 0

    def _worse(self, now: float) -> bool:
        """Its last min_requests() calls hold at least two bad ones (failed or slow), fewer
        than `canary_alpha` likely at twice the stable's bad rate: the canary is worse."""
        if self.config.canary_alpha <= 0 or self.baseline.state != CLOSED:
            return False
        slow, base = self._against(now)
        last = list(islice(reversed(self._events), self.min_requests()))
        bad = sum(1 for _, failed, seconds in last if failed or seconds > slow)
        if bad < 2:
            return False
        self.last_test = binomial_tail(bad, len(last), base)
        return self.last_test < self.config.canary_alpha

    def snapshot(self) -> dict[str, Any]:
        return super().snapshot() | {
            "share": round(self.share, 4),
            "min_requests": self.min_requests(),
            "slow_ms": round(self._baseline[1] * 1000, 1),
            "suspect": self.suspect(),
            "mirrored": self.mirrored,
        }
