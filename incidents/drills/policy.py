"""Who may run which drill, and how big: a tenant's drills touch only its own replicas and
traffic, within its own quotas.

* Platform faults (the control plane, anything on a shared pool) are for platform staff: a
  tenant's `control_plane_delay` would slow every tenant's reconciles, and a fault in a pool
  lands on every tenant the pool serves.
* A memory leak is bounded by the replica's own memory share (serving.replica_limits); a
  flood by the deployment's own capacity (its replicas x max_ongoing_requests), so the shared
  chaos worker holds no more requests in flight than the tenant's replicas can take.
* Quota.max_drills bounds the drills a tenant keeps, Quota.max_concurrent_drill_runs the runs
  in progress at once.
* A suspended tenant starts no run; a run in progress aborts at its next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from incidents.drills.models import ACTIVE_STATUSES, ChaosDrill, DrillRun, FaultKind
from portal.exceptions import ConflictError, PermissionDeniedError, QuotaExceeded
from tenants.actors import Actor
from tenants.models import Quota, Tenant

if TYPE_CHECKING:
    from serving.deployments.models import DeploymentRevision

PLATFORM_FAULTS = frozenset({FaultKind.CONTROL_PLANE_DELAY})
MAX_FLOOD_CONCURRENCY = 64


def acts_for_platform(actor: Actor, drill: ChaosDrill) -> bool:
    """Platform staff; or a drill's schedule, for a drill platform staff made."""
    if actor.is_platform_staff:
        return True
    creator = drill.created_by
    return actor.system == "schedule" and creator is not None and bool(creator.is_staff)


def _current(drill: ChaosDrill) -> DeploymentRevision | None:
    """The deployment's current revision, read now (a drill is checked again at each start)."""
    from serving.deployments.models import DeploymentRevision

    return DeploymentRevision.objects.filter(current_of__pk=drill.deployment_id).first()


def _on_shared_pool(revision: DeploymentRevision | None) -> bool:
    return revision is not None and revision.kv_mode == "shared"


def check_allowed(*, actor: Actor, drill: ChaosDrill) -> None:
    """Platform faults and faults on a shared pool: platform staff only (403 naming the field)."""
    if acts_for_platform(actor, drill):
        return
    if drill.fault in PLATFORM_FAULTS:
        raise PermissionDeniedError(
            f"{drill.fault} acts on the control plane every tenant shares: only platform "
            "staff may run it.",
            field="fault",
        )
    if _on_shared_pool(_current(drill)):
        raise PermissionDeniedError(
            "this deployment is served by a shared pool: a fault there lands on every tenant "
            "of the pool, so only platform staff may drill it.",
            field="deployment",
        )


def capacity(revision: DeploymentRevision | None) -> int:
    """Requests the deployment's own replicas take at once (what a flood may hold)."""
    if revision is None:
        return 1
    replicas = revision.num_replicas or int((revision.autoscaling or {}).get("max_replicas", 1))
    return max(1, replicas * revision.max_ongoing_requests)


def check_size(drill: ChaosDrill) -> None:
    """Bounds that depend on the deployment: leak size, flood concurrency."""
    from portal.exceptions import ValidationFailed
    from serving.deployments.replica_limits import leak_cap_mb, leak_cap_reason

    revision = _current(drill)
    params = drill.parameters
    if drill.fault == FaultKind.GPU_MEMORY_LEAK and revision is not None:
        shape = {"num_cpus": revision.num_cpus, "num_gpus": revision.num_gpus}
        if float(params["max_mb"]) > leak_cap_mb(**shape):
            raise ValidationFailed(leak_cap_reason(**shape), field="parameters.max_mb")
    if drill.fault == FaultKind.TOKEN_STARVATION:
        most = min(MAX_FLOOD_CONCURRENCY, capacity(revision))
        if int(params["concurrency"]) > most:
            raise ValidationFailed(
                f"at most {most}: the deployment's own replicas take {capacity(revision)} "
                "requests at once (num_replicas x max_ongoing_requests).",
                field="parameters.concurrency",
            )


def check_drill_count(tenant: Tenant) -> None:
    """Called under the tenant's Quota row lock (two creates cannot both pass)."""
    quota = Quota.objects.select_for_update().get(tenant=tenant)
    if ChaosDrill.objects.filter(tenant=tenant).count() >= quota.max_drills:
        raise QuotaExceeded(
            f"the tenant has {quota.max_drills} drills, its quota (max_drills): delete one first.",
            field="name",
        )


def check_can_start(*, tenant: Tenant, deployment_id: int) -> None:
    """Takes the tenant's Quota row lock: suspension, one run per deployment, concurrent runs."""
    if not Tenant.objects.filter(pk=tenant.pk, is_active=True).exists():
        raise PermissionDeniedError("the tenant is suspended: no drill runs.", field="drill")
    quota = Quota.objects.select_for_update().get(tenant=tenant)
    active = DrillRun.objects.filter(tenant=tenant, status__in=ACTIVE_STATUSES)
    if active.filter(deployment_id=deployment_id).exists():
        raise ConflictError(
            "another drill run is in progress on this deployment.", field="deployment"
        )
    running = active.count()
    if running >= quota.max_concurrent_drill_runs:
        raise ConflictError(
            f"{running} drill run(s) of this tenant are in progress, its quota "
            f"(max_concurrent_drill_runs {quota.max_concurrent_drill_runs}): wait or stop one.",
            field="drill",
        )


def suspended(run: DrillRun) -> bool:
    return not Tenant.objects.filter(pk=run.tenant_id, is_active=True).exists()
