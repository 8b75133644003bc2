"""The SLA level of the tier in force (seed 000 §3.1's compensation SLA: Level-2/3 p99 <= 180/300
ms while degraded): while a deployment's router replicas publish a degraded tier
(`<prefix>:router:<app>`, serving.dataplane.tiers), its stable slot is judged against its
contract with the latency thresholds scaled by that tier's `sla_latency_scale` (the largest
among the router replicas that report one). A ratio objective's threshold is one of the
histogram's bounds (serving.dataplane.sli.BOUNDS_MS): the scaled one is the smallest bound at or
above threshold x scale, the strictest the histogram can judge that is no stricter than the
degraded SLA. Fast rules' thresholds (interpolated quantiles) scale exactly. The canary is not
degraded (only stable traffic moves to a tier): it keeps the contract as written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from serving.dataplane.sli import BOUNDS_MS
from serving.ops.health.targets import Target
from serving.ops.sli_store import Slot
from serving.slo.model import HISTOGRAMS, Contract


def tier_in_force(target: Target, routers: Sequence[Mapping[str, Any]]) -> tuple[str, float] | None:
    """(tier, its SLA latency scale) of the most lenient degraded tier the router replicas
    report, None while every one serves the full tier (or the deployment declares none)."""
    levels = {str(lv["name"]): lv for lv in (target.revision.tiers or {}).get("levels") or []}
    found: tuple[str, float] | None = None
    for snapshot in routers:
        tier = (snapshot.get("tier") or {}).get("tier") if isinstance(snapshot, Mapping) else None
        if tier not in levels:
            continue
        scale = float(levels[tier].get("sla_latency_scale") or 1.0)
        if found is None or scale > found[1]:
            found = (str(tier), scale)
    return found


def scaled_threshold(threshold_ms: int, scale: float) -> int:
    wanted = threshold_ms * scale
    return next((bound for bound in BOUNDS_MS if bound >= wanted), BOUNDS_MS[-1])


def scaled_contract(contract: Contract, scale: float) -> Contract:
    """`contract` with every latency threshold scaled by `scale` (>= 1)."""
    objectives = tuple(
        replace(o, threshold_ms=scaled_threshold(o.threshold_ms, scale))
        if o.sli in HISTOGRAMS and o.threshold_ms is not None
        else o
        for o in contract.objectives
    )
    fast = tuple(
        replace(rule, above_ms=rule.above_ms * scale)
        if rule.sli in HISTOGRAMS and rule.above_ms is not None
        else rule
        for rule in contract.fast
    )
    return replace(contract, objectives=objectives, fast=fast)


def tier_contracts(
    targets: Sequence[Target], routers: Mapping[int, Sequence[Mapping[str, Any]]]
) -> dict[Slot, Contract]:
    """The contract in force of each degraded stable slot (the others keep theirs)."""
    out: dict[Slot, Contract] = {}
    for target in targets:
        if target.contract is None or not (target.revision.tiers or {}).get("levels"):
            continue
        found = tier_in_force(target, routers.get(target.deployment.pk, ()))
        if found is not None and found[1] > 1.0:
            out[(target.deployment.pk, "stable")] = scaled_contract(target.contract, found[1])
    return out
