"""Degraded modes (seed 000 §3.1, SelectModelBranch(σ)): the router moves stable traffic from
the full version to a distilled one or a light proxy while the input drifts (σ from
serving.dataplane.drift), and back with hysteresis (enter at one threshold, leave below a lower
one after a dwell time); also while the in-process stable slot is saturated (its engine's
running and waiting requests over Serve's max_ongoing_requests: at or above `enter` moves to the
trigger's level, below `exit` for the dwell time leaves it), while both breakers of the full
tier are open, or while the portal pins a tier. The tier in force is the most degraded one that
σ or saturation asks for. The tier in force and the time spent degraded are published with the
router's state."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from serving.dataplane.breaker import CircuitBreaker
from serving.dataplane.drift import DriftDetector
from serving.dataplane.guard import Refused
from serving.dataplane.signals import max_ongoing

FULL = "full"
MAX_TRANSITIONS = 200  # the published history of tier changes (the compensation window's)


@dataclass(frozen=True)
class Level:
    name: str  # the router group serving it ("distilled", "proxy")
    enter: float  # σ at or above this enters the level
    exit: float  # σ below this, for dwell_s, leaves it


@dataclass(frozen=True)
class SaturationTrigger:
    level: str  # the level saturation moves stable traffic to
    enter: float  # saturation at or above this enters it
    exit: float  # below this, for dwell_s, leaves it


@dataclass(frozen=True)
class TierConfig:
    levels: tuple[Level, ...]  # by `enter`, lowest first
    dwell_s: float = 30.0
    reference: int = 50
    window: int = 50
    on_breakers_open: bool = True
    pin: str | None = None
    sla_window_s: float = 3600.0
    saturation: SaturationTrigger | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> TierConfig | None:
        if not raw or not raw.get("levels"):
            return None
        levels = tuple(
            sorted(
                (Level(str(v["name"]), float(v["enter"]), float(v["exit"])) for v in raw["levels"]),
                key=lambda level: level.enter,
            )
        )
        sat = raw.get("saturation")
        return cls(
            saturation=None
            if not sat
            else SaturationTrigger(str(sat["level"]), float(sat["enter"]), float(sat["exit"])),
            levels=levels,
            dwell_s=float(raw.get("dwell_s", 30.0)),
            reference=int(raw.get("reference_requests", 50)),
            window=int(raw.get("window", 50)),
            on_breakers_open=bool(raw.get("on_breakers_open", True)),
            pin=raw.get("pin") or None,
            sla_window_s=float(raw.get("sla_window_s", 3600.0)),
        )


class TierPolicy:
    """The tier in force, from σ, with hysteresis; the history of changes for the
    compensation SLA (time spent degraded in a window)."""

    def __init__(self, config: TierConfig, now: float | None = None) -> None:
        self.config = config
        self.names = [FULL] + [level.name for level in config.levels]
        self.current = FULL
        self.since = self.started = time.time() if now is None else now
        self.reason = "start"
        # What each trigger asks for, each with its own hysteresis: σ's level and since when
        # σ has been below its exit; saturation's level and since when it has been below exit.
        self.drift_tier = self.saturation_tier = FULL
        self._calm_since: float | None = None
        self._unloaded_since: float | None = None
        self.transitions: list[dict[str, Any]] = []

    def _level(self, name: str) -> Level | None:
        return next((lv for lv in self.config.levels if lv.name == name), None)

    def _move(
        self, to: str, reason: str, now: float, sigma: float | None, saturation: float | None
    ) -> None:
        if to == self.current:
            return
        change = {"at": now, "from": self.current, "to": to, "reason": reason, "sigma": sigma}
        if saturation is not None:
            change["saturation"] = round(saturation, 4)
        self.transitions.append(change)
        del self.transitions[:-MAX_TRANSITIONS]
        self.current, self.since, self.reason = to, now, reason

    def _drift(self, sigma: float | None, now: float) -> None:
        """σ's level: up at once, down one step per dwell below the level's exit."""
        if sigma is None:
            return
        order = self.names.index
        wanted = FULL
        for level in self.config.levels:
            if sigma >= level.enter:
                wanted = level.name
        if order(wanted) > order(self.drift_tier):
            self.drift_tier, self._calm_since = wanted, None
            return
        current = self._level(self.drift_tier)
        if current is None or sigma >= current.exit:
            self._calm_since = None
            return
        self._calm_since = self._calm_since if self._calm_since is not None else now
        if now - self._calm_since >= self.config.dwell_s:
            lower = FULL
            for level in self.config.levels:
                if order(level.name) < order(self.drift_tier) and sigma >= level.exit:
                    lower = level.name
            self.drift_tier, self._calm_since = lower, None

    def _saturation(self, saturation: float | None, now: float) -> None:
        """Saturation's level: its trigger's at once at `enter`, full after a dwell below exit."""
        trigger = self.config.saturation
        if trigger is None or trigger.level not in self.names:
            self.saturation_tier, self._unloaded_since = FULL, None
            return
        if saturation is None:
            return
        if saturation >= trigger.enter:
            self.saturation_tier, self._unloaded_since = trigger.level, None
        elif self.saturation_tier == FULL or saturation >= trigger.exit:
            self._unloaded_since = None
        else:
            since = self._unloaded_since if self._unloaded_since is not None else now
            self._unloaded_since = since
            if now - since >= self.config.dwell_s:
                self.saturation_tier, self._unloaded_since = FULL, None

    def update(
        self, sigma: float | None, now: float | None = None, saturation: float | None = None
    ) -> str:
        now = time.time() if now is None else now
        pin = self.config.pin
        if pin in self.names:
            self._move(str(pin), "pinned", now, sigma, saturation)
            return self.current
        if self.reason == "pinned":  # released: back to full, the triggers decide from here
            self._move(FULL, "released", now, sigma, saturation)
            self.drift_tier = self.saturation_tier = FULL
            self._calm_since = self._unloaded_since = None
        self._drift(sigma, now)
        self._saturation(saturation, now)
        order = self.names.index
        wanted = max(self.drift_tier, self.saturation_tier, key=order)
        if order(wanted) > order(self.current):
            reason = "drift" if wanted == self.drift_tier else "saturation"
            self._move(wanted, reason, now, sigma, saturation)
        elif order(wanted) < order(self.current):
            self._move(wanted, "recovered", now, sigma, saturation)
        return self.current

    def degraded_s(self, window_s: float, now: float | None = None) -> float:
        """Seconds spent in a tier other than full in the last `window_s` (the history kept)."""
        now = time.time() if now is None else now
        start = now - window_s
        # Before the first change kept: its `from` tier (the start's full if nothing was cut).
        tier = self.transitions[0]["from"] if self.transitions else self.current
        begin = self.started if len(self.transitions) < MAX_TRANSITIONS else start
        total = 0.0
        for change in [*self.transitions, {"at": now, "to": None}]:
            if tier != FULL:
                total += max(0.0, change["at"] - max(begin, start))
            tier, begin = change["to"], change["at"]
        return round(total, 3)


class Routes(Protocol):
    """What the tier router asks of the router: its own choice, and a group's breaker."""

    def _route(self, requested: str | None) -> str: ...

    def _breaker(self, group: str) -> CircuitBreaker: ...


class TierRouter:
    """The router's part: observe each prompt, pick the tier's group for stable traffic.
    `limit`: Serve's max_ongoing_requests of this replica (None outside one)."""

    def __init__(self, router: Routes, limit: Callable[[], int | None] = max_ongoing) -> None:
        self.router = router
        self.limit = limit
        self.saturation: float | None = None
        self.config: TierConfig | None = None
        self.policy: TierPolicy | None = None
        self.detector: DriftDetector | None = None
        self.breakers_open = 0  # requests sent down a tier because the full one's were open

    def configure(self, raw: dict[str, Any] | None) -> None:
        config = TierConfig.from_dict(raw)
        if config is None:
            self.config = self.policy = self.detector = None
            return
        if self.policy is None or self.config is None or self.config.levels != config.levels:
            self.policy = TierPolicy(config)
        self.policy.config = config
        if self.detector is None or (self.detector.reference_size, self.detector.window_size) != (
            config.reference,
            config.window,
        ):
            self.detector = DriftDetector(reference=config.reference, window=config.window)
        self.config = config

    def _allows(self, group: str) -> bool:
        try:
            return self.router._breaker(group).allow()
        except KeyError:  # a tier the router has no group for (yet)
            return False

    def _measure(self) -> float | None:
        """The in-process stable slot's requests in its engine (running and waiting) over
        Serve's limit: the saturation SLI's definition (serving.ops.health.signals). Read at
        every routed request: two len() of the engine's queues, atomic, without its lock."""
        async_engine = getattr(getattr(self.router, "local", None), "engine", None)
        engine = getattr(async_engine, "engine", None)
        limit = self.limit() if engine is not None else None
        if engine is None or not limit:
            self.saturation = None
            return None
        self.saturation = (len(engine.running) + len(engine.waiting)) / limit
        return self.saturation

    def route(self, prompt: str, requested: str | None, probe: str | None = None) -> str:
        """The group for this request: the router's own choice (stable or canary), or the
        tier in force for stable traffic, or a tier while the full tier's breakers are all
        open. A drill's probe identity stays on the stable slot (it exists only there)."""
        if self.policy is None or self.detector is None or self.config is None or probe:
            return self.router._route(requested)
        sigma = self.detector.observe(prompt)
        saturation = self._measure() if self.config.saturation is not None else None
        tier = self.policy.update(sigma, saturation=saturation)
        try:
            group = self.router._route(requested)
        except Refused as exc:
            if exc.code != "circuit_open" or not self.config.on_breakers_open:
                raise
            for level in self.config.levels:
                if self._allows(level.name):
                    self.breakers_open += 1
                    return level.name
            raise
        if group != "stable" or tier == FULL or not self._allows(tier):
            return group
        return tier

    def snapshot(self) -> dict[str, Any] | None:
        if self.policy is None or self.detector is None or self.config is None:
            return None
        now = time.time()
        return {
            "tier": self.policy.current,
            "since": self.policy.since,
            "reason": self.policy.reason,
            "pinned": self.config.pin,
            "drift": self.detector.snapshot(),
            "saturation": None if self.saturation is None else round(self.saturation, 4),
            "window_s": self.config.sla_window_s,
            "degraded_s": self.policy.degraded_s(self.config.sla_window_s, now),
            "breakers_open_routed": self.breakers_open,
            "transitions": self.policy.transitions[-20:],
        }
