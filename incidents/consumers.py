"""The live incident stream of one tenant for the pages: `/ws/incidents/?tenant=<slug>`.

The session's user must be a member of that tenant; anyone else (anonymous included) is
accepted and closed at once with code 4403, so the browser sees the code and stops
reconnecting (a close before the handshake would reach it as a bare HTTP 403, code 1006).
A member joins only `tenant-<id>.incidents` (and `tenant-<id>.user-<uid>`, through which their
removal from the tenant closes the socket with 4403) and gets each `incident.updated` as JSON:
{"type": "incident.updated", "incident": <id>, "status": "...", "event": "<kind>"}.
Messages from the browser are ignored.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from incidents.notify import group_name
from tenants import selectors
from tenants.models import Membership, Tenant
from tenants.services import member_group

FORBIDDEN = 4403


def _member_tenant_id(user: Any, slug: str) -> int | None:
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


class IncidentsConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    group: str | None = None
    member_group: str | None = None

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        slug = (query.get("tenant") or [""])[0]
        tenant_id = await database_sync_to_async(_member_tenant_id)(self.scope.get("user"), slug)
        if tenant_id is not None:
            self.member_group = await join_member_group(self, tenant_id)
        await self.accept()
        if self.member_group is None:
            await self.close(code=FORBIDDEN)
            return
        self.group = group_name(tenant_id)
        await self.channel_layer.group_add(self.group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        for group in (self.group, self.member_group):
            if group is not None:
                await self.channel_layer.group_discard(group, self.channel_name)

    async def membership_removed(self, event: dict[str, Any]) -> None:
        """The member was removed from the tenant: the stream ends for them (4403)."""
        await self.close(code=FORBIDDEN)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The stream is one-way."""

    async def incident_updated(self, event: dict[str, Any]) -> None:
        await self.send_json(
            {
                "type": "incident.updated",
                "incident": event.get("incident"),
                "status": event.get("status"),
                "event": event.get("event"),
            }
        )
