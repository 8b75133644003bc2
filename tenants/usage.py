"""What a tenant uses of its quotas, measured by the rooms that own the resources.

tenants is the base of the product apps and imports none of them: the registry (serving)
registers how to measure artifact storage when it starts (ServingConfig.ready). Without a
registered meter a tenant uses 0 bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet

from tenants.models import Quota, Tenant

_storage_used: Callable[[Tenant], int] | None = None
_annotate: Callable[[QuerySet[Quota]], QuerySet[Quota]] | None = None


def register_storage_meter(
    *,
    used: Callable[[Tenant], int],
    annotate: Callable[[QuerySet[Quota]], QuerySet[Quota]],
) -> None:
    """`used(tenant)` measures one tenant; `annotate(quotas)` adds `storage_used_bytes` to many."""
    global _storage_used, _annotate
    _storage_used, _annotate = used, annotate


def storage_used_bytes(tenant: Tenant) -> int:
    return _storage_used(tenant) if _storage_used is not None else 0


def quotas_with_storage_used(quotas: QuerySet[Quota]) -> Any:
    return _annotate(quotas) if _annotate is not None else quotas
