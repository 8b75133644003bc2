"""The KV cache integrity health item (seed 000 §4.1): what the deployment's version replicas
last published of their block pool's integrity scan (`kv.integrity`, serving.dataplane.kv_checks:
refcounts, owners, salts, free list), read live from their SLI windows, per slot.

A slot is `bad` while a fresh replica reports a violation now or has reported one since it
started (an invariant broken once is not healed by a later clean pass: its blocks may have been
served), `ok` when every fresh replica scans clean, `not_applicable` on vLLM (no block pool of
ours) and `no_data` while no replica publishes. A shared pool's item is the pool's: violations
name the deployment's own tenant only, another tenant's blocks are "another tenant"."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from serving.control import names
from serving.deployments.models import Deployment, DeploymentRevision
from serving.ops import events
from serving.ops.health.state import (
    health_keys,
    health_redis,
    published_snapshots,
    slot_hashes,
)
from serving.ops.health.targets import LIVE_STATUSES, STALE_S, in_shard
from serving.ops.sli_store import as_datetime

MAX_SAMPLES = 5


def _slots(deployment: Deployment, revision: DeploymentRevision) -> list[tuple[str, str, str]]:
    """(label, app, group) of every slot whose replicas publish."""
    if revision.pool_id is not None and revision.pool is not None:
        return [("pool", names.pool_app(revision.pool.name), "pool")]
    groups = ["stable"] + (["canary"] if revision.canary_version_id else [])
    groups += [str(level["name"]) for level in (revision.tiers or {}).get("levels") or []]
    return [(g, deployment.serve_app, g) for g in groups]


def _sample(raw: dict[str, Any], tenant_id: str) -> dict[str, Any]:
    tenant = raw.get("tenant")
    return {
        "kind": str(raw.get("kind", "")),
        "block": raw.get("block"),
        "whose": "yours" if tenant == tenant_id else ("another tenant" if tenant else "none"),
        "detail": str(raw.get("detail", ""))[:200] if tenant in (None, tenant_id) else "",
    }


def slot_integrity(
    replicas: list[dict[str, Any]], tenant_id: str, now: float | None = None
) -> dict[str, Any]:
    """One slot's item from its replicas' published snapshots (stale ones left out)."""
    now = time.time() if now is None else now
    fresh = [r for r in replicas if now - float((r.get("window") or {}).get("end", 0)) <= STALE_S]
    reports: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for replica in fresh:
        integrity = (replica.get("kv") or {}).get("integrity")
        if isinstance(integrity, dict):
            reports.append((replica, integrity))
    if not reports:
        return {"state": "no_data", "replicas": len(fresh)}
    applying = [(r, i) for r, i in reports if i.get("applies")]
    if not applying:
        return {"state": "not_applicable", "replicas": len(fresh), "reason": "vLLM"}
    now_bad = sum(int(i.get("violations", 0)) for _, i in applying)
    ever = sum(int(i.get("violations_total", 0)) for _, i in applying)
    counts: dict[str, int] = {}
    samples: list[dict[str, Any]] = []
    bad_replicas = []
    for replica, item in applying:
        if not int(item.get("violations_total", 0)):
            continue
        bad_replicas.append(str(replica.get("replica", "?")))
        shown = item if int(item.get("violations", 0)) else (item.get("last_bad") or {})
        for kind, n in (shown.get("counts") or {}).items():
            counts[kind] = counts.get(kind, 0) + int(n)
        for raw in shown.get("samples") or []:
            if len(samples) < MAX_SAMPLES and isinstance(raw, dict):
                samples.append(_sample(raw, tenant_id))
    return {
        "state": "bad" if ever else "ok",
        "replicas": len(fresh),
        "violations_now": now_bad,
        "violations_total": ever,
        "counts": {k: v for k, v in sorted(counts.items()) if v},
        "samples": samples,
        "bad_replicas": bad_replicas,
        "checked": sum(int(i.get("checked", 0)) for _, i in applying),
        "passes": sum(int(i.get("passes", 0)) for _, i in applying),
        "scan_ms": max(float(i.get("ms", 0)) for _, i in applying),
    }


def kv_integrity_item(deployment: Deployment, redis_client: Any = None) -> dict[str, Any]:
    """The deployment's health item: one entry per slot, and the worst state of them."""
    revision = deployment.current_revision
    try:
        slots = _slots(deployment, revision) if revision is not None else []
    except names.BadName:  # never compiled: nothing of it publishes
        slots = []
    if not slots:
        return {"state": "no_data", "slots": []}
    r = redis_client or health_redis()
    sli = health_keys()["sli"]
    with r.pipeline(transaction=False) as pipe:
        for _, app, group in slots:
            pipe.hgetall(f"{sli}:{app}:{group}")
        read = pipe.execute()
    out = []
    now = time.time()
    for (label, _, _), published in zip(slots, read, strict=True):
        replicas = []
        for raw in published.values():
            try:
                replicas.append(json.loads(raw))
            except ValueError:
                continue
        out.append({"slot": label, **slot_integrity(replicas, str(deployment.tenant_id), now)})
    order = ["bad", "ok", "not_applicable", "no_data"]
    states = [s["state"] for s in out] or ["no_data"]
    return {"state": min(states, key=order.index), "slots": out}


TOLD_TTL_S = 7 * 86400  # a replica publishes its scan while it lives
FIELDS = (  # what the alert reads of a deployment: its app name and slots
    "pk",
    "name",
    "status",
    "tenant_id",
    "tenant__slug",
    "current_revision_id",
    "current_revision__tiers",
    "current_revision__canary_version_id",
    "current_revision__pool_id",
)


def alert_kv_integrity(
    r: Any,
    keys: dict[str, str],
    now: float,
    deployment_ids: list[int] | None = None,
    shard: tuple[int, int] = (0, 1),
    *,
    live: list[tuple[Deployment, DeploymentRevision]] | None = None,
    published: Mapping[tuple[str, str], Any] | None = None,
) -> list[dict[str, Any]]:
    """Tell the listeners (incidents) of each dedicated slot's replica whose pool broke an
    invariant, once per replica (a Redis memo spares the listener's own check at later
    ticks). One query and one pipelined read per tick, or neither when the tick hands over
    what it has read: its live deployments (`live`, with their revisions) and their slots'
    published hashes (`published`, by (app, group); the values raw or already decoded). A
    shared pool's violation is the platform's: it shows on each of its tenants' pages, no
    tenant's incident."""
    if live is None:
        query = Deployment.objects.filter(
            deleted_at__isnull=True,
            current_revision__isnull=False,
            current_revision__pool__isnull=True,
            status__in=LIVE_STATUSES,
        ).select_related("tenant", "current_revision")
        if deployment_ids is not None:
            query = query.filter(pk__in=deployment_ids)
        live = [
            (d, d.current_revision)
            for d in in_shard(query.only(*FIELDS), shard)
            if d.current_revision is not None
        ]
    asked: list[tuple[Deployment, str, str]] = []
    for deployment, revision in live:
        if revision.pool_id is not None:
            continue
        try:
            slots = _slots(deployment, revision)
        except names.BadName:  # never compiled: nothing of it publishes
            continue
        asked += [(deployment, label, group) for label, _, group in slots]
    if not asked:
        return []
    read = slot_hashes(r, keys, published, [(d.serve_app, g) for d, _, g in asked])
    done: list[dict[str, Any]] = []
    for deployment, label, group in asked:
        found = read[(deployment.serve_app, group)]
        for snapshot in published_snapshots(found, b'"integrity"'):
            try:
                integrity = (snapshot.get("kv") or {}).get("integrity") or {}
            except AttributeError:
                continue
            if not isinstance(integrity, dict) or not integrity.get("violations_total"):
                continue
            event = events.KvIntegrityViolated(
                deployment=deployment,
                slot=label,
                replica=str(snapshot.get("replica") or "?"),
                report=dict(integrity.get("last_bad") or integrity),
                detected_at=as_datetime(now),
            )
            memo = f"{keys['lock']}:kv-told:{deployment.pk}:{event.key}"
            if r.exists(memo):
                continue
            alerted = events.kv_integrity_violated(event)
            r.set(memo, 1, ex=TOLD_TTL_S)
            if alerted:
                done.append({"deployment": deployment.pk, "slot": label, "kv": event.key})
    return done
