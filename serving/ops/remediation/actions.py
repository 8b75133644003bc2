"""The remediation actions that change desired state: each is one new revision (through the
deployments services, so quota, capacity and tenancy checks apply), written inside the step's
transaction, so the step and its effect commit together, once. `Outcome` says what was done.

`restart_replicas` acts on the live replicas instead (serving.ops.remediation.restart);
`rollback` goes through serving.ops.rollbacks (its own exactly-once key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from portal.exceptions import ConflictError, QuotaExceeded
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, DeploymentRevision
from serving.ops.rollbacks import rollback_request
from serving.ops.rollouts import rollout_pause_for_breach
from tenants.actors import Actor

ACTOR = Actor(system="remediation")
DEFAULT_MAX_REPLICAS = 8  # scale_out's ceiling for a fixed-size deployment without max_replicas


@dataclass
class Outcome:
    message: str
    skipped: bool = False
    data: dict[str, Any] = field(default_factory=dict)
    rollback_id: int | None = None  # a rollback to run after commit


def _current(deployment: Deployment) -> DeploymentRevision:
    current = deployments.current_revision(deployment=deployment)
    if current is None or deployment.deleted_at is not None:
        raise ConflictError("this deployment is not live.", field="deployment")
    return current


def _change(deployment: Deployment, changes: dict[str, Any], reason: str) -> DeploymentRevision:
    return deployments.deployment_change(
        tenant=deployment.tenant,
        actor=ACTOR,
        deployment=deployment,
        changes=changes,
        reason=f"remediation: {reason}"[:200],
        action="deployment.remediated",
    )


def scale_out(deployment: Deployment, params: dict[str, Any]) -> Outcome:
    """Add `replicas` (default 1) up to the deployment's max (autoscaling: its max_replicas;
    fixed: the step's max_replicas, default DEFAULT_MAX_REPLICAS) and within the tenant's quota:
    the most that fits, fewer when the quota is nearly used, none when it is used up."""
    current = _current(deployment)
    add = int(params.get("replicas", 1))
    auto = dict(current.autoscaling or {})
    if auto:
        low, high = int(auto["min_replicas"]), int(auto["max_replicas"])
        ceiling = min(high, int(params.get("max_replicas", high)))
    else:
        low = int(current.num_replicas or 1)
        ceiling = int(params.get("max_replicas", DEFAULT_MAX_REPLICAS))
    wanted = min(low + add, ceiling)
    if wanted <= low:
        return Outcome(f"already at {low} replicas, the most allowed ({ceiling})", skipped=True)
    refused = ""
    for count in range(wanted, low, -1):
        changes: dict[str, Any] = (
            {"autoscaling": {**auto, "min_replicas": count}} if auto else {"num_replicas": count}
        )
        try:
            with transaction.atomic():
                revision = _change(deployment, changes, f"scale out to {count} replicas")
        except QuotaExceeded as exc:
            refused = exc.message
            continue
        return Outcome(
            f"scaled out from {low} to {count} replicas (revision {revision.number})",
            data={"from": low, "to": count, "revision": revision.number},
        )
    return Outcome(f"no replica added: {refused}", skipped=True, data={"quota": refused})


def shed_load(deployment: Deployment, params: dict[str, Any]) -> Outcome:
    """Lower what the deployment takes in: the canary's weight, the replicas' concurrency, the
    guard's max_tokens. Only ever lowers: a limit already at or below the step's stays."""
    current = _current(deployment)
    changes: dict[str, Any] = {}
    said: list[str] = []
    percent = params.get("canary_percent")
    if percent is not None and current.canary_version_id and current.canary_percent > percent:
        changes["canary_percent"] = float(percent)
        said.append(f"canary weight {current.canary_percent:g}% -> {float(percent):g}%")
    ongoing = params.get("max_ongoing_requests")
    if ongoing is not None and current.max_ongoing_requests > ongoing:
        changes["max_ongoing_requests"] = int(ongoing)
        said.append(f"max_ongoing_requests {current.max_ongoing_requests} -> {ongoing}")
    tokens = params.get("max_tokens")
    guard = dict(current.guard or {})
    if tokens is not None and int(guard.get("max_tokens", tokens + 1)) > tokens:
        changes["guard"] = {**guard, "max_tokens": int(tokens)}
        said.append(f"guard max_tokens {guard.get('max_tokens', 'unset')} -> {tokens}")
    if not changes:
        return Outcome("nothing to lower: every limit is already at or below the step's", True)
    revision = _change(deployment, changes, "shed load: " + "; ".join(said))
    return Outcome(
        f"shed load: {'; '.join(said)} (revision {revision.number})",
        data={"changes": changes, "revision": revision.number},
    )


def switch_to_fallback(deployment: Deployment, params: dict[str, Any]) -> Outcome:
    """Serve the declared fallback: a degraded tier pinned (the step's `tier`, else the first
    declared level), or, with `version`, that registered version of the tenant as the stable
    one (the canary leaves)."""
    current = _current(deployment)
    version = params.get("version")
    if version is not None:
        revision = _change(
            deployment,
            {"stable_version": version, "canary_version": None, "canary_percent": 0},
            f"switch to fallback version {version}",
        )
        return Outcome(
            f"traffic switched to fallback version {version} (revision {revision.number})",
            data={"version": version, "revision": revision.number},
        )
    levels = [level["name"] for level in (current.tiers or {}).get("levels", [])]
    tier = params.get("tier") or (levels[0] if levels else None)
    if tier is None:
        raise ConflictError(
            "this deployment declares no tiers: give the step a fallback version.", field="tier"
        )
    deployment.current_revision = current
    revision = deployments.deployment_switch_tier(
        deployment=deployment, tier=tier, reason="remediation: switch to fallback", actor=ACTOR
    )
    return Outcome(
        f"traffic pinned to the {tier} tier (revision {revision.number})",
        data={"tier": tier, "revision": revision.number},
    )


def rollback(deployment: Deployment, reason: str) -> Outcome:
    found, created = rollback_request(
        tenant=deployment.tenant,
        deployment=deployment,
        trigger="remediation",
        reason=reason,
        enqueue=False,
    )
    verb = "started" if created else "already under way"
    return Outcome(
        f"rollback to revision {found.to_revision.number} {verb}",
        data={"rollback": found.pk},
        rollback_id=found.pk if created else None,
    )


def pause(deployment: Deployment, reason: str) -> Outcome:
    paused = rollout_pause_for_breach(
        tenant=deployment.tenant, deployment=deployment, reason=reason
    )
    return Outcome("the rollout is paused" if paused else "no rollout in progress", not paused)
