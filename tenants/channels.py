"""What every tenant stream shares: who may join a tenant's groups, and the 4403 close."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from tenants import selectors
from tenants.models import Membership, Tenant

FORBIDDEN = 4403


def member_group(tenant_id: int, user_id: int) -> str:
    """The Channels group every tenant-scoped socket of one member joins (to be closed)."""
    return f"tenant-{tenant_id}.user-{user_id}"


def member_tenant_id(user: Any, slug: str) -> int | None:
    """The id of the active tenant `slug` when `user` is a member of it, else None."""
    if user is None or not user.is_authenticated or not slug:
        return None
    tenant = Tenant.objects.filter(slug=slug, is_active=True).first()
    if tenant is None:
        return None
    membership = selectors.membership_get(tenant=tenant, user=user)
    return membership.tenant_id if membership is not None else None


def _still_member(user: Any, tenant_id: int) -> bool:
    return Membership.objects.filter(tenant_id=tenant_id, user=user).exists()


async def join_member_group(consumer: Any, tenant_id: int) -> str | None:
    """Join the member's own group of this tenant (removal closes the socket through it),
    then check the membership again: a removal between the first check and the join would
    otherwise leave the socket open. Returns the group, or None when the member is gone."""
    user = consumer.scope["user"]
    group = member_group(tenant_id, user.pk)
    await consumer.channel_layer.group_add(group, consumer.channel_name)
    if not await database_sync_to_async(_still_member)(user, tenant_id):
        await consumer.channel_layer.group_discard(group, consumer.channel_name)
        return None
    return group
