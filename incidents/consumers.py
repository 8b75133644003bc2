"""The live incident stream of one tenant for the pages: `/ws/incidents/?tenant=<slug>`.

The session's user must be a member of that tenant; anyone else (anonymous included) is
accepted and closed at once with code 4403, so the browser sees the code and stops
reconnecting (a close before the handshake would reach it as a bare HTTP 403, code 1006).
A member joins only `tenant-<id>.incidents` and gets each `incident.updated` event as JSON:
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
from tenants.models import Tenant

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


class IncidentsConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    group: str | None = None

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        slug = (query.get("tenant") or [""])[0]
        tenant_id = await database_sync_to_async(_member_tenant_id)(self.scope.get("user"), slug)
        await self.accept()
        if tenant_id is None:
            await self.close(code=FORBIDDEN)
            return
        self.group = group_name(tenant_id)
        await self.channel_layer.group_add(self.group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

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
