"""Chaos drills (services): the fault catalogue, drills and their cron schedules
(django-celery-beat), and the run's state machine:

    scheduled -> checking (steady state) -> injecting -> observing -> reverting
              -> passed | failed | aborted

Faults go in only through the reconcile path: a new revision whose spec carries the fault in
the target slot's `faults` (audited like any change), with `issued_at` and `expires_at`, so the
replicas drop it by themselves at the TTL even if the worker that should revert it is gone.
Each step runs in the `advance_drill_run` task (queue `chaos`, acks_late) under a row lock and
is idempotent; a killed worker's run is picked up again by the `resume_drill_runs` sweep.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from incidents import drill_faults
from incidents.drill_models import (
    ACTIVE_STATUSES,
    ChaosDrill,
    DrillEvent,
    DrillRun,
    DrillStatus,
    FaultKind,
    RevertStrategy,
)
from incidents.models import Incident
from portal.exceptions import ConflictError, ValidationFailed
from serving.deployment_models import Deployment
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

logger = logging.getLogger(__name__)

TTL_GRACE_S = 60  # the fault outlives the planned duration by this much at most
STEP_S = 1.0  # how often an observing run looks
RECOVERY_WAIT_S = 60  # after the revert, how long the steady state has to come back
PROBE_WINDOW_S = 15  # probes judge the last this-many seconds of stored SLI rows
CATCH_UP_MAX_S = 300  # and the rows since the previous step, this far back at most
# An active run not stepped for this long lost its task (DRILL_RESUME_AFTER_S, tests shorten it).
RESUME_AFTER_S = 15


@dataclass(frozen=True)
class Fault:
    title: str
    description: str
    # parameter -> (low, high, default) for numbers, or a tuple of allowed strings
    parameters: dict[str, Any]
    # "traffic": traffic_share is the share of requests; "replicas": replica_share the share
    # of replicas; "slot": the whole slot (no share applies); "control": the control plane.
    blast: str


BLAST_RADIUS = {
    "traffic": "traffic_share",
    "replicas": "replica_share",
    "slot": "the whole slot (no share applies)",
    "control": "the control plane: every Serve API call of the portal (all reconciles)",
}


CATALOGUE: dict[str, Fault] = {
    FaultKind.ERROR_BURST: Fault(
        "Error burst",
        "A share of the slot's requests fail with a 5xx. The contract's error-rate and "
        "availability objectives should catch it; a rollback fixes it.",
        {"status": (500, 599, 503)},
        "traffic",
    ),
    FaultKind.LATENCY_SPIKE: Fault(
        "Latency spike",
        "Added delay (fixed, uniform with jitter, or exponential) on a share of requests. "
        "Latency objectives should catch it.",
        {
            "delay_ms": (1, 600_000, 500),
            "jitter_ms": (0, 600_000, 0),
            "distribution": ("fixed", "uniform", "exponential"),
        },
        "traffic",
    ),
    FaultKind.GPU_MEMORY_LEAK: Fault(
        "GPU memory leak",
        "The replicas allocate device memory (host memory without a GPU) at N MB/s without "
        "freeing it, up to a cap; watch the GPU dashboard and the KV cache.",
        {"mb_per_s": (1, 10_000, 50), "max_mb": (1, 1_000_000, 4096)},
        "replicas",
    ),
    FaultKind.REPLICA_CRASH: Fault(
        "Replica crash",
        "A share of the slot's replicas exit; Ray Serve restarts them. Requests in flight on "
        "them fail; clients with retries should not notice.",
        {"after_s": (0, 3600, 0)},
        "replicas",
    ),
    FaultKind.REPLICA_HANG: Fault(
        "Replica hang",
        "A share of the slot's replicas stop answering Serve's health check; Serve replaces them.",
        {},
        "replicas",
    ),
    FaultKind.KV_POLLUTION_PROBE: Fault(
        "KV cache pollution probe",
        "Another tenant's identity replays the tenant's prompts and must see 0 prefix-cache "
        "hits: a synthetic drill tenant (its own server-derived salt, its key accepted only "
        "while the fault is in) replays fresh prompts the tenant just sent twice, on the "
        "stable slot of a dedicated deployment. A cross-tenant hit fails the run at once; "
        "the tenant's own repeat hits prove the probe could have seen one.",
        {"replays_per_step": (1, 10, 2), "prompt_chars": (64, 8000, 400)},
        "slot",
    ),
    FaultKind.TOKEN_STARVATION: Fault(
        "Token starvation",
        "A flood of long-context requests as the tenant (concurrency in flight for the whole "
        "duration); KV block quotas, admission (429 kv_quota_exceeded) and the guard must "
        "keep it the flooding tenant's problem: other tenants' deployments beside it (its "
        "shared pool's, or its neighbours on the cluster) are probed throughout.",
        {
            "concurrency": (1, 64, 8),
            "prompt_chars": (16, 60_000, 2000),
            "max_tokens": (1, 4096, 32),
            "bystander_max_error_rate": (0, 1, 0),
        },
        "slot",
    ),
    FaultKind.WEIGHT_SWAP_JITTER: Fault(
        "Weight swap jitter",
        "Repeated hot reloads under traffic: every interval_s a revision makes the slot's "
        "replicas reload their weights (the old ones serve until the new ones are ready), "
        "`reloads` times in all. Not one request may fail.",
        {"reloads": (1, 100, 3), "interval_s": (1, 600, 5)},
        "slot",
    ),
    FaultKind.CONTROL_PLANE_DELAY: Fault(
        "Control plane delay",
        "Every call of the portal's Serve API client (reconciles, status refreshes) waits "
        "delay_ms while the fault is in (a Redis key with the fault's TTL); the data plane "
        "must keep serving. The control plane is shared: every deployment's changes slow.",
        {"delay_ms": (1, 10_000, 2000)},
        "control",
    ),
}


def catalogue() -> list[dict[str, Any]]:
    """The catalogue for pages and the API: each fault, what it does, its parameters."""
    out = []
    for kind, fault in CATALOGUE.items():
        params = {}
        for name, rule in fault.parameters.items():
            if isinstance(rule[0], str):
                params[name] = {"choices": list(rule), "default": rule[0]}
            else:
                params[name] = {"min": rule[0], "max": rule[1], "default": rule[2]}
        out.append({
            "fault": str(kind), "title": fault.title, "description": fault.description,
            "parameters": params, "blast_radius": BLAST_RADIUS[fault.blast],
        })  # fmt: skip
    return out


PROBE_SLIS = {"error_rate": "max", "availability": "min", "latency_p95_ms": "max", "rps": "min"}


def _event(run: DrillRun, kind: str, message: str, **data: Any) -> DrillEvent:
    return DrillEvent.objects.create(
        tenant_id=run.tenant_id, run=run, kind=kind, message=message, data=data
    )


# --- drills ---------------------------------------------------------------------------------


def _check_parameters(fault: str, raw: Any) -> dict[str, Any]:
    if fault not in CATALOGUE:
        raise ValidationFailed(f"must be one of {', '.join(CATALOGUE)}.", field="fault")
    spec = CATALOGUE[fault].parameters
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValidationFailed("give an object of parameters.", field="parameters")
    unknown = set(raw) - set(spec)
    if unknown:
        raise ValidationFailed(
            f"unknown parameter {sorted(unknown)[0]!r} for {fault}; known: "
            f"{', '.join(spec) or 'none'}.",
            field=f"parameters.{sorted(unknown)[0]}",
        )
    out: dict[str, Any] = {}
    for name, rule in spec.items():
        value = raw.get(name)
        field = f"parameters.{name}"
        if isinstance(rule[0], str):  # a choice
            value = rule[0] if value is None else value
            if value not in rule:
                raise ValidationFailed(f"must be one of {', '.join(rule)}.", field=field)
        else:
            low, high, default = rule
            value = default if value is None else value
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationFailed("must be a number.", field=field)
            if not low <= value <= high:
                raise ValidationFailed(f"must be between {low} and {high}.", field=field)
        out[name] = value
    return out


def _check_steady_state(raw: Any) -> dict[str, Any]:
    raw = raw or {}
    if not isinstance(raw, dict) or set(raw) - {"contract", "probes"}:
        raise ValidationFailed("give {contract: bool, probes: [...]}.", field="steady_state")
    probes = []
    for index, probe in enumerate(raw.get("probes") or []):
        field = f"steady_state.probes[{index}]"
        if not isinstance(probe, dict):
            raise ValidationFailed("each probe is an object.", field=field)
        sli = probe.get("sli")
        if sli not in PROBE_SLIS:
            raise ValidationFailed(f"sli: one of {', '.join(PROBE_SLIS)}.", field=f"{field}.sli")
        bound = PROBE_SLIS[sli]
        value = probe.get(bound)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValidationFailed(
                f"{sli} needs `{bound}`, a number >= 0.", field=f"{field}.{bound}"
            )
        weight = probe.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ValidationFailed("must be a number > 0.", field=f"{field}.weight")
        name = str(probe.get("name") or f"{sli} {'<=' if bound == 'max' else '>='} {value}")
        probes.append({"name": name[:80], "sli": sli, bound: value, "weight": weight})
    contract = raw.get("contract", not probes)
    if not isinstance(contract, bool):
        raise ValidationFailed("true or false.", field="steady_state.contract")
    return {"contract": contract, "probes": probes}


def _check_abort(raw: Any) -> dict[str, Any]:
    raw = raw or {}
    if not isinstance(raw, dict) or set(raw) - {"burn_rate_above", "error_rate_above"}:
        raise ValidationFailed(
            "give {burn_rate_above: x, error_rate_above: y}.", field="abort_conditions"
        )
    out = {}
    for name, (low, high) in {"burn_rate_above": (0, 10_000), "error_rate_above": (0, 1)}.items():
        value = raw.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
            raise ValidationFailed(
                f"a number in ({low}, {high}].", field=f"abort_conditions.{name}"
            )
        out[name] = value
    return out


def _check_schedule(raw: Any) -> str:
    schedule = " ".join(str(raw or "").split())
    if not schedule:
        return ""
    parts = schedule.split(" ")
    if len(parts) != 5:
        raise ValidationFailed(
            "a cron expression of 5 fields: minute hour day-of-month month day-of-week.",
            field="schedule",
        )
    from celery.schedules import crontab

    try:
        crontab(*parts)
    except (ValueError, TypeError) as exc:
        raise ValidationFailed(f"not a valid cron expression: {exc}", field="schedule") from exc
    return schedule


DRILL_FIELDS = (
    "name", "description", "fault", "parameters", "group", "replica_share", "traffic_share",
    "duration_s", "steady_state", "abort_conditions", "schedule", "revert", "is_active",
)  # fmt: skip


def _apply(drill: ChaosDrill, data: dict[str, Any]) -> None:
    unknown = set(data) - set(DRILL_FIELDS)
    if unknown:
        raise ValidationFailed("unknown field.", field=sorted(unknown)[0])
    for name, value in data.items():
        setattr(drill, name, value)
    drill.parameters = _check_parameters(drill.fault, drill.parameters)
    if drill.group not in ("stable", "canary"):
        raise ValidationFailed("stable or canary.", field="group")
    drill.steady_state = _check_steady_state(drill.steady_state)
    drill.abort_conditions = _check_abort(drill.abort_conditions)
    drill.schedule = _check_schedule(drill.schedule)
    if drill.revert not in RevertStrategy.values:
        raise ValidationFailed(f"one of {', '.join(RevertStrategy.values)}.", field="revert")
    from incidents.configuration import clean_or_fail

    clean_or_fail(drill, exclude=["tenant", "deployment", "created_by", "periodic_task"])
    drill_faults.of(drill.fault).check(drill)


def drill_create(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, **data: Any
) -> ChaosDrill:
    if deployment.tenant_id != tenant.pk or deployment.deleted_at is not None:
        raise ValidationFailed("no such deployment in this tenant.", field="deployment")
    drill = ChaosDrill(tenant=tenant, deployment=deployment, created_by_id=actor.user_id)
    _apply(drill, data)
    with transaction.atomic():
        if ChaosDrill.objects.filter(tenant=tenant, name=drill.name).exists():
            raise ConflictError("a drill with this name exists.", field="name")
        drill.save()
        _sync_schedule(drill)
        audit_record(tenant=tenant, actor=actor, action="drill.created", obj=drill,
                     after=_drill_snapshot(drill))  # fmt: skip
    return drill


def drill_update(*, tenant: Tenant, actor: Actor, drill: ChaosDrill, **data: Any) -> ChaosDrill:
    with transaction.atomic():
        locked = ChaosDrill.objects.select_for_update().get(tenant=tenant, pk=drill.pk)
        before = _drill_snapshot(locked)
        _apply(locked, data)
        if (
            "name" in data
            and ChaosDrill.objects.filter(tenant=tenant, name=locked.name)
            .exclude(pk=locked.pk)
            .exists()
        ):
            raise ConflictError("a drill with this name exists.", field="name")
        locked.save()
        _sync_schedule(locked)
        audit_record(tenant=tenant, actor=actor, action="drill.changed", obj=locked,
                     before=before, after=_drill_snapshot(locked))  # fmt: skip
    return locked


def drill_delete(*, tenant: Tenant, actor: Actor, drill: ChaosDrill) -> None:
    with transaction.atomic():
        locked = ChaosDrill.objects.select_for_update().get(tenant=tenant, pk=drill.pk)
        if DrillRun.objects.filter(drill=locked, status__in=ACTIVE_STATUSES).exists():
            raise ConflictError("a run of this drill is in progress: stop it first.")
        if locked.periodic_task is not None:
            locked.periodic_task.delete()
        audit_record(tenant=tenant, actor=actor, action="drill.deleted", obj=locked,
                     before=_drill_snapshot(locked))  # fmt: skip
        locked.delete()


def _drill_snapshot(drill: ChaosDrill) -> dict[str, Any]:
    return {name: getattr(drill, name) for name in DRILL_FIELDS}


def _sync_schedule(drill: ChaosDrill) -> None:
    """The drill's cron entry in django-celery-beat: created, changed or removed with it."""
    from django_celery_beat.models import CrontabSchedule, PeriodicTask

    if not drill.schedule or not drill.is_active:
        if drill.periodic_task is not None:
            task = drill.periodic_task
            drill.periodic_task = None
            drill.save(update_fields=["periodic_task"])
            task.delete()
        return
    minute, hour, day_of_month, month_of_year, day_of_week = drill.schedule.split(" ")
    cron, _ = CrontabSchedule.objects.get_or_create(
        minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year,
        day_of_week=day_of_week, timezone="UTC",
    )  # fmt: skip
    name = f"drill-{drill.pk}"
    task, _ = PeriodicTask.objects.update_or_create(
        name=name,
        defaults={
            "task": "incidents.tasks.start_scheduled_drill",
            "crontab": cron,
            "interval": None,
            "args": json.dumps([drill.pk]),
            "queue": "chaos",
            "enabled": True,
        },
    )
    if drill.periodic_task_id != task.pk:
        drill.periodic_task = task
        drill.save(update_fields=["periodic_task"])


# --- runs -----------------------------------------------------------------------------------


def run_start(
    *, tenant: Tenant, actor: Actor, drill: ChaosDrill, trigger: str = "manual"
) -> DrillRun:
    """A new run, advanced by the chaos queue from the next commit on. One active run per
    deployment: a second is refused (ConflictError)."""
    from incidents.tasks import advance_drill_run

    deployment = drill.deployment
    if deployment.deleted_at is not None:
        raise ConflictError("the deployment was deleted.", field="deployment")
    run = DrillRun(
        tenant=tenant, drill=drill, deployment=deployment, fault=drill.fault, trigger=trigger,
        snapshot=_drill_snapshot(drill),
    )  # fmt: skip
    try:
        with transaction.atomic():
            run.save()
            _event(run, "scheduled", f"{trigger} run of {drill.name} by {actor.label}")
            audit_record(tenant=tenant, actor=actor, action="drill.run_started", obj=run)
            transaction.on_commit(lambda: advance_drill_run.delay(run.pk))
    except IntegrityError as exc:
        raise ConflictError(
            "another drill run is in progress on this deployment.", field="deployment"
        ) from exc
    return run


def run_stop(*, tenant: Tenant, actor: Actor, run: DrillRun) -> DrillRun:
    """Manual stop: the next step reverts and ends the run as aborted."""
    with transaction.atomic():
        locked = DrillRun.objects.select_for_update().get(tenant=tenant, pk=run.pk)
        if not locked.is_active:
            raise ConflictError(f"the run is {locked.status}: nothing to stop.")
        if not locked.stop_requested:
            locked.stop_requested = True
            locked.save(update_fields=["stop_requested"])
            _event(locked, "stop_requested", f"stop requested by {actor.label}")
            audit_record(tenant=tenant, actor=actor, action="drill.run_stopped", obj=locked)
    return locked


def active_run_id(deployment_id: int) -> int | None:
    """The run whose fault is (or may be) in the deployment now: its breaches are drills."""
    return (
        DrillRun.objects.filter(
            deployment_id=deployment_id,
            status__in=[DrillStatus.INJECTING, DrillStatus.OBSERVING, DrillStatus.REVERTING],
        )
        .values_list("pk", flat=True)
        .first()
    )


def runs_to_resume(now: datetime | None = None) -> list[int]:
    """Active runs nobody stepped for RESUME_AFTER_S: their task died with a worker."""
    from django.conf import settings

    now = now or timezone.now()
    after = float(getattr(settings, "DRILL_RESUME_AFTER_S", RESUME_AFTER_S))
    return list(
        DrillRun.objects.filter(
            status__in=ACTIVE_STATUSES, stepped_at__lt=now - timedelta(seconds=after)
        ).values_list("pk", flat=True)
    )


# --- the state machine ----------------------------------------------------------------------


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
        run.stepped_at = _dt(now)
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


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _start(run: DrillRun, now: float) -> float:
    run.started_at = _dt(now)
    run.status = DrillStatus.CHECKING
    _event(run, "checking", "checking the steady state before injecting")
    return 0.0


def _check(run: DrillRun, now: float) -> float | None:
    held, results = steady_state(run, now)
    _event(run, "steady_state", "steady state " + ("holds" if held else "does NOT hold"),
           probes=results)  # fmt: skip
    if run.stop_requested or not held:
        _finish(run, DrillStatus.ABORTED,
                "stopped before injecting" if run.stop_requested
                else "aborted: the steady state did not hold before injecting; nothing "
                "was injected")  # fmt: skip
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
    from serving import deployments

    active = drill_faults.of(run.fault)
    reason = active.precheck(run)
    if reason is None and active.control_side:
        failed: str | None = "aborted: the fault could not go in"
        reason = drill_faults.guarded(run, "inject", lambda: active.inject(run, now), failed)
        if reason is None:
            audit_record(tenant=run.deployment.tenant, actor=_actor(run),
                         action="drill.fault_injected", obj=run,
                         after={"fault": run.fault, **run.snapshot["parameters"]})  # fmt: skip
            run.injected_at = _dt(now)
            run.status = DrillStatus.OBSERVING
            _event(run, "injected", f"{run.fault} injected on the control side (no revision)",
                   parameters=run.snapshot["parameters"])  # fmt: skip
            drill_faults.guarded(run, "injected", lambda: active.injected(run, now), None)
            return STEP_S
    if reason is not None:
        _finish(run, DrillStatus.ABORTED, reason)
        return 0.0
    group = run.snapshot["group"]
    revision = run.deployment.current_revision
    current = dict(revision.faults or {}) if revision is not None else {}
    if current.get(group):
        _finish(run, DrillStatus.ABORTED,
                f"aborted: the {group} slot already has faults {sorted(current[group])}; a "
                "drill injects into a clean slot only")  # fmt: skip
        return 0.0
    entry = fault_entry(run, now)
    try:
        run.fault_revision = deployments.deployment_change(
            tenant=run.deployment.tenant, actor=_actor(run), deployment=run.deployment,
            changes={"faults": {**current, group: entry}},
            reason=f"drill {run.drill.name} (run {run.pk}): inject {run.fault} into {group}",
            action="drill.fault_injected",
        )  # fmt: skip
    except ValidationFailed as exc:
        _finish(run, DrillStatus.ABORTED, f"aborted: the fault was refused: {exc.message}")
        return 0.0
    run.injected_at = _dt(now)
    run.status = DrillStatus.OBSERVING
    _event(run, "injected", f"{run.fault} injected into {group} (revision "
           f"{run.fault_revision.number}); expires at the latest "
           f"{datetime.fromtimestamp(entry['expires_at'], tz=UTC):%H:%M:%S}",
           fault=entry)  # fmt: skip
    drill_faults.guarded(run, "injected", lambda: active.injected(run, now), None)
    return STEP_S


def _observe(run: DrillRun, now: float) -> float:
    held, results = steady_state(run, now)
    _score(run, results)
    if not held and not run.deviated:
        run.deviated = True
        _event(run, "deviated", "the steady state deviated", probes=results)
    _note_detection(run, now)
    reason = _abort_reason(run, now, results)
    if reason is not None:
        _event(run, "aborting", reason)
        run.verdict = reason
        run.status = DrillStatus.REVERTING
        return 0.0
    if run.deviated and run.mitigated_at is None and run.incident is None and held:
        run.mitigated_at = _dt(now)  # recovered by itself (e.g. Serve restarted it)
        _event(run, "recovered", "the steady state holds again without an incident")
    active = drill_faults.of(run.fault)
    broken = drill_faults.guarded(run, "observe", lambda: active.observe(run, now), None)
    if broken is not None:  # the drill saw it itself (a cross-tenant hit): detected at once
        run.deviated = True
        run.detected_at = run.detected_at or _dt(now)
        _event(run, "detected", broken)
        run.status = DrillStatus.REVERTING
        return 0.0
    elapsed = now - run.injected_at.timestamp() if run.injected_at else 0.0
    if elapsed >= int(run.snapshot["duration_s"]):
        run.status = DrillStatus.REVERTING
        _event(run, "duration_over", f"{run.snapshot['duration_s']} s of fault elapsed")
        return 0.0
    return STEP_S


def _revert(run: DrillRun, now: float) -> float | None:
    from serving import deployments

    active = drill_faults.of(run.fault)
    if run.reverted_at is None and active.control_side:
        always = run.snapshot.get("revert") != RevertStrategy.DEVIATED
        if always or run.deviated or not active.lingers:
            message = drill_faults.guarded(
                run, "revert", lambda: active.revert(run, now), "not reverted: left to its TTL"
            )
            audit_record(tenant=run.deployment.tenant, actor=_actor(run),
                         action="drill.fault_reverted", obj=run,
                         after={"fault": run.fault})  # fmt: skip
            _event(run, "reverted", message)
        else:
            _event(run, "left_to_ttl", "the steady state never deviated: the fault is left "
                   "to its TTL (revert: deviated)")  # fmt: skip
        run.reverted_at = _dt(now)
        drill_faults.guarded(run, "wind_down", lambda: active.wind_down(run, now), None)
        return STEP_S
    if run.reverted_at is None:
        group = run.snapshot["group"]
        revision = run.deployment.current_revision
        faults = dict(revision.faults or {}) if revision is not None else {}
        ours = (faults.get(group) or {}).get("drill") == str(run.pk)
        always = run.snapshot.get("revert") != RevertStrategy.DEVIATED
        if ours and (always or run.deviated):
            faults.pop(group)
            run.revert_revision = deployments.deployment_change(
                tenant=run.deployment.tenant, actor=_actor(run), deployment=run.deployment,
                changes={"faults": faults},
                reason=f"drill {run.drill.name} (run {run.pk}): revert {run.fault}",
                action="drill.fault_reverted",
            )  # fmt: skip
            _event(run, "reverted", f"fault removed (revision {run.revert_revision.number})")
        elif ours:
            _event(run, "left_to_ttl", "the steady state never deviated: the fault is left "
                   "to its TTL (revert: deviated)")  # fmt: skip
        else:
            _event(run, "already_gone", "the fault is no longer in the deployment (a rollback "
                   "or another change removed it)")  # fmt: skip
        run.reverted_at = _dt(now)
        drill_faults.guarded(run, "wind_down", lambda: active.wind_down(run, now), None)
        return STEP_S
    drill_faults.guarded(run, "wind_down", lambda: active.wind_down(run, now), None)
    _note_detection(run, now)
    held, results = steady_state(run, now)
    waited = now - run.reverted_at.timestamp()
    if not held and waited < RECOVERY_WAIT_S and not run.stop_requested:
        return STEP_S
    if run.deviated and run.mitigated_at is None and held:
        run.mitigated_at = _dt(now)
    failure = None if run.stop_requested else active.failure(run)
    if run.stop_requested or (run.verdict and run.verdict.startswith("aborted")):
        _finish(run, DrillStatus.ABORTED, run.verdict or "stopped by hand")
    elif failure is not None:
        _finish(run, DrillStatus.FAILED, failure)
    elif not held:
        _finish(
            run,
            DrillStatus.FAILED,
            f"the steady state did not come back within {RECOVERY_WAIT_S} s of the revert",
        )
    elif run.deviated and run.incident is None:
        _finish(run, DrillStatus.FAILED,
                "the steady state deviated but the ops loop opened no incident: the contract "
                "does not catch this fault")  # fmt: skip
    else:
        _finish(
            run,
            DrillStatus.PASSED,
            "detected and recovered" if run.deviated else "the steady state held throughout",
        )
    return None


def _finish(run: DrillRun, status: str, verdict: str) -> None:
    run.status = status
    run.verdict = verdict
    run.finished_at = run.stepped_at  # this step's time
    probes = run.probes or {}
    if probes.get("total"):
        run.resilience_score = round(100.0 * probes["held"] / probes["total"], 1)
    _event(run, status, verdict, mttd_s=run.mttd_s, mttr_s=run.mttr_s,
           resilience_score=run.resilience_score)  # fmt: skip


def _actor(run: DrillRun) -> Actor:
    return Actor(system=f"drill run {run.pk}")


def _note_detection(run: DrillRun, now: float) -> None:
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
            run.detected_at = incident.triggered_at
            _event(run, "detected", f"incident #{incident.pk} opened: {incident.title}",
                   incident=incident.pk)  # fmt: skip
    if run.incident is not None and run.mitigated_at is None:
        run.incident.refresh_from_db(fields=["mitigated_at", "status"])
        if run.incident.mitigated_at is not None:
            run.mitigated_at = run.incident.mitigated_at
            _event(run, "mitigated", f"incident #{run.incident.pk} mitigated")


def _score(run: DrillRun, results: list[dict[str, Any]]) -> None:
    probes = dict(run.probes or {})
    probes["checks"] = int(probes.get("checks", 0)) + 1
    probes["total"] = float(probes.get("total", 0)) + sum(r["weight"] for r in results)
    probes["held"] = float(probes.get("held", 0)) + sum(r["weight"] for r in results if r["held"])
    run.probes = probes


def _abort_reason(run: DrillRun, now: float, results: list[dict[str, Any]]) -> str | None:
    if run.stop_requested:
        return "aborted: stopped by hand"
    conditions = run.snapshot.get("abort_conditions") or {}
    window = measure(run.deployment_id, run.snapshot["group"], now)
    limit = conditions.get("error_rate_above")
    if limit is not None and window["requests"] and window["error_rate"] > limit:
        return f"aborted: error rate {window['error_rate']:.1%} above {limit:.1%}"
    limit = conditions.get("burn_rate_above")
    if limit is not None:
        burns = [a.get("burn_long") or 0 for a in _firing(run.deployment_id, run.snapshot["group"])]
        if burns and max(burns) > limit:
            return f"aborted: burn rate {max(burns):.1f}x above {limit}x"
    return None


# --- steady state ---------------------------------------------------------------------------


def measure(
    deployment_id: int, group: str, now: float, since: float | None = None
) -> dict[str, Any]:
    """The slot's SLIs over the last PROBE_WINDOW_S seconds of stored rows, or since `since`
    when that is earlier (up to CATCH_UP_MAX_S back)."""
    from serving.dataplane.sli import quantile
    from serving.ops_models import Resolution, SliSample
    from serving.sli_store import as_datetime

    window_start = now - PROBE_WINDOW_S
    if since is not None:
        window_start = max(min(window_start, since), now - CATCH_UP_MAX_S)
    rows = SliSample.objects.filter(
        deployment_id=deployment_id, group=group, resolution=Resolution.RAW,
        end__gt=as_datetime(window_start),
    ).values_list("requests", "errors", "latency", "start", "end")  # fmt: skip
    requests = errors = 0
    latency = [0] * 12
    span = 0.0
    for req, err, hist, start, end in rows:
        requests += req
        errors += err
        latency = [a + int(b) for a, b in zip(latency, hist or [0] * 12, strict=False)]
        span += (end - start).total_seconds()
    error_rate = errors / requests if requests else 0.0
    return {
        "requests": requests,
        "error_rate": error_rate,
        "availability": 1.0 - error_rate,
        "latency_p95_ms": quantile(latency, 0.95) if requests else None,
        "rps": requests / span if span else 0.0,
    }


def _firing(deployment_id: int, group: str) -> list[dict[str, Any]]:
    from serving.health import deployment_health

    try:
        info = deployment_health(deployment_id)
    except Exception:  # Redis away: no verdict from the contract this step
        return []
    return list(((info.get("slots") or {}).get(group) or {}).get("firing") or [])


def steady_state(run: DrillRun, now: float) -> tuple[bool, list[dict[str, Any]]]:
    """Does the hypothesis hold? Each probe (and the contract, as one probe) with its value."""
    hypothesis = run.snapshot.get("steady_state") or {}
    group = run.snapshot["group"]
    results: list[dict[str, Any]] = []
    if hypothesis.get("contract", True):
        # What fires now; not an exhausted error budget: that lasts the contract's window (days)
        # after the slot is healthy again, and would fail every later drill of the slot.
        firing = [f for f in _firing(run.deployment_id, group) if f.get("kind") != "budget"]
        results.append({
            "name": "contract", "held": not firing, "weight": 1,
            "value": [f.get("name") for f in firing],
        })  # fmt: skip
    probes = hypothesis.get("probes") or []
    if probes:
        window = measure(run.deployment_id, group, now, run.previous_step_at)
        for probe in probes:
            value = window[probe["sli"]]
            if "max" in probe:
                held = value is None or value <= probe["max"]
            else:
                held = value is not None and window["requests"] > 0 and value >= probe["min"]
            results.append({"name": probe["name"], "held": held, "weight": probe["weight"],
                            "value": value})  # fmt: skip
    return all(r["held"] for r in results), results
