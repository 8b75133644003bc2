"""Config drift, fully (seed 003 §3.2), the portal's side: each status refresh compares the
config Serve reports for every application the portal owns with the config the portal last PUT
for it (the reconcile lock's `applied_config`, wrapped the way the PUT wrapped it), graded by
serving.control.drift. What it finds:

* is kept per deployment in Redis for the deployment page's drift badge (grade, fields, when;
  a repaired drift stays visible, marked repaired, for REPAIRED_KEPT_S);
* is told to the listeners (incidents records it on the timeline: P0/P1 page, P2 a ticket),
  once per distinct drift, not at every refresh;
* asks for a forced reconcile when it is P0 or P1 (`DriftCheck.reconcile_needed`); P2 is
  recorded and left alone.

A reconcile holding the lock, or one that applied since Serve was read, skips the check: what
Serve reports may then be newer or older than the lock, and neither is drift.

Redis layout: <prefix>:drift  hash  deployment id -> state JSON (the badge's).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.statelog import state_changed
from serving.control import drift as graded
from serving.control import isolate
from serving.control.cluster import RayTarget, ray_target_from_env
from serving.control.names import is_portal_app
from serving.control.serve_api import AppInfo
from serving.deployments.controlplane import redis_client
from serving.deployments.models import Deployment, ReconcileLock
from serving.deployments.specs import plan_base

logger = logging.getLogger(__name__)

STATE_KEY = "{prefix}:drift"
REPAIRED_KEPT_S = 3600.0
# Serve read this soon after the portal's last PUT: the two may not be the same moment.
SETTLE_S = 2.0
REPAIR = {graded.P0: "re-applied (forced reconcile)", graded.P1: "re-applied (forced reconcile)"}
RECORDED = "recorded, not re-applied (cosmetic)"


@dataclass(frozen=True)
class DriftFinding:
    """One deployment's drift (or a platform unit's: deployment None)."""

    unit: str
    deployment: Deployment | None
    apps: tuple[graded.AppDrift, ...]
    detected_at: datetime

    @property
    def grade(self) -> str:
        return min((a.grade for a in self.apps), key=graded.GRADE_ORDER.__getitem__)

    @property
    def fields(self) -> list[str]:
        return [f"{a.app}: {f}" for a in self.apps for f in a.fields]

    @property
    def action(self) -> str:
        return REPAIR.get(self.grade, RECORDED)

    @property
    def signature(self) -> str:
        return ",".join(f"{a.app}={a.reported_hash}" for a in self.apps)

    def as_json(self) -> dict[str, Any]:
        return {
            "grade": self.grade,
            "fields": self.fields,
            "action": self.action,
            "apps": [a.as_json() for a in self.apps],
            "signature": self.signature,
        }


@dataclass
class DriftCheck:
    findings: list[DriftFinding] = field(default_factory=list)
    skipped: str = ""

    @property
    def reconcile_needed(self) -> bool:
        return any(f.grade in REPAIR for f in self.findings)


Listener = Callable[[DriftFinding], None]
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> None:
    """Hear of each new drift (incidents subscribes when it starts; serving never imports it)."""
    if listener not in _listeners:
        _listeners.append(listener)


def applied_apps(target: RayTarget, lock: ReconcileLock) -> dict[str, tuple[str, dict[str, Any]]]:
    """Application name -> (unit, the config the portal PUT for it), other owners' left out."""
    base = plan_base(target)
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for key, unit in isolate.units_from_json(lock.applied_config).items():
        if key.startswith(isolate.FOREIGN):
            continue
        for app in base.config({key: unit})["applications"]:
            out[str(app["name"])] = (key, app)
    return out


def drift_check(
    *, apps: Mapping[str, AppInfo], read_at: float, target: RayTarget | None = None
) -> DriftCheck:
    """Compare what Serve reported (`apps`, read at wall time `read_at`) with what the portal
    applied; record and announce what differs. The caller reconciles when it must. A check
    that breaks is logged and skipped: the status refresh around it must go on."""
    try:
        return _drift_check(apps=apps, read_at=read_at, target=target)
    except Exception as exc:
        logger.exception("config drift check failed")
        return DriftCheck(skipped=f"failed: {exc}"[:500])


def _drift_check(
    *, apps: Mapping[str, AppInfo], read_at: float, target: RayTarget | None
) -> DriftCheck:
    with transaction.atomic():
        lock = ReconcileLock.objects.select_for_update(skip_locked=True).filter(id=1).first()
    if lock is None:
        return DriftCheck(skipped="a reconcile holds the lock (or none ran yet)")
    if not lock.applied_config or lock.last_applied_at is None:
        return DriftCheck(skipped="nothing applied yet")
    if lock.last_applied_at.timestamp() > read_at - SETTLE_S:
        return DriftCheck(skipped="applied since Serve was read")
    applied = applied_apps(target or ray_target_from_env(), lock)
    reported: dict[str, Mapping[str, Any]] = {}
    for name, info in apps.items():
        if name not in applied and not is_portal_app(name):
            continue  # another owner's application
        if info.deployed_config is None:
            # Deleting, imperative, or not checkpointed yet: nothing to compare; and a
            # portal application Serve is deleting is no longer in `applied`.
            applied.pop(name, None)
            continue
        reported[name] = info.deployed_config
    drifts = graded.compare({n: app for n, (_, app) in applied.items()}, reported)
    now = timezone.now()
    by_unit: dict[str, list[graded.AppDrift]] = {}
    for d in drifts:
        unit = applied[d.app][0] if d.app in applied else f"extra:{d.app}"
        by_unit.setdefault(unit, []).append(d)
    ids = {int(u.split(":", 1)[1]) for u in by_unit if u.startswith("deployment:")}
    deployments = Deployment.objects.select_related("tenant").in_bulk(ids)
    findings = [
        DriftFinding(
            unit=unit,
            deployment=deployments.get(int(unit.split(":", 1)[1]))
            if unit.startswith("deployment:")
            else None,
            apps=tuple(items),
            detected_at=now,
        )
        for unit, items in sorted(by_unit.items())
    ]
    _record(findings, now)
    return DriftCheck(findings=findings)


def _record(findings: list[DriftFinding], now: datetime) -> None:
    """Keep the badges' state; tell the listeners of each drift not told before. Without Redis
    the badges wait and the listeners are told at every check (incidents counts repeats)."""
    client = redis_client(settings.REDIS_URL)
    key = STATE_KEY.format(prefix=settings.SLI_KEY_PREFIX)
    try:
        stored = {int(k): json.loads(v) for k, v in client.hgetall(key).items()}
    except Exception as exc:
        logger.warning("drift state unreadable: %s", exc)
        stored = {}
    writes: dict[str, dict[str, Any] | None] = {}  # deployment id -> new state (None: drop)
    for finding in findings:
        for app in finding.apps:
            logger.warning(
                "config drift %s on %s: %s", app.grade, app.app, json.dumps(app.details)[:4000]
            )
        if finding.deployment is None:
            if finding.grade != graded.P2:
                state_changed(
                    "config drift %s on platform unit %s: %s",
                    finding.grade,
                    finding.unit,
                    ", ".join(finding.fields)[:500],
                )
            continue
        before = stored.get(finding.deployment.pk, {})
        told = bool(before.get("current")) and before.get("signature") == finding.signature
        writes[str(finding.deployment.pk)] = {
            **finding.as_json(),
            "current": True,
            "detected_at": before.get("detected_at", now.timestamp()) if told else now.timestamp(),
            "last_seen_at": now.timestamp(),
        }
        if told or not _claim(client, key, finding.deployment.pk, finding.signature):
            continue
        state_changed(
            "config drift %s on deployment %s/%s: %s (%s)",
            finding.grade,
            finding.deployment.tenant.slug,
            finding.deployment.name,
            ", ".join(finding.fields)[:500],
            finding.action,
        )
        for listener in _listeners:
            try:
                listener(finding)
            except Exception:  # one listener's failure must not stop the repair
                logger.exception("a config drift listener failed")
    for pk, state in stored.items():
        if str(pk) in writes:
            continue
        if state.get("current"):
            writes[str(pk)] = {**state, "current": False, "repaired_at": now.timestamp()}
            _unclaim(client, key, pk, str(state.get("signature", "")))  # may come back: tell
        elif time.time() - float(state.get("repaired_at", 0)) > REPAIRED_KEPT_S:
            writes[str(pk)] = None
    try:
        pipe = client.pipeline()
        for field_name, value in writes.items():
            if value is None:
                pipe.hdel(key, field_name)
            else:
                pipe.hset(key, field_name, json.dumps(value))
        pipe.expire(key, int(REPAIRED_KEPT_S * 24))
        pipe.execute()
    except Exception as exc:
        logger.warning("drift state not stored: %s", exc)


def _claim_key(key: str, pk: int, signature: str) -> str:
    return f"{key}:told:{pk}:{hashlib.sha256(signature.encode()).hexdigest()[:32]}"


def _claim(client: Any, key: str, pk: int, signature: str) -> bool:
    """Whether this check is the one to tell of this drift: an atomic SET NX per deployment
    and drift signature, so two overlapping status refreshes never both tell. Without Redis
    every check tells (the documented fallback)."""
    try:
        return bool(
            client.set(_claim_key(key, pk, signature), 1, nx=True, ex=int(REPAIRED_KEPT_S * 24))
        )
    except Exception as exc:
        logger.warning("drift claim unavailable: %s", exc)
        return True


def _unclaim(client: Any, key: str, pk: int, signature: str) -> None:
    try:
        client.delete(_claim_key(key, pk, signature))
    except Exception as exc:
        logger.warning("drift claim not released: %s", exc)


def drift_state(deployment: Deployment) -> dict[str, Any] | None:
    """The deployment's drift for its badge: current, or repaired within REPAIRED_KEPT_S."""
    try:
        raw = redis_client(settings.REDIS_URL).hget(
            STATE_KEY.format(prefix=settings.SLI_KEY_PREFIX), str(deployment.pk)
        )
    except Exception as exc:  # the page renders without Redis
        logger.warning("drift state unreadable: %s", exc)
        return None
    if not raw:
        return None
    state: dict[str, Any] = json.loads(raw)
    state["detected"] = datetime.fromtimestamp(float(state["detected_at"]), tz=UTC)
    if state.get("repaired_at"):
        state["repaired"] = datetime.fromtimestamp(float(state["repaired_at"]), tz=UTC)
    return state
