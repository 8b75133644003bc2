"""Reads of the version checks, always inside one tenant."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from serving.ops.checks.models import VersionCheck
from tenants.models import Tenant
from tenants.scoping import get_for_tenant


def version_check_list(*, tenant: Tenant) -> QuerySet[VersionCheck]:
    return VersionCheck.objects.filter(tenant=tenant).select_related("version__model")


def version_check_get(*, tenant: Tenant, pk: Any) -> VersionCheck:
    """One check of `tenant`; a missing and a foreign one raise the same 404."""
    return get_for_tenant(version_check_list(tenant=tenant), tenant=tenant, pk=pk)
