"""Canary analysis of progressive rollouts (reads and arithmetic, no writes): each slot's
counts since a moment (from the health tick's cumulative totals), the comparison of canary
against stable and the contract (Successful, Failed or Inconclusive), and the contract's gate
on promoting the current canary. The rollout services (serving.ops.rollouts) record the runs.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from serving.deployments.models import Deployment, DeploymentRevision
from serving.ops.models import AnalysisResult, SlaContract
from serving.ops.sli_store import lookup_before
from serving.slo.evaluate import Counts, gate_check, good_total
from serving.slo.model import Contract

# Without a contract, a canary fails when its error ratio is above both twice the stable's
# and the stable's plus 2 points (Kayenta-style comparison of the two slots).
ERROR_RATIO_FACTOR, ERROR_RATIO_MARGIN = 2.0, 0.02


def _contract(deployment_id: int) -> Contract | None:
    row = SlaContract.objects.filter(deployment_id=deployment_id).order_by("-version").first()
    return Contract.from_dict(row.document) if row else None


def since(deployment_id: int, started: float, now: float) -> dict[str, Counts]:
    """Counts of each slot's current version since `started` (its cumulative totals now, as
    the last health tick stored them, minus those at `started`)."""
    from serving.ops.health.state import health_keys, health_redis, loads

    window = max(1, int(now - started))
    groups = ("stable", "canary")
    raw = health_redis().hmget(health_keys()["state"], [f"{deployment_id}:{g}" for g in groups])
    states = {g: loads(r) or {} for g, r in zip(groups, raw, strict=True)}
    episodes = {
        (deployment_id, g): (str(states[g].get("version", "")), float(states[g].get("since", 0)))
        for g in groups
    }
    before = lookup_before(episodes, {window: now - window})
    out: dict[str, Counts] = {}
    for group in groups:
        state = states[group]
        cumulative = Counts.from_dict(state["cum"]) if state.get("cum") else Counts()
        then = before.get((deployment_id, group), {}).get(window)
        out[group] = cumulative - then if then is not None else cumulative
    return out


def analyze(
    canary: Counts, stable: Counts, contract: Contract | None, min_requests: int
) -> tuple[str, str, dict[str, Any]]:
    """(result, summary, measurements) of canary against stable and the contract."""

    def served(c: Counts) -> int:
        return c.requests - c.rejected

    def error_ratio(c: Counts) -> float:
        return c.errors / served(c) if served(c) else 0.0

    measurements: dict[str, Any] = {
        "canary": {"requests": served(canary), "error_ratio": round(error_ratio(canary), 4)},
        "stable": {"requests": served(stable), "error_ratio": round(error_ratio(stable), 4)},
    }
    if served(canary) < min_requests:
        return (
            AnalysisResult.INCONCLUSIVE,
            (f"only {served(canary)} canary requests (need {min_requests})"),
            measurements,
        )
    failed: list[str] = []
    limit = max(error_ratio(stable) * ERROR_RATIO_FACTOR, error_ratio(stable) + ERROR_RATIO_MARGIN)
    if error_ratio(canary) > limit:
        failed.append(
            f"canary error ratio {error_ratio(canary):.3f} > {limit:.3f} "
            f"(stable {error_ratio(stable):.3f})"
        )
    for objective in contract.objectives if contract else ():
        if objective.target is None:
            continue
        good, total = good_total(objective, canary)
        if total >= min_requests:
            ratio = good / total
            measurements[objective.name] = {"canary": round(ratio, 5), "target": objective.target}
            if ratio < objective.target:
                failed.append(f"{objective.name}: canary {ratio:.4f} < target {objective.target}")
    if failed:
        return AnalysisResult.FAILED, "; ".join(failed), measurements
    return (
        AnalysisResult.SUCCESSFUL,
        "canary within the contract and the stable's error ratio",
        (measurements),
    )


def gate_for(deployment: Deployment, revision: DeploymentRevision) -> tuple[str, str]:
    """("pass" | "block" | "review", why) for promoting the current canary now."""
    contract = _contract(deployment.pk)
    if contract is None or contract.gate.mode == "off":
        return "pass", "no gate"
    first = (
        DeploymentRevision.objects.filter(
            deployment=deployment,
            canary_version_id=revision.canary_version_id,
            number__lte=revision.number,
        )
        .order_by("number")
        .first()
    )
    started = (first or revision).created_at.timestamp()
    counts = since(deployment.pk, started, timezone.now().timestamp())
    result = gate_check(contract, counts["canary"], counts["stable"])
    if result.passed:
        return "pass", result.detail
    why = "; ".join(result.failed) or result.detail
    return ("block" if contract.gate.mode == "block" else "review"), why
