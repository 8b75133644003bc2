"""The health tick's evaluation: each slot's windows from the stored boundaries, judged
against the contract in force (or the degraded tier's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serving.ops.health.targets import SlotResult, Target
from serving.ops.sli_store import BOUNDARIES, BoundaryCache, Slot
from serving.slo.evaluate import evaluate


def evaluate_slots(
    now: float,
    targets: list[Target],
    results: dict[Slot, SlotResult],
    features: Mapping[int, dict[str, Any]],
    observed: Mapping[Slot, dict[str, Any]],
    degraded: Mapping[Slot, Any] | None = None,  # a degraded slot's contract (tier_sla)
    *,
    cache: BoundaryCache = BOUNDARIES,
) -> None:
    """Each measured slot's windows (its cumulative counts less those at each window's
    boundary) and their evaluation against the contract in force."""
    lengths: set[int] = set()
    for target in targets:
        if target.contract is not None:
            lengths.update(target.contract.window_lengths())
    by_id = {t.deployment.pk: t for t in targets}
    episodes = {slot: (by_id[slot[0]].version(slot[1]), r.since) for slot, r in results.items()}
    boundaries = cache.lookup(episodes, {w: now - w for w in lengths})
    for slot, result in results.items():
        contract = (degraded or {}).get(slot) or by_id[slot[0]].contract
        if contract is None:
            continue
        found = boundaries.get(slot, {})
        result.windows = {
            w: result.cumulative - found[w] if w in found else result.cumulative
            for w in contract.window_lengths()
        }
        reported = features.get(slot[0], {})
        observations = {  # what the tenant reported about its features (drift, freshness)
            "drift": reported.get("drift", {}),
            "freshness": {f: max(0.0, now - t) for f, t in reported.get("freshness", {}).items()},
            "group": slot[1],
            "signals": observed.get(slot, {}),
            "consistency": {
                slot[1]: ((observed.get(slot) or {}).get("consistency") or {}).get("score")
            },
        }
        result.evaluation = evaluate(contract, result.windows, observations=observations)
