"""Deployments: create one, set its canary and the canary's traffic, promote the canary, delete.

Each is a new immutable revision of desired state (serving.deployments.services.revisions),
audited, followed on commit by one reconcile that brings Ray Serve to it.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.exceptions import ConflictError, ValidationFailed
from serving.deployments import capacity, gates
from serving.deployments.models import (
    DEPLOYMENT_NAME_RE,
    Deployment,
    DeploymentRevision,
    DeploymentStatus,
    InferenceKey,
)
from serving.deployments.services.keys import new_inference_key
from serving.deployments.services.revisions import (
    current_revision,
    deployment_change,
    locked_deployment,
    reconcile_on_commit,
    snapshot,
    write_revision,
)
from serving.deployments.services.spec import (
    check_quota,
    live_deployments,
    new_deployment_spec,
)
from serving.deployments.spec_checks import number
from serving.registry.selectors import version_get_deployable
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record


def deployment_create(
    *,
    tenant: Tenant,
    actor: Actor,
    name: str,
    version_id: Any,
    description: str = "",
    settings: dict[str, Any] | None = None,
) -> tuple[Deployment, str]:
    """A new deployment serving `version_id`; returns it and its first inference key (shown
    once)."""
    import re

    name = (name or "").strip()
    if not re.fullmatch(DEPLOYMENT_NAME_RE, name):
        raise ValidationFailed(
            "use 1-40 lower-case letters, digits and '-', starting and ending alphanumeric.",
            field="name",
        )
    version = version_get_deployable(tenant=tenant, version_id=version_id, field="version")
    raw_key, key_hash = new_inference_key()
    spec = new_deployment_spec(
        tenant=tenant, version=version, settings=settings, key_hashes=[key_hash]
    )
    capacity.check_fits(spec=spec)
    with transaction.atomic():
        check_quota(tenant=tenant, spec=spec, replacing=None)
        if live_deployments(tenant=tenant).filter(name=name).exists():
            raise ConflictError(f"a deployment named {name!r} exists.", field="name")
        try:
            deployment = Deployment.objects.create(
                tenant=tenant, name=name, description=description, created_by_id=actor.user_id
            )
        except IntegrityError:
            raise ConflictError(f"a deployment named {name!r} exists.", field="name") from None
        InferenceKey.objects.create(
            tenant=tenant,
            deployment=deployment,
            name="default",
            prefix=raw_key[:12],
            key_hash=key_hash,
        )
        revision = write_revision(
            tenant=tenant,
            actor=actor,
            deployment=deployment,
            spec=spec,
            reason=f"created with {version}",
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="deployment.created",
            obj=deployment,
            after=snapshot(revision=revision),
        )
        reconcile_on_commit()
    return deployment, raw_key


def deployment_set_canary(
    *,
    tenant: Tenant,
    actor: Actor,
    deployment: Deployment,
    version_id: Any,
    percent: float,
    engine: Any = None,
) -> DeploymentRevision:
    """A canary of `version_id` at `percent`, on `engine` (default: the stable slot's)."""
    percent = number(percent, "percent", 0, 100)
    return deployment_change(
        tenant=tenant,
        actor=actor,
        deployment=deployment,
        changes={"canary_version": version_id, "canary_percent": percent, "canary_engine": engine},
        reason=f"canary at {percent:g}%",
        action="deployment.canary_set",
    )


def deployment_set_traffic(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, percent: float
) -> DeploymentRevision:
    """Weights only: live replicas are reconfigured, none restarts."""
    percent = number(percent, "percent", 0, 100)
    current = current_revision(deployment=deployment)
    if current is None or current.canary_version_id is None:
        raise ConflictError("there is no canary to send traffic to.", field="percent")
    return deployment_change(
        tenant=tenant,
        actor=actor,
        deployment=deployment,
        changes={"canary_percent": percent},
        reason=f"canary traffic {percent:g}%",
        action="deployment.traffic_set",
    )


def deployment_promote(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, skip_gate: bool = False
) -> DeploymentRevision:
    """The canary becomes stable (a hot reload). A contract whose gate is `block` refuses
    while the canary misses a gated objective (the error names it)."""
    current = current_revision(deployment=deployment)
    if current is None or current.canary_version_id is None:
        raise ConflictError("there is no canary to promote.", field="deployment")
    if not skip_gate:
        why = gates.blocking(deployment, current)
        if why is not None:
            raise ConflictError(f"the SLA contract blocks promotion: {why}", field="gate")
    return deployment_change(
        tenant=tenant,
        actor=actor,
        deployment=deployment,
        changes={
            "stable_version_id": current.canary_version_id,
            "canary_version_id": None,
            "canary_percent": 0,
            "engine": current.canary_engine or current.engine,
            "canary_engine": None,
        },
        reason="canary promoted to stable",
        action="deployment.promoted",
    )


def deployment_delete(*, tenant: Tenant, actor: Actor, deployment: Deployment) -> None:
    with transaction.atomic():
        locked = locked_deployment(tenant=tenant, deployment=deployment)
        locked.deleted_at = timezone.now()
        locked.status = DeploymentStatus.DELETING
        locked.status_message = "removing from Serve"
        locked.status_at = locked.deleted_at
        locked.save(update_fields=["deleted_at", "status", "status_message", "status_at"])
        audit_record(
            tenant=tenant,
            actor=actor,
            action="deployment.deleted",
            obj=locked,
            before={"name": locked.name},
        )
        reconcile_on_commit()
