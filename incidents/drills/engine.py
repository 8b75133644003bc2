"""The run's state machine: one idempotent step at a time, under the run's row lock."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from incidents.drills import detection, policy, replay
from incidents.drills import faults as drill_faults
from incidents.drills.base import (
    DETECTION_WAIT_S,
    RECOVERY_WAIT_S,
    STEP_S,
    TTL_GRACE_S,
    record_event,
    run_actor,
    to_datetime,
)
from incidents.drills.catalogue import CATALOGUE
from incidents.drills.models import DrillRun, DrillStatus, RevertStrategy
from incidents.drills.steady import firing_alerts, measure, steady_state
from incidents.models import Incident
from portal.exceptions import ValidationFailed
from tenants.services import audit_record


def run_advance(run_id: int, now: float | None = None) -> float | None:
    """One step of a run; returns seconds until the next step, None once it has ended."""
    now = time.time() if now is None else now
    with transaction.atomic():
        run = (
            DrillRun.objects.select_for_update(of=("self",))
            .select_related("drill", "deployment__tenant", "deployment__current_revision")
            .filter(pk=run_id)
            .first()
        )
        if run is None or not run.is_active:
            return None
        # Probes judge the rows since the previous step as well: a step that comes late (a
        # busy or restarted worker) must not miss a deviation that ended in between.
        run.previous_step_at = run.stepped_at.timestamp() if run.stepped_at else None
        run.stepped_at = to_datetime(now)
        step = {
            DrillStatus.SCHEDULED: _start,
            DrillStatus.CHECKING: _check,
            DrillStatus.INJECTING: _inject,
            DrillStatus.OBSERVING: _observe,
            DrillStatus.REVERTING: _revert,
        }[DrillStatus(run.status)]
        delay = step(run, now)
        run.save()
    return delay


def _start(run: DrillRun, now: float) -> float:
    run.started_at = to_datetime(now)
    run.status = DrillStatus.CHECKING
    replay.arm(run, now)  # opt-in: the router records the tenant's prompts for this run
    record_event(run, "checking", "checking the steady state before injecting")
    return 0.0


def _check(run: DrillRun, now: float) -> float | None:
    held, results = steady_state(run, now)
    record_event(
        run,
        "steady_state",
        "steady state " + ("holds" if held else "does NOT hold"),
        probes=results,
    )
    if policy.suspended(run):
        _finish(run, DrillStatus.ABORTED, "aborted: the tenant was suspended; nothing was injected")
        return None
    if run.stop_requested or not held:
        _finish(
            run,
            DrillStatus.ABORTED,
            "stopped before injecting"
            if run.stop_requested
            else "aborted: the steady state did not hold before injecting; nothing was injected",
        )
        return None
    run.status = DrillStatus.INJECTING
    return 0.0


def fault_entry(run: DrillRun, now: float) -> dict[str, Any]:
    """The slot's `faults` for this run, as the replicas read them (serving.dataplane)."""
    snap = run.snapshot
    params = dict(snap["parameters"])
    blast = CATALOGUE[run.fault].blast
    if blast == "traffic":
        params["share"] = snap["traffic_share"]
    elif blast == "replicas":
        params["replica_share"] = snap["replica_share"]
    else:
        params = drill_faults.of(run.fault).data_plane(run, params)
    return {
        run.fault: params,
        "drill": str(run.pk),
        "issued_at": round(now, 3),
        "expires_at": round(now + int(snap["duration_s"]) + TTL_GRACE_S, 3),
    }


def _inject(run: DrillRun, now: float) -> float:
    from serving.deployments import services as deployments

    active = drill_faults.of(run.fault)
    reason = active.precheck(run)
    if reason is None and active.control_side:
        failed: str | None = "aborted: the fault could not go in"
        reason = drill_faults.guarded(run, "inject", lambda: active.inject(run, now), failed)
        if reason is None:
            audit_record(
                tenant=run.deployment.tenant,
                actor=run_actor(run),
                action="drill.fault_injected",
                obj=run,
                after={"fault": run.fault, **run.snapshot["parameters"]},
            )
            run.injected_at = to_datetime(now)
            run.status = DrillStatus.OBSERVING
            record_event(
                run,
                "injected",
                f"{run.fault} injected on the control side (no revision)",
                parameters=run.snapshot["parameters"],
            )
            drill_faults.guarded(run, "injected", lambda: active.injected(run, now), None)
            detection.take_baseline(run, now)
            return STEP_S
    if reason is not None:
        _finish(run, DrillStatus.ABORTED, reason)
        return 0.0
    group = run.snapshot["group"]
    revision = run.deployment.current_revision
    current = dict(revision.faults or {}) if revision is not None else {}
    if current.get(group):
        _finish(
            run,
            DrillStatus.ABORTED,
            f"aborted: the {group} slot already has faults {sorted(current[group])}; a "
            "drill injects into a clean slot only",
        )
        return 0.0
    entry = fault_entry(run, now)
    try:
        run.fault_revision = deployments.deployment_change(
            tenant=run.deployment.tenant,
            actor=run_actor(run),
            deployment=run.deployment,
            changes={"faults": {**current, group: entry}},
            reason=f"drill {run.drill.name} (run {run.pk}): inject {run.fault} into {group}",
            action="drill.fault_injected",
        )
    except ValidationFailed as exc:
        _finish(run, DrillStatus.ABORTED, f"aborted: the fault was refused: {exc.message}")
        return 0.0
    run.injected_at = to_datetime(now)
    run.status = DrillStatus.OBSERVING
    record_event(
        run,
        "injected",
        f"{run.fault} injected into {group} (revision "
        f"{run.fault_revision.number}); expires at the latest "
        f"{datetime.fromtimestamp(entry['expires_at'], tz=UTC):%H:%M:%S}",
        fault=entry,
    )
    drill_faults.guarded(run, "injected", lambda: active.injected(run, now), None)
    detection.take_baseline(run, now)
    return STEP_S


def _observe(run: DrillRun, now: float) -> float:
    held, results = steady_state(run, now)
    _score(run, results)
    if not held and not run.deviated:
        run.deviated = True
        record_event(run, "deviated", "the steady state deviated", probes=results)
    note_detection(run, now)
    detection.step(run, now)
    reason = _abort_reason(run, now, results)
    if reason is not None:
        record_event(run, "aborting", reason)
        run.verdict = reason
        run.status = DrillStatus.REVERTING
        return 0.0
    if run.deviated and run.mitigated_at is None and run.incident is None and held:
        run.mitigated_at = to_datetime(now)  # recovered by itself (e.g. Serve restarted it)
        record_event(run, "recovered", "the steady state holds again without an incident")
    active = drill_faults.of(run.fault)
    broken = drill_faults.guarded(run, "observe", lambda: active.observe(run, now), None)
    if broken is not None:  # the drill saw it itself (a cross-tenant hit): detected at once
        run.deviated = True
        run.detected_at = run.detected_at or to_datetime(now)
        run.detected_by = run.detected_by or "probe"
        record_event(run, "detected", broken)
        run.status = DrillStatus.REVERTING
        return 0.0
    elapsed = now - run.injected_at.timestamp() if run.injected_at else 0.0
    if elapsed >= int(run.snapshot["duration_s"]):
        run.status = DrillStatus.REVERTING
        record_event(run, "duration_over", f"{run.snapshot['duration_s']} s of fault elapsed")
        return 0.0
    return STEP_S


def _revert(run: DrillRun, now: float) -> float | None:
    from serving.deployments import services as deployments

    active = drill_faults.of(run.fault)
    if run.reverted_at is None and active.control_side:
        always = run.snapshot.get("revert") != RevertStrategy.DEVIATED
        if always or run.deviated or not active.lingers:
            message = drill_faults.guarded(
                run, "revert", lambda: active.revert(run, now), "not reverted: left to its TTL"
            )
            audit_record(
                tenant=run.deployment.tenant,
                actor=run_actor(run),
                action="drill.fault_reverted",
                obj=run,
                after={"fault": run.fault},
            )
            record_event(run, "reverted", message)
        else:
            _left_to_ttl(run)
        return _reverted(run, active, now)
    if run.reverted_at is None:
        group = run.snapshot["group"]
        revision = run.deployment.current_revision
        faults = dict(revision.faults or {}) if revision is not None else {}
        ours = (faults.get(group) or {}).get("drill") == str(run.pk)
        always = run.snapshot.get("revert") != RevertStrategy.DEVIATED
        if ours and (always or run.deviated):
            faults.pop(group)
            run.revert_revision = deployments.deployment_change(
                tenant=run.deployment.tenant,
                actor=run_actor(run),
                deployment=run.deployment,
                changes={"faults": faults},
                reason=f"drill {run.drill.name} (run {run.pk}): revert {run.fault}",
                action="drill.fault_reverted",
            )
            record_event(run, "reverted", f"fault removed (revision {run.revert_revision.number})")
        elif ours:
            _left_to_ttl(run)
        else:
            record_event(
                run,
                "already_gone",
                "the fault is no longer in the deployment (a rollback "
                "or another change removed it)",
            )
        return _reverted(run, active, now)
    drill_faults.guarded(run, "wind_down", lambda: active.wind_down(run, now), None)
    note_detection(run, now)
    detection.step(run, now)
    held, results = steady_state(run, now)
    waited = now - run.reverted_at.timestamp()
    if not held and waited < RECOVERY_WAIT_S and not run.stop_requested:
        return STEP_S
    failure = None if run.stop_requested else active.failure(run)
    late = failure is None and not _ending_early(run) and detection.verdict(run) is not None
    if late and waited < DETECTION_WAIT_S:
        return STEP_S  # a late row or report may still show the fault was noticed
    if run.deviated and run.mitigated_at is None and held:
        run.mitigated_at = to_datetime(now)
    unnoticed = detection.verdict(run)
    if run.stop_requested or (run.verdict and run.verdict.startswith("aborted")):
        _finish(run, DrillStatus.ABORTED, run.verdict or "stopped by hand")
    elif failure is not None:
        _finish(run, DrillStatus.FAILED, failure)
    elif unnoticed is not None:  # not a steady-state failure: nothing noticed the fault
        _finish(run, DrillStatus.FAILED, unnoticed)
    elif not held:
        _finish(
            run,
            DrillStatus.FAILED,
            f"the steady state did not come back within {RECOVERY_WAIT_S} s of the revert",
        )
    elif run.deviated and run.incident is None:
        _finish(
            run,
            DrillStatus.FAILED,
            "the steady state deviated but the ops loop opened no incident: the contract "
            "does not catch this fault",
        )
    else:
        _finish(
            run,
            DrillStatus.PASSED,
            "detected and recovered" if run.deviated else "the steady state held throughout",
        )
    return None


def _ending_early(run: DrillRun) -> bool:
    return run.stop_requested or run.verdict.startswith("aborted")


def _left_to_ttl(run: DrillRun) -> None:
    record_event(
        run,
        "left_to_ttl",
        "the steady state never deviated: the fault is left to its TTL (revert: deviated)",
    )


def _reverted(run: DrillRun, active: drill_faults.ActiveFault, now: float) -> float:
    """The revert step is done (or the fault left to its TTL): wind the fault's own work down."""
    run.reverted_at = to_datetime(now)
    drill_faults.guarded(run, "wind_down", lambda: active.wind_down(run, now), None)
    return STEP_S


def _finish(run: DrillRun, status: str, verdict: str) -> None:
    verdict = drill_faults.of(run.fault).annotate(run, verdict)
    replay.discard(run)  # the prompt sample goes with the run, whatever the verdict
    run.status = status
    run.verdict = verdict
    run.finished_at = run.stepped_at  # this step's time
    probes = run.probes or {}
    if probes.get("total"):
        run.resilience_score = round(100.0 * probes["held"] / probes["total"], 1)
    record_event(
        run,
        status,
        verdict,
        mttd_s=run.mttd_s,
        mttr_s=run.mttr_s,
        detected_by=run.detected_by or None,
        resilience_score=run.resilience_score,
    )


def note_detection(run: DrillRun, now: float) -> None:
    """The first drill incident of this run on its slot (keyed `drill-<run>:<dep>:<group>`;
    the other slot's breaches are not this fault's); its mitigation (the rollback) ends the
    MTTR."""
    if run.incident is None:
        incident = (
            Incident.objects.filter(
                tenant_id=run.tenant_id,
                drill_run_id=run.pk,
                dedup_key__endswith=f":{run.snapshot['group']}",
            )
            .order_by("triggered_at")
            .first()
        )
        if incident is not None:
            run.incident = incident
            if "contract" in detection.declared(run) and not run.detected_by:
                run.detected_at, run.detected_by = incident.triggered_at, "contract"
            record_event(
                run,
                "detected",
                f"incident #{incident.pk} opened: {incident.title}",
                incident=incident.pk,
            )
    if run.incident is not None and run.mitigated_at is None:
        run.incident.refresh_from_db(fields=["mitigated_at", "status"])
        if run.incident.mitigated_at is not None:
            run.mitigated_at = run.incident.mitigated_at
            record_event(run, "mitigated", f"incident #{run.incident.pk} mitigated")


def _score(run: DrillRun, results: list[dict[str, Any]]) -> None:
    probes = dict(run.probes or {})
    probes["checks"] = int(probes.get("checks", 0)) + 1
    probes["total"] = float(probes.get("total", 0)) + sum(r["weight"] for r in results)
    probes["held"] = float(probes.get("held", 0)) + sum(r["weight"] for r in results if r["held"])
    run.probes = probes


def _abort_reason(run: DrillRun, now: float, results: list[dict[str, Any]]) -> str | None:
    if run.stop_requested:
        return "aborted: stopped by hand"
    if policy.suspended(run):
        return "aborted: the tenant was suspended"
    conditions = run.snapshot.get("abort_conditions") or {}
    window = measure(run.deployment_id, run.snapshot["group"], now)
    limit = conditions.get("error_rate_above")
    if limit is not None and window["requests"] and window["error_rate"] > limit:
        return f"aborted: error rate {window['error_rate']:.1%} above {limit:.1%}"
    limit = conditions.get("burn_rate_above")
    if limit is not None:
        burns = [
            a.get("burn_long") or 0 for a in firing_alerts(run.deployment_id, run.snapshot["group"])
        ]
        if burns and max(burns) > limit:
            return f"aborted: burn rate {max(burns):.1f}x above {limit}x"
    return None
