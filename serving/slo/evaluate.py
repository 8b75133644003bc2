"""Evaluate a contract against event counts: error budgets, burn-rate alerts, fast rules, gauges.

The caller supplies Counts for each window length in `Contract.window_lengths()` (the events of
the last that-many seconds); this module only does arithmetic on them, so it is exact and cheap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from serving.dataplane.sli import BOUNDS_MS, quantile
from serving.slo.counts import (
    Budget,
    Counts,
    bin_counts,
    budget,
    burn_rate,
    good_total,
    pct,
    psi,
    target_of,
)
from serving.slo.model import HISTOGRAMS, QUANTILES, Contract, FastRule, Objective, format_duration
from serving.slo.signals import SIGNAL_SLIS, observed_value

_ACTION_RANK = {"notify": 1, "pause": 2, "rollback": 3}


@dataclass
class ObjectiveStatus:
    name: str
    sli: str
    kind: str  # "ratio" | "gauge"
    target: float | None  # ratio objectives
    limit: float | None  # gauge objectives, in the gauge's unit
    value: float | None  # good/total over the budget window, or the gauge value
    ok: bool | None  # None: no data
    budget: Budget | None
    burn_rates: dict[str, float | None]  # keyed by format_duration(window)
    detail: str = ""


@dataclass
class Firing:
    kind: str  # "burn" | "fast" | "gauge" | "budget"
    name: str  # objective or fast rule
    severity: str
    action: str
    detail: str
    burn_long: float | None = None
    burn_short: float | None = None
    value: float | None = None


@dataclass
class Evaluation:
    objectives: list[ObjectiveStatus]
    firing: list[Firing]

    @property
    def worst_action(self) -> str | None:
        """rollback > pause > notify; None when nothing fires."""
        actions = [f.action for f in self.firing]
        return max(actions, key=lambda a: _ACTION_RANK.get(a, 0)) if actions else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _finite(self)
        out["worst_action"] = self.worst_action
        return out


@dataclass
class GateResult:
    passed: bool | None  # None: not enough canary traffic yet
    failed: list[str]  # "<objective>: <reason>"
    detail: str


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _finite(value: Any) -> Any:
    """Plain JSON data (dataclasses become dicts, without dataclasses.asdict's deep copies);
    JSON has no infinity: an overflow-bucket latency becomes null (the detail says why).
    Runs for every slot every tick: scalars return first, field names are looked up once."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if value is None or kind is int or kind is str or kind is bool:
        return value
    names = _FIELD_NAMES.get(kind)
    if names is None and is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(value))
    if names is not None:
        return {name: _finite(getattr(value, name)) for name in names}
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def evaluate(
    contract: Contract,
    windows: Mapping[int, Counts],
    *,
    observations: Mapping[str, Any] | None = None,
    min_requests: int = 1,
) -> Evaluation:
    """Status of every objective and everything that fires.

    `windows`: window length in seconds -> Counts of the last that-many seconds (a missing one
    is empty). `observations`: {"drift": {feature: [counts per reference bin]},
    "freshness": {feature: age_seconds}, "signals": {"now", "values" (or "series"), "divergence",
    "coverage"}, "consistency": {group: score}, "group": the slot's group} (the signal SLIs:
    serving.slo.signals). `min_requests`: events the short window of a burn
    alert needs before it may fire.
    """
    empty = Counts()
    statuses: list[ObjectiveStatus] = []
    firing: list[Firing] = []
    for objective in contract.objectives:
        if objective.kind == "ratio":
            statuses.append(_ratio_status(contract, objective, windows, empty))
            firing += _ratio_firing(contract, objective, statuses[-1], windows, min_requests)
        else:
            statuses.append(_gauge_status(objective, windows, observations or {}))
            if statuses[-1].ok is False:
                status = statuses[-1]
                firing.append(
                    Firing(
                        "gauge",
                        objective.name,
                        "ticket",
                        "notify",
                        status.detail,
                        value=status.value,
                    )
                )
    for rule in contract.fast:
        fired = _fast_firing(rule, windows.get(rule.for_seconds, empty))
        if fired is not None:
            firing.append(fired)
    return Evaluation(objectives=statuses, firing=firing)


def _ratio_status(
    contract: Contract, objective: Objective, windows: Mapping[int, Counts], empty: Counts
) -> ObjectiveStatus:
    counts = windows.get(contract.window, empty)
    good, total = good_total(objective, counts)
    spent = budget(objective, counts)
    lengths = sorted({w for alert in contract.alerts for w in (alert.long, alert.short)})
    burns = {format_duration(w): burn_rate(objective, windows.get(w, empty)) for w in lengths}
    window = format_duration(contract.window)
    target = target_of(objective)
    if total == 0:
        detail = f"no events over {window}"
    else:
        detail = (
            f"{pct(good / total)} good over {window} (target {pct(target)}); "
            f"{spent.bad} bad of {spent.allowed_bad:g} allowed, "
            f"{spent.remaining:.0%} of the error budget left"
        )
    return ObjectiveStatus(
        name=objective.name,
        sli=objective.sli,
        kind="ratio",
        target=target,
        limit=None,
        value=good / total if total else None,
        ok=None if total == 0 else not spent.exhausted,
        budget=spent,
        burn_rates=burns,
        detail=detail,
    )


def _ratio_firing(
    contract: Contract,
    objective: Objective,
    status: ObjectiveStatus,
    windows: Mapping[int, Counts],
    min_requests: int,
) -> list[Firing]:
    out: list[Firing] = []
    if status.budget is not None and status.budget.exhausted:
        detail = f"error budget of '{objective.name}' exhausted: {status.detail}"
        out.append(Firing("budget", objective.name, "ticket", "notify", detail, value=status.value))
    for alert in contract.alerts:
        long_burn = status.burn_rates.get(format_duration(alert.long))
        short_burn = status.burn_rates.get(format_duration(alert.short))
        _, short_total = good_total(objective, windows.get(alert.short, Counts()))
        if (
            long_burn is None
            or short_burn is None
            or long_burn < alert.burn_rate
            or short_burn < alert.burn_rate
            or short_total < min_requests
        ):
            continue
        detail = (
            f"error budget of '{objective.name}' burning {long_burn:.1f}x over "
            f"{format_duration(alert.long)} and {short_burn:.1f}x over "
            f"{format_duration(alert.short)} (threshold {alert.burn_rate:g}x)"
        )
        out.append(
            Firing(
                "burn",
                objective.name,
                alert.severity,
                alert.action,
                detail,
                burn_long=long_burn,
                burn_short=short_burn,
                value=status.value,
            )
        )
    return out


def _gauge_status(
    objective: Objective, windows: Mapping[int, Counts], observations: Mapping[str, Any]
) -> ObjectiveStatus:
    value: float | None = None
    ok: bool | None = None
    limit = objective.limit
    if objective.sli == "tokens_per_s" and objective.window is not None and limit is not None:
        counts = windows.get(objective.window, Counts())
        span = counts.seconds if counts.seconds > 0 else float(objective.window)
        over = format_duration(objective.window)
        if counts.requests == 0:  # an idle deployment is not a slow one
            detail = f"no requests over {over}"
        else:
            value = counts.tokens_out / span
            ok = value >= limit
            detail = f"{value:.1f} tokens/s over {over} (minimum {limit:g})"
    elif objective.sli == "drift_psi" and objective.reference is not None and limit is not None:
        observed = observations.get("drift", {}).get(objective.feature)
        detail = f"no observations of '{objective.feature}'"
        if observed is not None:
            try:
                value = psi(objective.reference.counts, observed)
            except ValueError as exc:
                detail = f"cannot compare '{objective.feature}' with its reference: {exc}"
            else:
                ok = value <= limit
                detail = f"PSI of '{objective.feature}' is {value:.3f} (maximum {limit:g})"
    elif objective.sli == "feature_freshness" and objective.max_age is not None:
        age = observations.get("freshness", {}).get(objective.feature)
        detail = f"no update time of '{objective.feature}'"
        if age is not None:
            value = float(age)
            ok = value <= objective.max_age
            detail = (
                f"'{objective.feature}' last updated {format_duration(int(value))} ago "
                f"(maximum {format_duration(objective.max_age)})"
            )
    elif objective.sli in SIGNAL_SLIS and limit is not None:
        value, detail = observed_value(
            objective.sli, objective.window, objective.reason, observations
        )
        if value is not None:
            ok = value <= limit if SIGNAL_SLIS[objective.sli][0] == "max" else value >= limit
            unit = SIGNAL_SLIS[objective.sli][1]
            bound = "maximum" if SIGNAL_SLIS[objective.sli][0] == "max" else "minimum"
            shown = f"{objective.sli} {value:.4g}{' ' + unit if unit else ''}"
            detail = f"{shown} ({bound} {limit:g}){'; ' + detail if detail else ''}"
    else:
        detail = "incomplete objective"
    return ObjectiveStatus(
        name=objective.name,
        sli=objective.sli,
        kind="gauge",
        target=None,
        limit=limit,
        value=value,
        ok=ok,
        budget=None,
        burn_rates={},
        detail=detail,
    )


def _fast_firing(rule: FastRule, counts: Counts) -> Firing | None:
    """Error ratio, or the latency quantile (upper bound of its bucket), over `for`.

    Events counted toward min_requests: requests less rejected ones for error_rate, histogram
    observations for latency and ttft (one a request), and requests for itl (one a token gap).
    """
    over = format_duration(rule.for_seconds)
    if rule.sli == "error_rate" and rule.above is not None:
        total = max(counts.requests - counts.rejected, 0)
        if total < rule.min_requests or total == 0:
            return None
        ratio = counts.errors / total
        if ratio <= rule.above:
            return None
        detail = (
            f"error rate {pct(ratio)} over {over} is above {pct(rule.above)} "
            f"({counts.errors} of {total} requests)"
        )
        return Firing("fast", rule.name, rule.severity, rule.action, detail, value=ratio)
    if rule.sli in HISTOGRAMS and rule.above_ms is not None:
        hist: list[int] = getattr(counts, HISTOGRAMS[rule.sli])
        events = counts.requests if rule.sli == "itl_p95" else sum(hist)
        value = quantile(hist, QUANTILES[rule.sli])
        if events < rule.min_requests or value is None or value <= rule.above_ms:
            return None
        shown = f"{value:g} ms" if math.isfinite(value) else f"over {BOUNDS_MS[-1]} ms"
        detail = f"{rule.sli} {shown} over {over} is above {rule.above_ms:g} ms ({events} events)"
        return Firing("fast", rule.name, rule.severity, rule.action, detail, value=value)
    return None


def gate_check(contract: Contract, canary: Counts, stable: Counts | None = None) -> GateResult:
    """May the canary be promoted? Every gated objective's lifetime ratio must meet its target.

    The gate's mode (block/review/off) is the caller's business; this only judges the numbers.
    `stable`, when given, is quoted in the detail for comparison.
    """
    objectives = contract.gated_objectives
    if not objectives:
        return GateResult(passed=True, failed=[], detail="no ratio objectives to gate on")
    needed = contract.gate.min_requests
    failed: list[str] = []
    waiting: list[str] = []
    parts: list[str] = []
    for objective in objectives:
        good, total = good_total(objective, canary)
        target = target_of(objective)
        if total < needed:
            waiting.append(f"{objective.name} has {total} of {needed} events")
            continue
        line = f"{objective.name} {pct(good / total)} (target {pct(target)}"
        if stable is not None:
            stable_good, stable_total = good_total(objective, stable)
            if stable_total:
                line += f", stable {pct(stable_good / stable_total)}"
        parts.append(line + ")")
        if budget(objective, canary).exhausted:
            failed.append(f"{objective.name}: {pct(good / total)} good, below {pct(target)}")
    if failed:
        return GateResult(passed=False, failed=failed, detail="; ".join(parts))
    if waiting:
        return GateResult(
            passed=None, failed=[], detail="not enough canary traffic: " + "; ".join(waiting)
        )
    return GateResult(passed=True, failed=[], detail="; ".join(parts))


__all__ = [
    "Budget",
    "Counts",
    "Evaluation",
    "Firing",
    "GateResult",
    "ObjectiveStatus",
    "bin_counts",
    "budget",
    "burn_rate",
    "evaluate",
    "gate_check",
    "good_total",
    "psi",
]
