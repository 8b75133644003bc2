"""Health checks: one tick (Celery beat, queue `health`, every 2 s by default) for every live
deployment: a synthetic probe through the Serve proxy with the deployment's probe key, the
SLI counters its replicas published, both stored as SLI windows and evaluated against the
deployment's contract; breaches open incidents and trigger the contract's actions.

A tick costs a fixed number of round trips, whatever the number of deployments: two queries
for the targets and their contracts, one pipelined Redis read, one query for the window
boundaries, one insert batch, one pipelined Redis write. Only breaches and rollout steps
(rare) write more.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max

from portal.exceptions import PortalError
from serving.deployments.models import Deployment, DeploymentRevision, DeploymentStatus
from serving.ops import events
from serving.ops.models import Resolution, SlaContract, SliSample
from serving.ops.sli_store import (
    BOUNDARIES,
    Slot,
    as_datetime,
    counts_of_totals,
    insert_samples,
    replica_delta,
    sample_row,
)
from serving.slo.evaluate import Counts, Evaluation, Firing, evaluate
from serving.slo.model import Contract

logger = logging.getLogger(__name__)

# PENDING and DEPLOYING too: a new revision is on its way, the previous one still serves.
LIVE_STATUSES = (
    DeploymentStatus.RUNNING,
    DeploymentStatus.UNHEALTHY,
    DeploymentStatus.DEPLOYING,
    DeploymentStatus.PENDING,
)
PROBE_STATUSES = (DeploymentStatus.RUNNING, DeploymentStatus.UNHEALTHY)
STALE_S = 5.0  # replicas publish every second; an older value is a stopped replica's
PROBE_BODY = {"prompt": "health probe", "max_tokens": 1, "temperature": 0}


@dataclass
class Target:
    deployment: Deployment
    revision: DeploymentRevision
    contract: Contract | None = None
    contract_version: int | None = None

    @property
    def app(self) -> str:
        return self.deployment.serve_app

    def version(self, group: str) -> str:
        """The label the slot's replicas publish (`<model>:<version label>`)."""
        version = (
            self.revision.canary_version if group == "canary" else self.revision.stable_version
        )
        return f"{version.model.name}:{version.label}" if version is not None else ""

    @property
    def groups(self) -> list[str]:
        if self.revision.pool_id is not None:
            return []  # a shared pool's counters mix tenants: probe only
        return ["stable"] + (["canary"] if self.revision.canary_version_id else [])


@dataclass
class SlotResult:
    delta: Counts
    cumulative: Counts
    windows: dict[int, Counts] = field(default_factory=dict)
    evaluation: Evaluation | None = None
    kv: dict[str, Any] = field(default_factory=dict)
    since: float = 0.0  # when this version started serving in the slot


def health_targets(*, deployment_ids: list[int] | None = None) -> list[Target]:
    """Every live deployment with a revision, and the contract in force for each."""
    query = (
        Deployment.objects.filter(
            deleted_at__isnull=True, current_revision__isnull=False, status__in=LIVE_STATUSES
        )
        .select_related(
            "tenant",
            "current_revision__stable_version__model",
            "current_revision__canary_version__model",
        )
        .defer(  # JSON the tick never reads: decoding it was a tenth of a 1,000-deployment tick
            "current_revision__guard",
            "current_revision__breaker",
            "current_revision__key_hashes",
            "current_revision__stable_version__config_summary",
            "current_revision__stable_version__validation_steps",
            "current_revision__canary_version__config_summary",
            "current_revision__canary_version__validation_steps",
        )
    )
    if deployment_ids is not None:
        query = query.filter(pk__in=deployment_ids)
    targets = {
        d.pk: Target(deployment=d, revision=d.current_revision)
        for d in query
        if d.current_revision is not None
    }
    newest = (
        SlaContract.objects.filter(deployment_id__in=list(targets))
        .values("deployment_id")
        .annotate(version=Max("version"))
        .values("version")
    )
    in_force: dict[int, tuple[int, int]] = {}  # deployment -> (version, contract row)
    for pk, deployment_id, version in SlaContract.objects.filter(
        deployment_id__in=list(targets), version__in=newest
    ).values_list("pk", "deployment_id", "version"):
        if version > in_force.get(deployment_id, (0, 0))[0]:
            in_force[deployment_id] = (version, pk)
    # Contract versions are immutable: parse each once per worker, not once per tick.
    missing = {pk for d, (v, pk) in in_force.items() if (d, v) not in _CONTRACTS}
    if missing:
        for d, v, document in SlaContract.objects.filter(pk__in=missing).values_list(
            "deployment_id", "version", "document"
        ):
            _CONTRACTS[(d, v)] = Contract.from_dict(document)
    used = {(d, v): _CONTRACTS[(d, v)] for d, (v, _) in in_force.items()}
    _CONTRACTS.clear()
    _CONTRACTS.update(used)
    for deployment_id, (version, _) in in_force.items():
        targets[deployment_id].contract = used[(deployment_id, version)]
        targets[deployment_id].contract_version = version
    return list(targets.values())


_CONTRACTS: dict[tuple[int, int], Contract] = {}  # (deployment, version) -> parsed contract


def clear_caches() -> None:
    """Forget what the worker keeps between ticks (parsed contracts, long-window boundaries):
    for tests, whose new databases hand out the same ids again."""
    _CONTRACTS.clear()
    BOUNDARIES.clear()


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


def _keys() -> dict[str, str]:
    prefix = settings.SLI_KEY_PREFIX
    return {
        "state": f"{prefix}:health:state",
        "deployments": f"{prefix}:health:deployments",
        "features": f"{prefix}:health:features",
        "lock": f"{prefix}:health:tick-lock",
        "sli": f"{prefix}:sli",
    }


async def _probe_all(urls: Mapping[int, tuple[str, str]], timeout_s: float) -> dict[int, Any]:
    # aiohttp rather than httpx here: at 1,000 probes a tick httpx's per-request overhead was
    # 4 ms a deployment (bench/health_tick.py), aiohttp's a tenth of that.
    import aiohttp

    results: dict[int, Any] = {}
    limit = asyncio.Semaphore(64)
    connector = aiohttp.TCPConnector(limit=64)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(deployment_id: int, url: str, key: str) -> None:
            status: int | None = None
            async with limit:  # the probe's time starts when its turn comes
                started = time.perf_counter()
                try:
                    async with session.post(
                        url, json=PROBE_BODY,
                        # Pinned to stable: the probe's result is the stable slot's (a canary
                        # has its own SLIs and analysis; a probe landing there would blame
                        # stable for the canary's faults).
                        headers={"authorization": f"Bearer {key}", "x-portal-probe": "1",
                                 "x-ab-group": "stable"},
                    ) as response:  # fmt: skip
                        await response.read()
                        status = response.status
                except (aiohttp.ClientError, TimeoutError):
                    status = None
                elapsed = (time.perf_counter() - started) * 1000
            results[deployment_id] = (status is not None and status < 400, elapsed, status)

        await asyncio.gather(*(one(d, url, key) for d, (url, key) in urls.items()))
    return results


def probe(targets: list[Target], serve_url: str, timeout_s: float = 5.0) -> dict[int, Any]:
    """POST a one-token completion through the Serve proxy for each deployment, concurrently;
    (ok, ms, status) per deployment id, status None when no answer came."""
    from serving.deployments.keys import probe_key

    urls = {
        t.deployment.pk: (
            f"{serve_url.rstrip('/')}/{t.deployment.tenant.slug}/{t.deployment.name}"
            "/v1/completions",
            probe_key(t.deployment.pk),
        )
        for t in targets
    }
    return asyncio.run(_probe_all(urls, timeout_s)) if urls else {}


def _kv_summary(replicas: list[dict[str, Any]], tenant_id: str, gone: int) -> dict[str, Any]:
    total = sum(int(r.get("kv", {}).get("num_blocks", 0)) for r in replicas)
    free = sum(int(r.get("kv", {}).get("free_blocks", 0)) for r in replicas)
    mine = [r.get("kv", {}).get("tenants", {}).get(tenant_id, {}) for r in replicas]
    return {
        "blocks_total": total,
        "blocks_used": total - free,
        "preemptions": sum(int(m.get("preemptions", 0)) for m in mine),
        "evictions": sum(int(m.get("evictions", 0)) for m in mine),
        "fragmentation": max(
            (float(r.get("kv", {}).get("fragmentation", 0)) for r in replicas), default=0.0
        ),  # fmt: skip
        "replicas": len(replicas),
        "replica_restarts": gone,
    }


def _loads(raw: Any) -> Any:
    return json.loads(raw) if raw else None


def tick(
    *,
    now: float | None = None,
    redis_client: Any = None,
    serve_url: str | None = None,
    act: bool = True,
    deployment_ids: list[int] | None = None,
) -> dict[str, Any]:
    """One health tick over every live deployment that is due (its `health_interval_s`)."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    r = redis_client or _redis()
    keys = _keys()
    token = secrets.token_hex(8)
    if not r.set(keys["lock"], token, nx=True, px=30_000):
        return {"skipped": "another tick is running"}
    try:
        report = _tick(now, r, keys, serve_url, act, deployment_ids)
    finally:
        if r.get(keys["lock"]) == token.encode():
            r.delete(keys["lock"])
    report["duration_ms"] = round((time.perf_counter() - started) * 1000, 2)
    return report


def _tick(
    now: float,
    r: Any,
    keys: dict[str, str],
    serve_url: str | None,
    act: bool,
    deployment_ids: list[int] | None,
) -> dict[str, Any]:
    targets = health_targets(deployment_ids=deployment_ids)
    slots: list[tuple[Target, str]] = [(t, g) for t in targets for g in t.groups]
    ids = [str(t.deployment.pk) for t in targets]
    # Both slots of every target: a canary that left keeps its replicas' baselines.
    slot_fields = [f"{t.deployment.pk}:{g}" for t in targets for g in ("stable", "canary")]
    with r.pipeline(transaction=False) as pipe:
        for target, group in slots:
            pipe.hgetall(f"{keys['sli']}:{target.app}:{group}")
        pipe.hmget(keys["state"], slot_fields or ["-"])
        pipe.hmget(keys["deployments"], ids or ["-"])
        pipe.hmget(keys["features"], ids or ["-"])
        read = pipe.execute()
    published, infos = read[: len(slots)], read[-2]
    states = dict(zip(slot_fields, read[-3], strict=False))
    features = {
        t.deployment.pk: _loads(raw) or {} for t, raw in zip(targets, read[-1], strict=False)
    }
    info = {t.deployment.pk: (_loads(raw) or {}) for t, raw in zip(targets, infos, strict=False)}
    due = [
        t for t in targets
        if now - float(info[t.deployment.pk].get("checked_at", 0))
        >= t.deployment.health_interval_s - 0.25
    ]  # fmt: skip
    due_ids = {t.deployment.pk for t in due}
    wall = time.time()  # staleness is judged at the read, not after the probes took their time
    probes: dict[int, Any] = {}
    if serve_url:
        to_probe = [t for t in due if t.deployment.status in PROBE_STATUSES]
        probes = probe(to_probe, serve_url, timeout_s=min(5.0, settings.HEALTH_PROBE_TIMEOUT_S))

    results: dict[Slot, SlotResult] = {}
    new_states: dict[str, str] = {}
    rows: list[SliSample] = []
    for (target, group), replicas_raw in zip(slots, published, strict=False):
        state_raw = states.get(f"{target.deployment.pk}:{group}")
        dep = target.deployment
        if dep.pk not in due_ids:
            continue
        state = _loads(state_raw) or {}
        seen = state.get("replicas", {})
        version = target.version(group)
        # A new episode (another version, or a canary that came back): its windows start at 0,
        # and replicas already seen count only what they serve from now on.
        fresh = state.get("version") != version or "since" not in state or state.get("ended")
        if fresh:
            state.pop("minute", None)
            state["since"] = now
        cumulative = Counts.from_dict(state["cum"]) if state.get("cum") and not fresh else Counts()
        delta = Counts()
        # A stopped replica's last value lingers in the hash while others refresh its TTL: it is
        # not counted, but its baseline stays while its value does.
        published_now = [json.loads(v) for v in replicas_raw.values()]
        replicas = [
            snapshot
            for snapshot in published_now
            if wall - float(snapshot.get("window", {}).get("end", wall)) <= STALE_S
        ]
        now_seen: dict[str, Any] = {
            str(snapshot.get("replica")): seen[str(snapshot.get("replica"))]
            for snapshot in published_now
            if snapshot not in replicas and str(snapshot.get("replica")) in seen
        }
        for replica in replicas:
            totals = counts_of_totals(replica.get("totals") or {})
            before = seen.get(replica["replica"])
            if replica.get("version") != version:
                # Still the previous version's replica (going away, or mid hot-reload): its
                # counts are not this version's; keep its baseline for when it switches.
                if before is not None:
                    now_seen[replica["replica"]] = before
                continue
            if not (fresh and before is not None):  # a known replica joins a new episode at 0
                delta = delta + replica_delta(totals, Counts.from_dict(before) if before else None)
            now_seen[replica["replica"]] = totals.to_dict()
        replicas = [r for r in replicas if r.get("version") == version]
        gone = len(set(seen) - set(now_seen)) if seen else 0
        ok, ms, status = probes.get(dep.pk, (None, None, None))
        if group == "stable" and ok is False and status != 502:
            delta.requests += 1  # the version never saw it: count the failure here
            delta.errors += 1
        last_at = float(state.get("at", now - dep.health_interval_s))
        delta.seconds = max(0.0, now - last_at)
        cumulative = cumulative + delta
        kv = _kv_summary(replicas, str(dep.tenant_id), gone)
        slot: Slot = (dep.pk, group)
        rows.append(sample_row(
            tenant_id=dep.tenant_id, slot=slot, version=version, resolution=Resolution.RAW,
            start=last_at, end=now, delta=delta, cumulative=cumulative,
            probe=(ok, ms) if group == "stable" else (None, None), kv=kv,
        ))  # fmt: skip
        minute = state.get("minute") or {"start": now - now % 60, "counts": {}}
        minute_counts = Counts.from_dict(minute["counts"]) if minute["counts"] else Counts()
        if int(now // 60) > int(float(minute["start"]) // 60):
            rows.append(sample_row(
                tenant_id=dep.tenant_id, slot=slot, version=version,
                resolution=Resolution.MINUTE, start=float(minute["start"]),
                end=float(minute["start"]) + 60, delta=minute_counts,
                cumulative=cumulative - delta, kv=kv,
            ))  # fmt: skip
            minute = {"start": now - now % 60, "counts": delta.to_dict()}
        else:
            minute = {"start": minute["start"], "counts": (minute_counts + delta).to_dict()}
        new_states[f"{dep.pk}:{group}"] = json.dumps(
            {"at": now, "version": version, "since": state["since"], "cum": cumulative.to_dict(),
             "replicas": now_seen, "minute": minute},
            separators=(",", ":"),
        )  # fmt: skip
        results[slot] = SlotResult(
            delta=delta, cumulative=cumulative, kv=kv, since=float(state["since"])
        )

    _evaluate(now, targets, results, features)
    streaks = _probe_streaks(due, probes, info, results)
    detected = time.time()  # a breach is known from here on (the tick's reads took time)
    new_infos: dict[str, str] = {}
    for target in due:
        dep = target.deployment
        ok, ms, status = probes.get(dep.pk, (None, None, None))
        failures = streaks[dep.pk]
        new_infos[str(dep.pk)] = json.dumps({
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
        }, separators=(",", ":"))  # fmt: skip
    insert_samples(rows)
    # A canary that left ends its episode (one that comes back starts from zero) but keeps its
    # replicas' baselines: a lingering old replica's counts never land in the next episode.
    for target in due:
        field_name = f"{target.deployment.pk}:canary"
        old = _loads(states.get(field_name))
        if "canary" not in target.groups and old and not old.get("ended"):
            new_states[field_name] = json.dumps(
                {"ended": True, "replicas": old.get("replicas", {})}, separators=(",", ":")
            )
    with r.pipeline(transaction=False) as pipe:
        if new_states:
            pipe.hset(keys["state"], mapping=new_states)
        if new_infos:
            pipe.hset(keys["deployments"], mapping=new_infos)
        pipe.execute()
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
        _resume_stuck_rollbacks(r, keys)
    return {
        "deployments": len(targets),
        "due": len(due),
        "slots": len(results),
        "rows": len(rows),
        "probes": len(probes),
        "firing": sum(len(a) for a in firing.values()),
        "actions": actions,
    }


def _probe_streaks(
    due: list[Target],
    probes: Mapping[int, Any],
    info: Mapping[int, dict[str, Any]],
    results: dict[Slot, SlotResult],
) -> dict[int, int]:
    """Failed probes in a row per deployment. From HEALTH_PROBE_ALERT_AFTER in a row the stable
    slot fires a `probe` alert (notify; a page from three times that): the contract's SLIs come
    from the replicas, and they never see the requests the proxy holds while Serve replaces a
    crashed or hung replica; the probe, timed from outside, does (issue 6: replica_crash)."""
    after = int(settings.HEALTH_PROBE_ALERT_AFTER)
    streaks: dict[int, int] = {}
    for target in due:
        dep = target.deployment
        ok, ms, status = probes.get(dep.pk, (None, None, None))
        failures = int(info[dep.pk].get("probe_failures", 0))
        failures = 0 if ok else failures + (1 if ok is False else 0)
        streaks[dep.pk] = failures
        result = results.get((dep.pk, "stable"))
        if ok is not False or not after or failures < after or result is None:
            continue
        if result.evaluation is None:  # no contract: nobody asked for incidents
            continue
        answer = f"HTTP {status}" if status else f"no answer within {ms / 1000:.1f} s"
        result.evaluation.firing.append(Firing(
            "probe", "health-probe", "page" if failures >= 3 * after else "ticket", "notify",
            f"the health probe failed {failures} time{'s' if failures > 1 else ''} in a row "
            f"({answer})", value=float(failures),
        ))  # fmt: skip
    return streaks


def _evaluate(
    now: float,
    targets: list[Target],
    results: dict[Slot, SlotResult],
    features: Mapping[int, dict[str, Any]],
) -> None:
    lengths: set[int] = set()
    for target in targets:
        if target.contract is not None:
            lengths.update(target.contract.window_lengths())
    by_id = {t.deployment.pk: t for t in targets}
    episodes = {slot: (by_id[slot[0]].version(slot[1]), r.since) for slot, r in results.items()}
    boundaries = BOUNDARIES.lookup(episodes, {w: now - w for w in lengths})
    for slot, result in results.items():
        contract = by_id[slot[0]].contract
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
        }
        result.evaluation = evaluate(contract, result.windows, observations=observations)


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


def deployment_health(deployment_id: int, redis_client: Any = None) -> dict[str, Any]:
    """What the last tick found for one deployment (pages, API)."""
    if redis_client is None and not settings.REDIS_URL:
        return {}  # embedded mode: no health checks (they need Redis)
    r = redis_client or _redis()
    raw = r.hget(_keys()["deployments"], str(deployment_id))
    return _loads(raw) or {}
