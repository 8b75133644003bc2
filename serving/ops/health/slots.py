"""The body of one health tick: per-slot deltas of the replicas' published counters, episodes
(a version's time in a slot), the minute roll-up, the stored rows and state, then evaluation
against the contract and the actions (alerts, rollout steps, last good revision, rollbacks)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.db import transaction

from portal.exceptions import PortalError
from serving.dataplane.sli import stopped_key
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import events
from serving.ops.health import series as series_cache
from serving.ops.health import signals as slot_signals
from serving.ops.health.evaluation import evaluate_slots
from serving.ops.health.kv_integrity import alert_kv_integrity
from serving.ops.health.lease import shard_lock_key
from serving.ops.health.probe import probe, probe_streaks
from serving.ops.health.reloads import alert_failed_reloads
from serving.ops.health.replicas import account_replicas
from serving.ops.health.state import checked_value, last_checks, loads
from serving.ops.health.targets import (
    PROBE_STATUSES,
    STALE_S,
    SlotResult,
    Target,
    boundaries,
    health_targets,
)
from serving.ops.health.tier_sla import tier_contracts
from serving.ops.models import Resolution, SliSample
from serving.ops.sli_store import (
    Slot,
    as_datetime,
    insert_samples,
    sample_row,
)
from serving.slo.evaluate import Counts

logger = logging.getLogger(__name__)


def tick_slots(
    now: float,
    r: Any,
    keys: dict[str, str],
    serve_url: str | None,
    act: bool,
    deployment_ids: list[int] | None,
    shard: tuple[int, int] = (0, 1),
    held: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """One tick's work over the targets (of one shard), under the lease `tick()` holds.
    `held()` says, before anything is written, whether that lease is still this tick's: a
    process that stalled past it (another worker took the shard over) writes nothing."""
    targets = health_targets(deployment_ids=deployment_ids, shard=shard)
    slots: list[tuple[Target, str]] = [(t, g) for t in targets for g in t.groups]
    ids = [str(t.deployment.pk) for t in targets]
    # Both slots of every target: a canary that left keeps its replicas' baselines.
    slot_fields = [f"{t.deployment.pk}:{g}" for t in targets for g in ("stable", "canary")]
    slot_names = [f"{t.deployment.pk}:{g}" for t, g in slots]
    with r.pipeline(transaction=False) as pipe:
        for target, group in slots:
            pipe.hgetall(f"{keys['sli']}:{target.app}:{group}")
        for target in targets:
            pipe.hgetall(f"{keys['router']}:{target.app}")
        for target, group in slots:
            pipe.hgetall(stopped_key(settings.SLI_KEY_PREFIX, target.app, group))
        series_cache.queue_read(pipe, keys["signals"], now, slot_names)
        pipe.hmget(keys["consistency"], slot_names or ["-"])
        pipe.hgetall(keys["gpu_latest"])
        pipe.hmget(keys["state"], slot_fields or ["-"])
        pipe.hmget(keys["checked"], ids or ["-"])
        pipe.hmget(keys["features"], ids or ["-"])
        read = pipe.execute()
    published, infos = read[: len(slots)], read[-2]
    # What the slots' replicas published, raw, then decoded once measured (kv_integrity's too).
    decoded: dict[tuple[str, str], Any] = {
        (t.app, g): raw for (t, g), raw in zip(slots, published, strict=True)
    }
    routers_raw = read[len(slots) : len(slots) + len(targets)]
    stopped_raw = read[len(slots) + len(targets) : 2 * len(slots) + len(targets)]
    signal_reads = series_cache.parse_read(read[-6], slot_names)
    consistency = dict(zip(slot_names, read[-5], strict=False))
    states = dict(zip(slot_fields, read[-3], strict=False))
    features = {
        t.deployment.pk: loads(raw) or {} for t, raw in zip(targets, read[-1], strict=False)
    }
    info = last_checks(r, keys, ids, infos)
    due = [
        t
        for t in targets
        if now - float(info[t.deployment.pk].get("checked_at", 0)) >= t.interval_s - 0.25
    ]
    due_ids = {t.deployment.pk for t in due}
    wall = time.time()  # staleness is judged at the read, not after the probes took their time
    probes: dict[int, Any] = {}
    if serve_url:
        to_probe = [t for t in due if t.deployment.status in PROBE_STATUSES]
        probes = probe(to_probe, serve_url, timeout_s=min(5.0, settings.HEALTH_PROBE_TIMEOUT_S))

    gpu = slot_signals.decode_all(read[-4], wall - slot_signals.GPU_FRESH_S, "at")
    routers = {
        t.deployment.pk: slot_signals.decode_all(raw, wall - STALE_S, "at")
        for t, raw in zip(targets, routers_raw, strict=False)
    }
    observed: dict[Slot, dict[str, Any]] = {}
    new_signal_states: dict[str, str] = {}
    new_points: dict[str, str] = {}
    results: dict[Slot, SlotResult] = {}
    new_states: dict[str, str] = {}
    rows: list[SliSample] = []
    forgotten: list[tuple[str, list[str]]] = []  # (a slot's SLI hash, dead replicas' fields)
    for (target, group), replicas_raw, stopped_now in zip(
        slots, published, stopped_raw, strict=False
    ):
        state_raw = states.get(f"{target.deployment.pk}:{group}")
        dep = target.deployment
        if dep.pk not in due_ids:
            continue
        state = loads(state_raw) or {}
        seen = state.get("replicas", {})
        version = target.version(group)
        # A new episode (another version, or a canary that came back): its windows start at 0,
        # and replicas already seen count only what they serve from now on.
        fresh = state.get("version") != version or "since" not in state or state.get("ended")
        if fresh:
            state.pop("minute", None)
            state["since"] = now
        cumulative = Counts.from_dict(state["cum"]) if state.get("cum") and not fresh else Counts()
        last_at = float(state.get("at", now - target.interval_s))
        slot_replicas = account_replicas(
            seen=seen,
            published_raw=replicas_raw,
            stopped_raw=stopped_now,
            version=version,
            fresh=bool(fresh),
            wall=wall,
            now=now,
            last_at=last_at,
            lost=state.get("lost"),
        )
        decoded[(target.app, group)] = slot_replicas.published
        if slot_replicas.forget:
            forgotten.append((f"{keys['sli']}:{target.app}:{group}", slot_replicas.forget))
        delta = slot_replicas.delta
        ok, ms, status = probes.get(dep.pk, (None, None, None))
        if group == "stable" and ok is False and status != 502:
            delta.requests += 1  # the version never saw it: count the failure here
            delta.errors += 1
        delta.seconds = max(0.0, now - last_at)
        name = f"{dep.pk}:{group}"
        # Every fresh replica of the slot, one left on other weights included: it must show.
        signal_state, series = signal_reads.get(name, (None, None))
        observed[(dep.pk, group)], new_signal_states[name], point = slot_signals.slot_signals(
            now=now,
            dep_id=dep.pk,
            tenant_id=dep.tenant_id,
            group=group,
            version=version,
            replicas=slot_replicas.fresh,
            delta=delta,
            routers=routers.get(dep.pk, []),
            gpu=gpu,
            consistency=slot_signals.consistency_of(consistency.get(name)),
            reported=features.get(dep.pk, {}),
            critical=target.contract.critical if target.contract is not None else None,
            state=signal_state,
            series=series,
            objectives=series_cache.wanted(target.contract),
            interval_s=target.interval_s,
        )
        if point is not None:
            new_points[name] = point
        cumulative = cumulative + delta
        kv = slot_signals.kv_summary(slot_replicas.serving, str(dep.tenant_id), slot_replicas.gone)
        slot: Slot = (dep.pk, group)
        rows.append(
            sample_row(
                tenant_id=dep.tenant_id,
                slot=slot,
                version=version,
                resolution=Resolution.RAW,
                start=last_at,
                end=now,
                delta=delta,
                cumulative=cumulative,
                probe=(ok, ms) if group == "stable" else (None, None),
                kv=kv,
            )
        )
        minute = state.get("minute") or {"start": now - now % 60, "counts": {}}
        minute_counts = Counts.from_dict(minute["counts"]) if minute["counts"] else Counts()
        if int(now // 60) > int(float(minute["start"]) // 60):
            rows.append(
                sample_row(
                    tenant_id=dep.tenant_id,
                    slot=slot,
                    version=version,
                    resolution=Resolution.MINUTE,
                    start=float(minute["start"]),
                    end=float(minute["start"]) + 60,
                    delta=minute_counts,
                    cumulative=cumulative - delta,
                    kv=kv,
                )
            )
            minute = {"start": now - now % 60, "counts": delta.to_dict()}
        else:
            minute = {"start": minute["start"], "counts": (minute_counts + delta).to_dict()}
        new_states[f"{dep.pk}:{group}"] = json.dumps(
            {
                "at": now,
                "version": version,
                "since": state["since"],
                "cum": cumulative.to_dict(),
                "replicas": slot_replicas.baselines,
                "lost": slot_replicas.lost,
                "minute": minute,
            },
            separators=(",", ":"),
        )
        results[slot] = SlotResult(
            delta=delta, cumulative=cumulative, kv=kv, since=float(state["since"])
        )

    evaluate_slots(
        now,
        targets,
        results,
        features,
        observed,
        tier_contracts(targets, routers),
        cache=boundaries(shard),
    )
    streaks = probe_streaks(due, probes, info, results)
    detected = time.time()  # a breach is known from here on (the tick's reads took time)
    new_infos: dict[str, str] = {}
    new_checks: dict[str, str] = {}
    for target in due:
        dep = target.deployment
        ok, ms, status = probes.get(dep.pk, (None, None, None))
        failures = streaks[dep.pk]
        new_checks[str(dep.pk)] = checked_value(now, failures)
        new_infos[str(dep.pk)] = json.dumps(
            {
                "checked_at": now,
                "contract_version": target.contract_version,
                "probe": {"ok": ok, "ms": None if ms is None else round(ms, 2), "status": status},
                "probe_failures": failures,
                "revision": target.revision.number,
                "slots": {
                    g: results[(dep.pk, g)].evaluation.to_dict()  # type: ignore[union-attr]
                    for g in target.groups
                    if results.get((dep.pk, g)) and results[(dep.pk, g)].evaluation is not None
                },
                "kv": {g: results[(dep.pk, g)].kv for g in target.groups if (dep.pk, g) in results},
                "signals": {
                    g: slot_signals.summary(observed[(dep.pk, g)])
                    for g in target.groups
                    if (dep.pk, g) in observed
                },
            },
            separators=(",", ":"),
        )
    if held is not None and not held():
        logger.warning("health tick %s lost its lease mid-way: its findings are dropped", shard)
        counts = {"deployments": len(targets), "due": len(due), "probes": len(probes)}
        return {**counts, "slots": 0, "rows": 0, "firing": 0, "actions": [], "lost": True}
    insert_samples(rows)
    # A canary that left ends its episode (one that comes back starts from zero) but keeps its
    # replicas' baselines: a lingering old replica's counts never land in the next episode.
    for target in due:
        field_name = f"{target.deployment.pk}:canary"
        old = loads(states.get(field_name))
        if "canary" not in target.groups and old and not old.get("ended"):
            new_states[field_name] = json.dumps(
                {"ended": True, "replicas": old.get("replicas", {})}, separators=(",", ":")
            )
    with r.pipeline(transaction=False) as pipe:
        for key, fields in forgotten:
            pipe.hdel(key, *fields)
        if new_states:
            pipe.hset(keys["state"], mapping=new_states)
        if new_infos:
            pipe.hset(keys["deployments"], mapping=new_infos)
            pipe.hset(keys["checked"], mapping=new_checks)
        series_cache.queue_write(
            pipe, keys, new_signal_states, new_points, deployment_ids, shard_key(keys, shard)
        )
        written = pipe.execute()  # empty when nothing was due in a tick of given deployments
        pruning = deployment_ids is None and bool(written) and written[-1] is True
    if pruning:  # the shard's slots no longer targets leave their signals (once a minute)
        series_cache.prune(r, keys["signals"], set(slot_names), shard)
    firing = {
        slot: result.evaluation.firing
        for slot, result in results.items()
        if result.evaluation is not None and result.evaluation.firing
    }
    actions: list[dict[str, Any]] = []
    if act:
        by_id = {t.deployment.pk: t for t in targets}
        for (dep_id, group), alerts in firing.items():
            actions += _act(by_id[dep_id], group, alerts, detected)
        # Only deployments measured this tick: an analysis never reads stale counters.
        due_by_id = {pk: t for pk, t in by_id.items() if pk in due_ids}
        actions += _advance_rollouts(now, due_by_id, results)
        _mark_good(now, targets, firing)
        if shard[0] == 0:  # the fleet-wide chores: once a tick, by the first shard's tick
            _resume_stuck_rollbacks(r, keys)
            from serving.ops.remediation.services import remediation_resume

            remediation_resume(r=r, lock_key=keys["lock"])  # ended waits, runs a dead worker left
        actions += alert_failed_reloads(r, keys, due, detected, decoded)
        # A replica's broken KV pool: an incident, once (serving.ops.health.kv_integrity).
        live = [(t.deployment, t.revision) for t in targets]
        actions += alert_kv_integrity(r, keys, time.time(), live=live, published=decoded)
    return {
        "deployments": len(targets),
        "due": len(due),
        "slots": len(results),
        "rows": len(rows),
        "probes": len(probes),
        "firing": sum(len(a) for a in firing.values()),
        "actions": actions,
    }


def shard_key(keys: dict[str, str], shard: tuple[int, int]) -> str:
    """The shard's own prefix for its once-a-minute claims (its lease's key)."""
    return shard_lock_key(keys["lock"], *shard)


def _act(target: Target, group: str, alerts: list[Any], now: float) -> list[dict[str, Any]]:
    """Tell the listeners (incidents) which alerts fire on this slot; they act on them."""
    event = events.SlotAlerts(
        deployment=target.deployment,
        revision=target.revision,
        contract_version=target.contract_version,
        group="canary" if group == "canary" else "stable",
        alerts=alerts,
        detected_at=as_datetime(now),
    )
    try:
        return events.alerts_fired(event)
    except PortalError as exc:
        logger.warning("breach on %s/%s not acted on: %s", target.app, group, exc.message)
        return [{"deployment": target.deployment.pk, "group": group, "error": exc.message}]


def _advance_rollouts(
    now: float, by_id: dict[int, Target], results: dict[Slot, SlotResult]
) -> list[dict[str, Any]]:
    from serving.ops.rollouts import rollouts_advance

    return rollouts_advance(now=now, targets=by_id, results=results)


def _mark_good(now: float, targets: list[Target], firing: Mapping[Slot, Any]) -> None:
    """A revision that has served without a canary and without a breach for
    HEALTH_GOOD_AFTER_S becomes the deployment's last good revision (written on change only)."""
    from datetime import timedelta

    from django.utils import timezone

    good_after = timedelta(seconds=settings.HEALTH_GOOD_AFTER_S)
    for target in targets:
        dep, revision = target.deployment, target.revision
        if (
            dep.status == DeploymentStatus.RUNNING
            and revision.canary_version_id is None
            and revision.converged_at is not None
            and timezone.now() - revision.converged_at >= good_after
            and dep.last_good_revision_id != revision.pk
            and not any(slot[0] == dep.pk for slot in firing)
        ):
            with transaction.atomic():
                Deployment.objects.filter(pk=dep.pk).update(last_good_revision=revision)


def _resume_stuck_rollbacks(r: Any, keys: dict[str, str]) -> None:
    from serving.ops.rollbacks import rollbacks_stuck
    from serving.ops.tasks import execute_rollback

    every = max(1, int(settings.ROLLBACK_RESUME_AFTER_S))
    for rollback_id in rollbacks_stuck(older_than_s=settings.ROLLBACK_RESUME_AFTER_S):
        if r.set(f"{keys['lock']}:resume:{rollback_id}", 1, nx=True, ex=every):
            execute_rollback.delay(rollback_id)
