"""The tenant-scoping base every app builds on: the abstract model and the one lookup helper."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from django.db import models
from django.http import Http404

if TYPE_CHECKING:
    from tenants.models import Tenant


class TenantOwned(models.Model):
    """Abstract base of every tenant-owned model: a non-null, indexed, protected tenant FK."""

    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.PROTECT,
        db_index=True,
        related_name="%(app_label)s_%(class)s_set",
    )

    class Meta:
        abstract = True


M = TypeVar("M", bound=TenantOwned)


def get_for_tenant(
    queryset: models.QuerySet[M], *, tenant: Tenant, pk: Any, field: str = "pk"
) -> M:
    """Fetch one object inside `tenant`; missing and foreign objects raise the same 404."""
    try:
        return queryset.get(tenant=tenant, **{field: pk})
    except (queryset.model.DoesNotExist, ValueError, TypeError) as exc:
        raise Http404(f"No {queryset.model._meta.verbose_name} matches the given query.") from exc
