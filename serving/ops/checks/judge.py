"""What a version check concludes: each contract objective against the load test's figures and
the tenant's drift sample, with its gate action (`block` or `review`), the verdict, and the
contract a benchmark drafts from its figures. Pure: no Django, no I/O."""

from __future__ import annotations

import math
from typing import Any

import yaml

from serving.dataplane.sli import BOUNDS_MS
from serving.slo.counts import bin_counts, psi
from serving.slo.model import API_VERSION, KIND, QUANTILES, Contract, Objective

# Which load-test series a latency objective reads.
SERIES = {
    "latency_p50": "_latency",
    "latency_p95": "_latency",
    "latency_p99": "_latency",
    "ttft_p95": "_ttft",
    "itl_p95": "_itl",
}
DRAFT_HEADROOM = 1.5  # a drafted latency threshold: the measured p95 times this, rounded up
DRAFT_THROUGHPUT_SHARE = 0.5  # a drafted tokens/s floor: this share of one client's rate


def default_action(contract: Contract) -> str:
    """The contract's own gate mode when it blocks or asks for review, else `review`."""
    return contract.gate.mode if contract.gate.mode in ("block", "review") else "review"


def _row(objective: Objective, action: str, **values: Any) -> dict[str, Any]:
    return {"objective": objective.name, "sli": objective.sli, "action": action, **values}


def _judge_one(
    objective: Objective, level: dict[str, Any], drift: dict[str, Any] | None, action: str
) -> dict[str, Any]:
    sli = objective.sli
    total = level["requests"]
    if sli in QUANTILES and objective.threshold_ms is not None:
        series = level[SERIES[sli]]
        if not series:
            return _row(objective, action, ok=False, detail="no request completed")
        good = sum(1 for v in series if v <= objective.threshold_ms) / len(series)
        target = objective.target if objective.target is not None else QUANTILES[sli]
        return _row(
            objective,
            action,
            ok=good >= target,
            measured=round(good, 4),
            limit=target,
            detail=f"{good:.1%} of {len(series)} under {objective.threshold_ms} ms "
            f"(target {target:.1%})",
        )
    if sli in ("availability", "error_rate"):
        ratio = (total - level["errors"]) / total if total else 0.0
        target = objective.target if objective.target is not None else 1.0
        return _row(
            objective,
            action,
            ok=total > 0 and ratio >= target,
            measured=round(ratio, 4),
            limit=target,
            detail=f"{level['errors']} of {total} requests failed",
        )
    if sli == "tokens_per_s" and objective.min is not None:
        rate = float(level["tokens_per_s"])
        return _row(
            objective,
            action,
            ok=rate >= objective.min,
            measured=rate,
            limit=objective.min,
            detail=f"{rate:.1f} tokens/s at concurrency {level['concurrency']}",
        )
    if sli == "drift_psi" and objective.reference is not None and objective.max is not None:
        if drift is None or drift.get("feature") != objective.feature:
            return _row(
                objective,
                action,
                ok=None,
                detail=f"not checked: no reference sample for feature {objective.feature!r}",
            )
        ref = objective.reference
        value = psi(ref.counts, bin_counts(ref.edges, drift["values"]))
        return _row(
            objective,
            action,
            ok=value <= objective.max,
            measured=round(value, 4),
            limit=objective.max,
            detail=f"PSI {value:.3f} of {len(drift['values'])} values (max {objective.max})",
        )
    return _row(objective, action, ok=None, detail="not measurable before serving")


def judge(
    contract: Contract,
    level: dict[str, Any],
    *,
    drift: dict[str, Any] | None,
    gates: dict[str, str],
) -> tuple[list[dict[str, Any]], str]:
    """(one row per objective, verdict): `block` when a failed objective's action is block,
    `review` when one's is review, else `pass`. Objectives that cannot be checked before
    serving (ok None) never decide the verdict."""
    fallback = default_action(contract)
    rows = [_judge_one(o, level, drift, gates.get(o.name, fallback)) for o in contract.objectives]
    failed = {row["action"] for row in rows if row["ok"] is False}
    verdict = "block" if "block" in failed else "review" if "review" in failed else "pass"
    return rows, verdict


def _bound_above(ms: float) -> int:
    """The smallest histogram bound at or above `ms` (the last one past them all)."""
    return next((b for b in BOUNDS_MS if b >= ms), BOUNDS_MS[-1])


def draft_contract(name: str, levels: list[dict[str, Any]]) -> str:
    """A contract (YAML) drafted from benchmark levels: p95 latency and TTFT thresholds at
    DRAFT_HEADROOM times the worst level's p95, and a tokens/s floor; the user edits it in the
    contract editor. The measured figures head it as comments."""
    worst_latency = max(float(lv["latency_ms"]["p95"] or 0) for lv in levels)
    worst_ttft = max(float(lv["ttft_ms"]["p95"] or 0) for lv in levels)
    single = min(levels, key=lambda lv: lv["concurrency"])
    floor = max(0.1, math.floor(single["tokens_per_s"] * DRAFT_THROUGHPUT_SHARE * 10) / 10)
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "window": "30d",
            "objectives": [
                {"name": "availability", "sli": "availability", "target": 0.99},
                {
                    "name": "p95-latency",
                    "sli": "latency_p95",
                    "threshold_ms": _bound_above(worst_latency * DRAFT_HEADROOM),
                },
                {
                    "name": "p95-ttft",
                    "sli": "ttft_p95",
                    "threshold_ms": _bound_above(worst_ttft * DRAFT_HEADROOM),
                },
                {"name": "throughput", "sli": "tokens_per_s", "min": floor, "window": "5m"},
            ],
            "gate": {"mode": "review", "objectives": ["p95-latency", "p95-ttft"]},
        },
    }
    head = ["# Drafted from a benchmark of this version (in-process engine, CPU):"]
    head += [
        f"#   concurrency {lv['concurrency']}: {lv['tokens_per_s']:.1f} tokens/s, "
        f"latency p95 {lv['latency_ms']['p95']} ms, TTFT p95 {lv['ttft_ms']['p95']} ms"
        for lv in levels
    ]
    return "\n".join(head) + "\n" + yaml.safe_dump(document, sort_keys=False)
