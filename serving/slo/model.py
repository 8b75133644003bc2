"""The SLA contract as frozen dataclasses, with durations in seconds.

`Contract.to_dict()` writes the contract document itself (what a user writes in YAML, with every
default filled in), so a stored contract reads like the one that was submitted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serving.slo.signals import SIGNAL_SLIS, SLI_SIGNALS

API_VERSION = "aiops.portal/v1"
KIND = "SlaContract"

QUANTILES: dict[str, float] = {
    "latency_p50": 0.50,
    "latency_p95": 0.95,
    "latency_p99": 0.99,
    "ttft_p95": 0.95,
    "itl_p95": 0.95,
}
# Which Counts histogram a latency SLI reads.
HISTOGRAMS: dict[str, str] = {
    "latency_p50": "latency",
    "latency_p95": "latency",
    "latency_p99": "latency",
    "ttft_p95": "ttft",
    "itl_p95": "itl",
}
RATIO_SLIS: tuple[str, ...] = ("availability", "error_rate", *QUANTILES)
GAUGE_SLIS: tuple[str, ...] = ("tokens_per_s", "drift_psi", "feature_freshness", *SIGNAL_SLIS)
ALL_SLIS: tuple[str, ...] = RATIO_SLIS + GAUGE_SLIS
FAST_SLIS: tuple[str, ...] = ("error_rate", *QUANTILES)
# rollback, pause, notify; and the remediation actions (serving.slo.remediation).
ACTIONS: tuple[str, ...] = (
    "rollback",
    "pause",
    "notify",
    "scale_out",
    "restart_replicas",
    "shed_load",
    "switch_to_fallback",
)
SEVERITIES: tuple[str, ...] = ("page", "ticket")
GATE_MODES: tuple[str, ...] = ("block", "review", "off")

DEFAULT_GAUGE_WINDOW = 300
DEFAULT_FAST_MIN_REQUESTS = 10
DEFAULT_GATE_MIN_REQUESTS = 50

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^([0-9]{1,7})([smhd])$")


def parse_duration(text: str) -> int:
    """'5m' -> 300. Raises ValueError for anything but '<int><s|m|h|d>'."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (expected e.g. '30s', '5m', '1h', '7d')")
    return int(match.group(1)) * _UNITS[match.group(2)]


def format_duration(seconds: int) -> str:
    """300 -> '5m'; the largest unit that divides evenly, so parse_duration() reverses it."""
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class Reference:
    """A reference histogram for PSI: counts[i] falls in [edges[i], edges[i+1])."""

    edges: tuple[float, ...]
    counts: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"edges": list(self.edges), "counts": list(self.counts)}


@dataclass(frozen=True)
class Objective:
    name: str
    sli: str
    target: float | None = None  # ratio SLIs: fraction of good events (error_rate: 1 - max)
    max: float | None = None  # error_rate as written, or the drift_psi limit
    min: float | None = None  # tokens_per_s
    threshold_ms: int | None = None  # latency SLIs; always one of BOUNDS_MS
    window: int | None = None  # tokens_per_s averaging window, seconds
    feature: str | None = None  # drift_psi, feature_freshness
    reference: Reference | None = None  # drift_psi
    max_age: int | None = None  # feature_freshness, seconds
    reason: str | None = None  # errors_by_reason

    @property
    def kind(self) -> str:
        return "ratio" if self.sli in RATIO_SLIS else "gauge"

    @property
    def limit(self) -> float | None:
        """The threshold of a gauge objective, in the gauge's own unit."""
        if self.sli == "tokens_per_s":
            return self.min
        if self.sli == "drift_psi":
            return self.max
        if self.sli == "feature_freshness":
            return None if self.max_age is None else float(self.max_age)
        if self.sli in SIGNAL_SLIS:
            return self.max if SIGNAL_SLIS[self.sli][0] == "max" else self.min
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "sli": self.sli}
        if self.sli == "availability":
            out["target"] = self.target
        elif self.sli == "error_rate":
            out["max"] = self.max
        elif self.sli in QUANTILES:
            out["threshold_ms"] = self.threshold_ms
            out["target"] = self.target
        elif self.sli == "tokens_per_s":
            out["min"] = self.min
            out["window"] = format_duration(self.window or DEFAULT_GAUGE_WINDOW)
        elif self.sli == "drift_psi":
            out["feature"] = self.feature
            out["max"] = self.max
            if self.reference is not None:
                out["reference"] = self.reference.to_dict()
        elif self.sli == "feature_freshness":
            out["feature"] = self.feature
            out["max_age"] = format_duration(self.max_age or 0)
        elif self.sli in SIGNAL_SLIS:
            direction, _, windowed = SIGNAL_SLIS[self.sli]
            if self.reason is not None:
                out["reason"] = self.reason
            out[direction] = self.limit
            if windowed:
                out["window"] = format_duration(self.window or DEFAULT_GAUGE_WINDOW)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Objective:
        sli = str(data["sli"])
        target = data.get("target")
        max_ = data.get("max")
        if sli == "error_rate" and max_ is not None:
            target = round(1.0 - float(max_), 12)
        elif sli in QUANTILES and target is None:
            target = QUANTILES[sli]
        window = data.get("window")
        if sli == "tokens_per_s" or (sli in SIGNAL_SLIS and SIGNAL_SLIS[sli][2]):
            window = window or format_duration(DEFAULT_GAUGE_WINDOW)
        reference = data.get("reference")
        threshold = data.get("threshold_ms")
        max_age = data.get("max_age")
        return cls(
            name=str(data["name"]),
            sli=sli,
            target=None if target is None else float(target),
            max=None if max_ is None else float(max_),
            min=None if data.get("min") is None else float(data["min"]),
            threshold_ms=None if threshold is None else int(threshold),
            window=None if window is None else parse_duration(str(window)),
            feature=None if data.get("feature") is None else str(data["feature"]),
            reference=None
            if reference is None
            else Reference(
                edges=tuple(reference["edges"]),
                counts=tuple(reference["counts"]),
            ),
            max_age=None if max_age is None else parse_duration(str(max_age)),
            reason=None if data.get("reason") is None else str(data["reason"]),
        )


@dataclass(frozen=True)
class FastRule:
    """A short check on every health tick: act when the SLI is above a threshold for `for`."""

    name: str
    sli: str
    for_seconds: int
    action: str
    above: float | None = None  # error_rate: a ratio
    above_ms: float | None = None  # latency SLIs: milliseconds
    min_requests: int = DEFAULT_FAST_MIN_REQUESTS
    severity: str = "page"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "sli": self.sli}
        if self.sli == "error_rate":
            out["above"] = self.above
        else:
            out["above_ms"] = self.above_ms
        out.update(
            {
                "for": format_duration(self.for_seconds),
                "min_requests": self.min_requests,
                "action": self.action,
                "severity": self.severity,
            }
        )
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FastRule:
        above, above_ms = data.get("above"), data.get("above_ms")
        return cls(
            name=str(data["name"]),
            sli=str(data["sli"]),
            for_seconds=parse_duration(str(data["for"])),
            action=str(data["action"]),
            above=None if above is None else float(above),
            above_ms=None if above_ms is None else float(above_ms),
            min_requests=int(data.get("min_requests", DEFAULT_FAST_MIN_REQUESTS)),
            severity=str(data.get("severity", "page")),
        )


@dataclass(frozen=True)
class AlertRule:
    """Multiwindow burn-rate alert: fires when both windows burn at >= burn_rate."""

    severity: str
    burn_rate: float
    long: int
    short: int
    action: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "burn_rate": self.burn_rate,
            "long": format_duration(self.long),
            "short": format_duration(self.short),
            "action": self.action,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AlertRule:
        return cls(
            severity=str(data["severity"]),
            burn_rate=float(data["burn_rate"]),
            long=parse_duration(str(data["long"])),
            short=parse_duration(str(data["short"])),
            action=str(data["action"]),
        )


# The SRE workbook's multiwindow, multi-burn-rate alerts for a 30-day budget.
DEFAULT_ALERTS: tuple[AlertRule, ...] = (
    AlertRule("page", 14.4, 3600, 300, "rollback"),
    AlertRule("page", 6.0, 6 * 3600, 1800, "rollback"),
    AlertRule("ticket", 3.0, 86400, 2 * 3600, "notify"),
    AlertRule("ticket", 1.0, 3 * 86400, 6 * 3600, "notify"),
)


@dataclass(frozen=True)
class Gate:
    """May a canary be promoted? `objectives` None means every ratio objective."""

    mode: str = "off"
    objectives: tuple[str, ...] | None = None
    min_requests: int = DEFAULT_GATE_MIN_REQUESTS

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode}
        if self.objectives is not None:
            out["objectives"] = list(self.objectives)
        out["min_requests"] = self.min_requests
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gate:
        objectives = data.get("objectives")
        return cls(
            mode=str(data.get("mode", "off")),
            objectives=None if objectives is None else tuple(str(o) for o in objectives),
            min_requests=int(data.get("min_requests", DEFAULT_GATE_MIN_REQUESTS)),
        )


@dataclass(frozen=True)
class Contract:
    name: str
    window: int
    objectives: tuple[Objective, ...]
    description: str = ""
    fast: tuple[FastRule, ...] = ()
    alerts: tuple[AlertRule, ...] = DEFAULT_ALERTS
    gate: Gate = field(default_factory=Gate)
    critical_signals: tuple[str, ...] | None = None  # None: the signals the objectives read
    # spec.remediation as validated (typed by serving.slo.remediation.chains_of).
    remediation: tuple[dict[str, Any], ...] = ()

    @property
    def critical(self) -> tuple[str, ...]:
        """The SLO-critical signals observability coverage is measured against."""
        if self.critical_signals is not None:
            return self.critical_signals
        read = {s for o in self.objectives for s in SLI_SIGNALS.get(o.sli, ())}
        return tuple(sorted(read))

    def objective(self, name: str) -> Objective:
        for objective in self.objectives:
            if objective.name == name:
                return objective
        raise KeyError(name)

    @property
    def ratio_objectives(self) -> tuple[Objective, ...]:
        return tuple(o for o in self.objectives if o.kind == "ratio")

    @property
    def gauge_objectives(self) -> tuple[Objective, ...]:
        return tuple(o for o in self.objectives if o.kind == "gauge")

    @property
    def gated_objectives(self) -> tuple[Objective, ...]:
        if self.gate.objectives is None:
            return self.ratio_objectives
        return tuple(self.objective(name) for name in self.gate.objectives)

    def window_lengths(self) -> list[int]:
        """Every window length (seconds) whose Counts `evaluate()` reads."""
        lengths = {self.window}
        for alert in self.alerts:
            lengths.update((alert.long, alert.short))
        lengths.update(rule.for_seconds for rule in self.fast)
        # Signal SLIs read the health tick's series, not Counts windows.
        lengths.update(
            o.window for o in self.objectives if o.window is not None and o.sli not in SIGNAL_SLIS
        )
        return sorted(lengths)

    def to_dict(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name}
        if self.description:
            metadata["description"] = self.description
        spec: dict[str, Any] = {
            "window": format_duration(self.window),
            "objectives": [o.to_dict() for o in self.objectives],
        }
        if self.fast:
            spec["fast"] = [rule.to_dict() for rule in self.fast]
        spec["alerts"] = [alert.to_dict() for alert in self.alerts]
        spec["gate"] = self.gate.to_dict()
        if self.critical_signals is not None:
            spec["critical_signals"] = list(self.critical_signals)
        if self.remediation:
            spec["remediation"] = [dict(chain) for chain in self.remediation]
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Contract:
        """Build from a contract document that already passed validation (see parse.py)."""
        metadata, spec = data["metadata"], data["spec"]
        window = parse_duration(str(spec["window"]))
        if "alerts" in spec:
            alerts = tuple(AlertRule.from_dict(a) for a in spec["alerts"])
        else:
            # The defaults assume a 30-day budget; keep those that fit a shorter one.
            alerts = tuple(a for a in DEFAULT_ALERTS if a.long <= window)
        return cls(
            name=str(metadata["name"]),
            description=str(metadata.get("description", "")),
            window=window,
            objectives=tuple(Objective.from_dict(o) for o in spec["objectives"]),
            fast=tuple(FastRule.from_dict(r) for r in spec.get("fast", ())),
            alerts=alerts,
            gate=Gate.from_dict(spec.get("gate", {})),
            critical_signals=None
            if spec.get("critical_signals") is None
            else tuple(str(s) for s in spec["critical_signals"]),
            remediation=tuple(dict(c) for c in spec.get("remediation", ())),
        )
