"""Reads of the model registry; every selector takes the tenant explicitly."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce

from portal.exceptions import ConflictError, ValidationFailed
from serving.registry.models import Model, ModelVersion, VersionStatus
from tenants.models import Quota, Tenant
from tenants.scoping import get_for_tenant


def model_list(*, tenant: Tenant) -> QuerySet[Model]:
    return (
        Model.objects.filter(tenant=tenant)
        .select_related("created_by")
        .annotate(version_count=Count("versions"))
    )


def model_get(*, tenant: Tenant, pk: Any) -> Model:
    """One model of `tenant`; a missing and a foreign one raise the same 404."""
    return get_for_tenant(Model.objects.all(), tenant=tenant, pk=pk)


def version_list(*, tenant: Tenant, model: Model | None = None) -> QuerySet[ModelVersion]:
    versions = ModelVersion.objects.filter(tenant=tenant).select_related("model", "created_by")
    if model is not None:
        versions = versions.filter(model=model)
    return versions


def version_get(*, tenant: Tenant, pk: Any, model: Model | None = None) -> ModelVersion:
    return get_for_tenant(version_list(tenant=tenant, model=model), tenant=tenant, pk=pk)


def storage_used_bytes(*, tenant: Tenant) -> int:
    """Bytes of the tenant's artifacts in the store, as its storage quota counts them: every
    version's `stored_bytes` (uploads, from the moment they are accepted; local directories
    and deleted failures count nothing)."""
    total = ModelVersion.objects.filter(tenant=tenant).aggregate(total=Sum("stored_bytes"))
    return int(total["total"] or 0)


def quotas_with_storage_used(quotas: QuerySet[Quota]) -> QuerySet[Quota]:
    """`quotas` annotated with `storage_used_bytes` (as `storage_used_bytes()` counts it), in
    the same query: the quota API lists usage beside each limit."""
    used = (
        ModelVersion.objects.filter(tenant=OuterRef("tenant"))
        .order_by()
        .values("tenant")
        .annotate(total=Sum("stored_bytes"))
        .values("total")
    )
    return quotas.annotate(storage_used_bytes=Coalesce(Subquery(used), 0))


def version_get_deployable(
    *, tenant: Tenant, version_id: Any, field: str = "version"
) -> ModelVersion:
    """The version to deploy, inside `tenant`, only when it is `ready`.

    Missing and foreign ids give the same ValidationFailed naming `field` (the body field the
    caller took the id from); a version that is not ready gives a ConflictError saying why."""
    version = (
        ModelVersion.objects.filter(tenant=tenant, pk=version_id).select_related("model").first()
        if _is_id(version_id)
        else None
    )
    if version is None:
        raise ValidationFailed(f"No model version {version_id!r} in this tenant.", field=field)
    if version.status != VersionStatus.READY:
        why = f": {version.failure_reason}" if version.failure_reason else ""
        raise ConflictError(
            f"Version {version.label} of {version.model.name} is {version.status}{why}; "
            "only ready versions can be deployed.",
            field=field,
        )
    return version


def _is_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value > 0
    return isinstance(value, str) and value.isdigit() and int(value) > 0
