"""Reads of deployments, revisions and inference keys (always inside one tenant)."""

from __future__ import annotations

from django.db.models import QuerySet

from serving.deployment_models import Deployment, DeploymentRevision, InferenceKey
from tenants.models import Tenant


def deployment_list(*, tenant: Tenant, include_deleted: bool = False) -> QuerySet[Deployment]:
    queryset = Deployment.objects.filter(tenant=tenant).select_related(
        "tenant",
        "current_revision__stable_version__model",
        "current_revision__canary_version__model",
        "current_revision__pool",
    )
    if not include_deleted:
        queryset = queryset.filter(deleted_at__isnull=True)
    return queryset.order_by("-id")


def revision_list(*, tenant: Tenant, deployment: Deployment) -> QuerySet[DeploymentRevision]:
    return (
        DeploymentRevision.objects.filter(tenant=tenant, deployment=deployment)
        .select_related("stable_version__model", "canary_version__model", "pool")
        .order_by("-number")
    )


def inference_key_list(*, tenant: Tenant, deployment: Deployment) -> QuerySet[InferenceKey]:
    return InferenceKey.objects.filter(tenant=tenant, deployment=deployment).order_by("-id")
