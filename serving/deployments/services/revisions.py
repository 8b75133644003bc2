"""Revisions of desired state: every deployment change goes through here. A change locks the
deployment row, writes the next immutable revision (`write_revision`), audits it with the
`snapshot`s of before and after, and enqueues one reconcile on commit (`reconcile_on_commit`).
`deployment_change` is that change with a set of settings applied.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.exceptions import ConflictError
from serving.deployments import capacity
from serving.deployments.models import (
    SPEC_FIELDS,
    Deployment,
    DeploymentRevision,
    DeploymentStatus,
)
from serving.deployments.services.spec import check_quota, clean_spec
from serving.registry.selectors import version_get_deployable
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record


def reconcile_on_commit(*, always: bool = False) -> None:
    """One reconcile once the caller's transaction commits, unless RECONCILE_ON_COMMIT is off
    and not `always` (the control-plane delay drill measures the reconciles it slows)."""
    from django.conf import settings

    from serving.deployments.tasks import reconcile

    if always or settings.RECONCILE_ON_COMMIT:
        transaction.on_commit(lambda: reconcile.delay())


def write_revision(
    *,
    tenant: Tenant,
    actor: Actor,
    deployment: Deployment,
    spec: dict[str, Any],
    reason: str,
) -> DeploymentRevision:
    last = deployment.revisions.order_by("-number").first()
    revision = DeploymentRevision.objects.create(
        tenant=tenant,
        deployment=deployment,
        number=(last.number + 1) if last else 1,
        reason=reason[:200],
        created_by_id=actor.user_id,
        **{k: v for k, v in spec.items() if k in SPEC_FIELDS},
    )
    deployment.current_revision = revision
    deployment.status = DeploymentStatus.PENDING
    deployment.status_message = f"revision {revision.number}: {reason}"
    deployment.status_at = timezone.now()
    deployment.save(update_fields=["current_revision", "status", "status_message", "status_at"])
    return revision


def snapshot(*, revision: DeploymentRevision) -> dict[str, Any]:
    spec = revision.spec()
    spec.pop("key_hashes", None)  # never in audit rows
    spec.pop("batch_key_hashes", None)
    return {"revision": revision.number, **spec}


def locked_deployment(*, tenant: Tenant, deployment: Deployment) -> Deployment:
    locked = (
        Deployment.objects.select_for_update(of=("self",))
        .select_related("current_revision")
        .get(pk=deployment.pk, tenant=tenant)
    )
    if locked.deleted_at is not None:
        raise ConflictError("this deployment is deleted.", field="deployment")
    if locked.current_revision is None:
        raise ConflictError("this deployment has no revision.", field="deployment")
    return locked


def current_revision(*, deployment: Deployment) -> DeploymentRevision | None:
    """The current revision as the database has it (the caller's object may be older)."""
    return (
        DeploymentRevision.objects.filter(current_of__pk=deployment.pk).first()
        if deployment.pk
        else None
    )


def changed_spec(
    *, tenant: Tenant, current: DeploymentRevision, changes: dict[str, Any]
) -> dict[str, Any]:
    """The cleaned spec `current` becomes with `changes` applied (versions by id, each checked
    deployable; fixed replicas switch autoscaling off): what a change would write, and what
    its cost preview weighs. Raises what the change would raise for a bad setting."""
    changes = dict(changes)
    for field in ("stable_version", "canary_version"):
        if field in changes:
            value = changes.pop(field)
            changes[f"{field}_id"] = (
                None
                if value is None
                else version_get_deployable(tenant=tenant, version_id=value, field=field).pk
            )
    if "num_replicas" in changes and changes["num_replicas"] is not None:
        changes.setdefault("autoscaling", None)
    return clean_spec(
        tenant=tenant, spec={**current.spec(), **changes}, current_pool_id=current.pool_id
    )


def change_reason(*, deployment: Deployment, changes: dict[str, Any], unchanged: str) -> str:
    """A revision's reason for a settings change: "changed a, b" (the fields whose value
    differs from the current revision's), else `unchanged`."""
    current = deployment.current_revision.spec() if deployment.current_revision else {}
    named = sorted(k for k, v in changes.items() if current.get(k) != v)
    return "changed " + ", ".join(named) if named else unchanged


def deployment_change(
    *,
    tenant: Tenant,
    actor: Actor,
    deployment: Deployment,
    changes: dict[str, Any],
    reason: str,
    action: str = "deployment.changed",
    reconcile: bool = True,
) -> DeploymentRevision:
    """A new revision: the current desired state with `changes` applied. `reconcile=False`
    leaves applying it to the caller (a rollback reconciles at once, in its own task)."""
    with transaction.atomic():
        locked = locked_deployment(tenant=tenant, deployment=deployment)
        current = locked.current_revision
        if current is None:  # locked_deployment() refused that already; keeps mypy informed
            raise ConflictError("this deployment has no revision.", field="deployment")
        spec = changed_spec(tenant=tenant, current=current, changes=changes)
        if spec == current.spec():
            return current  # nothing changes: no revision, no reconcile
        check_quota(tenant=tenant, spec=spec, replacing=locked)
        capacity.check_fits(spec=spec, current=current.spec(), deployment=locked)
        revision = write_revision(
            tenant=tenant, actor=actor, deployment=locked, spec=spec, reason=reason
        )
        deployment.current_revision = revision  # the caller's object follows
        audit_record(
            tenant=tenant,
            actor=actor,
            action=action,
            obj=locked,
            before=snapshot(revision=current),
            after=snapshot(revision=revision),
        )
        if reconcile:
            reconcile_on_commit()
    return revision
