"""Progressive rollouts (Argo Rollouts' vocabulary): a canary moves through steps of weight
and pause; every `analysis_interval_s` an analysis compares canary against stable and the
contract. Successful after a step's pause -> next step; after the last step the contract's
gate decides (promote, block, or needs review); Failed beyond `failure_limit` -> rollback (or
pause, `on_failure: pause`); Inconclusive -> paused for a human."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from portal.exceptions import ConflictError, ValidationFailed
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, DeploymentRevision
from serving.ops import events
from serving.ops.models import (
    AnalysisResult,
    AnalysisRun,
    Rollout,
    RolloutPolicy,
    RolloutStatus,
    SlaContract,
)
from serving.ops.sli_store import as_datetime, lookup_before
from serving.slo.evaluate import Counts, gate_check, good_total
from serving.slo.model import Contract
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

if TYPE_CHECKING:
    from serving.ops.health import SlotResult, Target

logger = logging.getLogger(__name__)
ACTIVE = (RolloutStatus.PROGRESSING, RolloutStatus.PAUSED, RolloutStatus.NEEDS_REVIEW)
# Without a contract, a canary fails when its error ratio is above both twice the stable's
# and the stable's plus 2 points (Kayenta-style comparison of the two slots).
ERROR_RATIO_FACTOR, ERROR_RATIO_MARGIN = 2.0, 0.02


def _clean_steps(steps: Any) -> list[dict[str, Any]]:
    if not isinstance(steps, list) or not 1 <= len(steps) <= 20:
        raise ValidationFailed("give 1 to 20 steps.", field="steps")
    cleaned, last = [], 0.0
    for index, step in enumerate(steps):
        if not isinstance(step, Mapping):
            raise ValidationFailed("each step is {weight, pause_s}.", field=f"steps[{index}]")
        weight, pause = step.get("weight"), step.get("pause_s", 0)
        if not isinstance(weight, int | float) or not 0 < weight <= 100 or weight < last:
            raise ValidationFailed(
                "weight must be in (0, 100] and never decrease.", field=f"steps[{index}].weight"
            )
        if not isinstance(pause, int | float) or not 0 <= pause <= 86400:
            raise ValidationFailed("pause_s must be 0..86400.", field=f"steps[{index}].pause_s")
        cleaned.append({"weight": float(weight), "pause_s": float(pause)})
        last = float(weight)
    return cleaned


def policy_set(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, values: Mapping[str, Any]
) -> RolloutPolicy:
    fields = {"analysis_interval_s", "failure_limit", "consecutive_error_limit", "min_requests",
              "on_failure", "steps"}  # fmt: skip
    unknown = set(values) - fields
    if unknown:
        raise ValidationFailed(f"unknown field {sorted(unknown)[0]!r}.", field=sorted(unknown)[0])
    with transaction.atomic():
        policy, _ = RolloutPolicy.objects.select_for_update().get_or_create(
            tenant=tenant, deployment=deployment
        )
        for name, value in values.items():
            setattr(policy, name, _clean_steps(value) if name == "steps" else value)
        policy.updated_at = timezone.now()
        try:
            policy.full_clean()
        except Exception as exc:  # django ValidationError: name the first field
            errors = getattr(exc, "message_dict", {"policy": [str(exc)]})
            field, messages = next(iter(errors.items()))
            raise ValidationFailed(str(messages[0]), field=field) from exc
        if not policy.steps:
            raise ValidationFailed("give at least one step.", field="steps")
        policy.save()
        audit_record(tenant=tenant, actor=actor, action="rollout_policy.set", obj=deployment,
                     after={k: getattr(policy, k) for k in fields})  # fmt: skip
    return policy


def rollout_start(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, version_id: Any
) -> Rollout:
    policy = RolloutPolicy.objects.filter(tenant=tenant, deployment=deployment).first()
    if policy is None or not policy.steps:
        raise ConflictError("set a rollout policy (steps) first.", field="policy")
    with transaction.atomic():
        if Rollout.objects.filter(tenant=tenant, deployment=deployment, status__in=ACTIVE).exists():
            raise ConflictError("a rollout is already in progress.", field="deployment")
        base = DeploymentRevision.objects.filter(current_of__pk=deployment.pk).first()
        if base is None or base.canary_version_id is not None:
            raise ConflictError("finish or roll back the current canary first.", field="version")
        revision = deployments.deployment_set_canary(
            tenant=tenant, actor=actor, deployment=deployment, version_id=version_id,
            percent=policy.steps[0]["weight"],
        )  # fmt: skip
        if revision.canary_version_id is None:  # deployment_set_canary always sets it
            raise ConflictError("the canary was not set.", field="version")
        rollout = Rollout.objects.create(
            tenant=tenant, deployment=deployment, canary_version_id=revision.canary_version_id,
            base_revision=base, steps=policy.steps, created_by_id=actor.user_id,
            policy={
                "analysis_interval_s": policy.analysis_interval_s,
                "failure_limit": policy.failure_limit,
                "consecutive_error_limit": policy.consecutive_error_limit,
                "min_requests": policy.min_requests,
                "on_failure": policy.on_failure,
            },
        )  # fmt: skip
        audit_record(
            tenant=tenant, actor=actor, action="rollout.started", obj=rollout,
            after={"version": revision.canary_version_id, "steps": policy.steps},
        )  # fmt: skip
    return rollout


def _set_status(rollout: Rollout, status: str, message: str, *, finished: bool = False) -> None:
    rollout.status, rollout.message = status, message[:2000]
    fields = ["status", "message"]
    if finished:
        rollout.finished_at = timezone.now()
        fields.append("finished_at")
    rollout.save(update_fields=fields)


def rollout_pause(*, tenant: Tenant, actor: Actor, rollout: Rollout) -> Rollout:
    if rollout.status != RolloutStatus.PROGRESSING:
        raise ConflictError(f"the rollout is {rollout.status}.", field="status")
    _set_status(rollout, RolloutStatus.PAUSED, f"paused by {actor.label}")
    return rollout


def rollout_resume(*, tenant: Tenant, actor: Actor, rollout: Rollout) -> Rollout:
    if rollout.status != RolloutStatus.PAUSED:
        raise ConflictError(f"the rollout is {rollout.status}.", field="status")
    rollout.step_started_at = timezone.now()
    rollout.save(update_fields=["step_started_at"])
    _set_status(rollout, RolloutStatus.PROGRESSING, f"resumed by {actor.label}")
    return rollout


def rollout_confirm(*, tenant: Tenant, actor: Actor, rollout: Rollout) -> Rollout:
    """A human confirms a rollout the gate marked `needs_review`: promote."""
    if rollout.status != RolloutStatus.NEEDS_REVIEW:
        raise ConflictError(f"the rollout is {rollout.status}, not needs_review.", field="status")
    deployments.deployment_promote(tenant=tenant, actor=actor, deployment=rollout.deployment,
                                   skip_gate=True)  # fmt: skip
    _set_status(rollout, RolloutStatus.SUCCESSFUL, f"promoted, confirmed by {actor.label}",
                finished=True)  # fmt: skip
    return rollout


def rollout_abort(*, tenant: Tenant, actor: Actor, rollout: Rollout) -> Rollout:
    from serving.ops.rollbacks import rollback_request

    if rollout.status not in ACTIVE:
        raise ConflictError(f"the rollout is {rollout.status}.", field="status")
    rollback_request(
        tenant=tenant, deployment=rollout.deployment, trigger="manual",
        reason=f"rollout aborted by {actor.label}", actor=actor, rollout=rollout,
    )  # fmt: skip
    return rollout


def _contract(deployment_id: int) -> Contract | None:
    row = SlaContract.objects.filter(deployment_id=deployment_id).order_by("-version").first()
    return Contract.from_dict(row.document) if row else None


def since(deployment_id: int, started: float, now: float) -> dict[str, Counts]:
    """Counts of each slot's current version since `started` (its cumulative totals now, as
    the last health tick stored them, minus those at `started`)."""
    from django.conf import settings

    from serving.ops.health import _keys, _loads, _redis

    window = max(1, int(now - started))
    groups = ("stable", "canary")
    if not settings.REDIS_URL:  # embedded mode: nothing measured, so nothing to compare
        return {g: Counts() for g in groups}
    raw = _redis().hmget(_keys()["state"], [f"{deployment_id}:{g}" for g in groups])
    states = {g: _loads(r) or {} for g, r in zip(groups, raw, strict=True)}
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
        )  # fmt: skip
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


def rollouts_advance(
    *, now: float, targets: Mapping[int, Target], results: Mapping[Any, SlotResult]
) -> list[dict[str, Any]]:
    """One analysis for each progressing rollout that is due (called by the health tick)."""
    actions: list[dict[str, Any]] = []
    active = Rollout.objects.filter(
        status=RolloutStatus.PROGRESSING, deployment_id__in=list(targets)
    ).select_related("tenant", "deployment__tenant", "base_revision")
    for rollout in active:
        target = targets[rollout.deployment_id]
        interval = float(rollout.policy.get("analysis_interval_s", 10))
        last = rollout.last_analysis_at.timestamp() if rollout.last_analysis_at else 0.0
        if now - last < interval:
            continue
        try:
            actions.append(
                _step(rollout, target, now, results.get((rollout.deployment_id, "canary")))
            )
        except Exception:  # one rollout's trouble must not stop the others
            logger.exception("rollout %s: analysis failed", rollout.pk)
    return actions


def _step(
    rollout: Rollout, target: Target, now: float, canary: SlotResult | None = None
) -> dict[str, Any]:
    revision = target.revision
    record: dict[str, Any] = {"rollout": rollout.pk, "step": rollout.step_index}
    if revision.canary_version_id != rollout.canary_version_id:
        _set_status(rollout, RolloutStatus.ABORTED, "the canary was changed outside the rollout",
                    finished=True)  # fmt: skip
        return {**record, "result": "aborted"}
    if canary is None or not canary.kv.get("replicas"):
        return _measurement_error(rollout, target, now, record)
    rollout.consecutive_errors = 0
    step = rollout.steps[rollout.step_index]
    step_started = rollout.step_started_at.timestamp()
    counts = since(rollout.deployment_id, step_started, now)
    min_requests = int(rollout.policy.get("min_requests", 20))
    result, summary, measurements = analyze(
        counts["canary"], counts["stable"], target.contract, min_requests
    )
    pause_over = now - step_started >= float(step["pause_s"])
    if result == AnalysisResult.INCONCLUSIVE and not pause_over:
        return {**record, "result": "waiting", "summary": summary}
    with transaction.atomic():
        AnalysisRun.objects.create(
            tenant=rollout.tenant, rollout=rollout, step_index=rollout.step_index,
            at=as_datetime(now), result=result, summary=summary, measurements=measurements,
        )  # fmt: skip
        rollout.last_analysis_at = as_datetime(now)
        rollout.save(update_fields=["last_analysis_at", "consecutive_errors"])
        if result == AnalysisResult.FAILED:
            rollout.failures += 1
            rollout.save(update_fields=["failures"])
            if rollout.failures > int(rollout.policy.get("failure_limit", 0)):
                return {**record, "result": result,
                        **on_analysis_failed(rollout, target, summary, now)}  # fmt: skip
            return {**record, "result": result, "summary": summary}
        if result == AnalysisResult.INCONCLUSIVE:
            _set_status(rollout, RolloutStatus.PAUSED, f"inconclusive: {summary}")
            return {**record, "result": result, "summary": summary}
        if not pause_over:
            return {**record, "result": result}
        return {**record, "result": result, **_next_step(rollout, target)}


def _measurement_error(
    rollout: Rollout, target: Target, now: float, record: dict[str, Any]
) -> dict[str, Any]:
    """No canary replica published counters this tick: the analysis could not measure (Argo's
    Error). Beyond `consecutive_error_limit` in a row, the rollout fails like a failed one."""
    summary = "no canary replica reported its counters"
    with transaction.atomic():
        AnalysisRun.objects.create(
            tenant=rollout.tenant, rollout=rollout, step_index=rollout.step_index,
            at=as_datetime(now), result=AnalysisResult.ERROR, summary=summary,
        )  # fmt: skip
        rollout.consecutive_errors += 1
        rollout.last_analysis_at = as_datetime(now)
        rollout.save(update_fields=["consecutive_errors", "last_analysis_at"])
        limit = int(rollout.policy.get("consecutive_error_limit", 4))
        if rollout.consecutive_errors > limit:
            why = f"{summary} in {rollout.consecutive_errors} analyses in a row"
            return {**record, "result": "error", **on_analysis_failed(rollout, target, why, now)}
    return {**record, "result": "error", "summary": summary}


def on_analysis_failed(
    rollout: Rollout, target: Target, summary: str, now: float
) -> dict[str, Any]:
    """A rollout's analysis failed beyond its limit (Argo: abort, back to the stable revision):
    roll back to the revision the canary started from, or pause (`on_failure: pause`); then
    the ops events tell incidents, which records the breach and its incident."""
    from serving.ops.rollbacks import rollback_request, rollback_run_now

    deployment = target.deployment
    rollback = None
    record: dict[str, Any]
    if rollout.policy.get("on_failure", "abort") == "pause":
        rollout.status, rollout.message = RolloutStatus.PAUSED, f"failed, paused: {summary}"
        rollout.save(update_fields=["status", "message"])
        record = {"paused": True}
    else:
        rollback, created = rollback_request(
            tenant=deployment.tenant, deployment=deployment, trigger="analysis",
            reason=f"canary analysis failed: {summary}", detected_at=as_datetime(now),
            rollout=rollout, enqueue=False,
        )  # fmt: skip
        if created:  # after the analysis' transaction commits: switch traffic in this process
            transaction.on_commit(lambda: rollback_run_now(rollback.pk))
        record = {"rollback": rollback.pk}
    return record | events.rollout_failed(
        rollout=rollout,
        rollback=rollback,
        summary=summary,
        detected_at=as_datetime(now),
        contract_version=target.contract_version,
    )


def rollout_pause_for_breach(*, tenant: Tenant, deployment: Deployment, reason: str) -> bool:
    """A contract's `pause` action: the progressing rollout pauses (True if one did)."""
    paused = Rollout.objects.filter(
        tenant=tenant, deployment=deployment, status=RolloutStatus.PROGRESSING
    ).update(status=RolloutStatus.PAUSED, message=f"paused by breach: {reason}")
    return bool(paused)


def _next_step(rollout: Rollout, target: Target) -> dict[str, Any]:
    actor = Actor(system="rollout")
    deployment = target.deployment
    if rollout.step_index + 1 < len(rollout.steps):
        rollout.step_index += 1
        rollout.step_started_at = timezone.now()
        rollout.save(update_fields=["step_index", "step_started_at"])
        weight = rollout.steps[rollout.step_index]["weight"]
        deployments.deployment_set_traffic(
            tenant=rollout.tenant, actor=actor, deployment=deployment, percent=weight
        )
        return {"next_step": rollout.step_index, "weight": weight}
    verdict, why = gate_for(deployment, target.revision)
    if verdict == "block":
        _set_status(rollout, RolloutStatus.PAUSED, f"promotion blocked by the contract: {why}")
        return {"gate": "block", "why": why}
    if verdict == "review":
        _set_status(rollout, RolloutStatus.NEEDS_REVIEW, f"needs review: {why}")
        return {"gate": "review", "why": why}
    deployments.deployment_promote(tenant=rollout.tenant, actor=actor, deployment=deployment,
                                   skip_gate=True)  # fmt: skip
    _set_status(rollout, RolloutStatus.SUCCESSFUL, "promoted after the last step", finished=True)
    return {"promoted": True}
