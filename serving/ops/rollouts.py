"""Progressive rollouts (Argo Rollouts' vocabulary): a canary moves through steps of weight
and pause; every `analysis_interval_s` an analysis compares canary against stable and the
contract. Successful after a step's pause -> next step; after the last step the contract's
gate decides (promote, block, or needs review); Failed beyond `failure_limit` -> rollback (or
pause, `on_failure: pause`); Inconclusive -> paused for a human. The rollout services here
record each analysis run; the analysis itself (counts, comparison, gate) is serving.ops.analysis."""

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
from serving.ops.analysis import analyze, gate_for, since
from serving.ops.models import AnalysisResult, AnalysisRun, Rollout, RolloutPolicy, RolloutStatus
from serving.ops.sli_store import as_datetime
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

if TYPE_CHECKING:
    from serving.ops.health import SlotResult, Target

logger = logging.getLogger(__name__)
ACTIVE = (RolloutStatus.PROGRESSING, RolloutStatus.PAUSED, RolloutStatus.NEEDS_REVIEW)


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
    fields = {
        "analysis_interval_s",
        "failure_limit",
        "consecutive_error_limit",
        "min_requests",
        "on_failure",
        "steps",
    }
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
        audit_record(
            tenant=tenant,
            actor=actor,
            action="rollout_policy.set",
            obj=deployment,
            after={k: getattr(policy, k) for k in fields},
        )
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
            tenant=tenant,
            actor=actor,
            deployment=deployment,
            version_id=version_id,
            percent=policy.steps[0]["weight"],
        )
        if revision.canary_version_id is None:  # deployment_set_canary always sets it
            raise ConflictError("the canary was not set.", field="version")
        rollout = Rollout.objects.create(
            tenant=tenant,
            deployment=deployment,
            canary_version_id=revision.canary_version_id,
            base_revision=base,
            steps=policy.steps,
            created_by_id=actor.user_id,
            policy={
                "analysis_interval_s": policy.analysis_interval_s,
                "failure_limit": policy.failure_limit,
                "consecutive_error_limit": policy.consecutive_error_limit,
                "min_requests": policy.min_requests,
                "on_failure": policy.on_failure,
            },
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="rollout.started",
            obj=rollout,
            after={"version": revision.canary_version_id, "steps": policy.steps},
        )
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
    deployments.deployment_promote(
        tenant=tenant, actor=actor, deployment=rollout.deployment, skip_gate=True
    )
    _set_status(
        rollout, RolloutStatus.SUCCESSFUL, f"promoted, confirmed by {actor.label}", finished=True
    )
    return rollout


def rollout_abort(*, tenant: Tenant, actor: Actor, rollout: Rollout) -> Rollout:
    from serving.ops.rollbacks import rollback_request

    if rollout.status not in ACTIVE:
        raise ConflictError(f"the rollout is {rollout.status}.", field="status")
    rollback_request(
        tenant=tenant,
        deployment=rollout.deployment,
        trigger="manual",
        reason=f"rollout aborted by {actor.label}",
        actor=actor,
        rollout=rollout,
    )
    return rollout


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
        _set_status(
            rollout,
            RolloutStatus.ABORTED,
            "the canary was changed outside the rollout",
            finished=True,
        )
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
            tenant=rollout.tenant,
            rollout=rollout,
            step_index=rollout.step_index,
            at=as_datetime(now),
            result=result,
            summary=summary,
            measurements=measurements,
        )
        rollout.last_analysis_at = as_datetime(now)
        rollout.save(update_fields=["last_analysis_at", "consecutive_errors"])
        if result == AnalysisResult.FAILED:
            rollout.failures += 1
            rollout.save(update_fields=["failures"])
            if rollout.failures > int(rollout.policy.get("failure_limit", 0)):
                return {
                    **record,
                    "result": result,
                    **on_analysis_failed(rollout, target, summary, now),
                }
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
            tenant=rollout.tenant,
            rollout=rollout,
            step_index=rollout.step_index,
            at=as_datetime(now),
            result=AnalysisResult.ERROR,
            summary=summary,
        )
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
            tenant=deployment.tenant,
            deployment=deployment,
            trigger="analysis",
            reason=f"canary analysis failed: {summary}",
            detected_at=as_datetime(now),
            rollout=rollout,
            enqueue=False,
        )
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
    deployments.deployment_promote(
        tenant=rollout.tenant, actor=actor, deployment=deployment, skip_gate=True
    )
    _set_status(rollout, RolloutStatus.SUCCESSFUL, "promoted after the last step", finished=True)
    return {"promoted": True}
