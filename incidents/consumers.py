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

from incidents.notifications.delivery import group_name
from tenants.channels import FORBIDDEN, join_member_group, member_tenant_id


class IncidentsConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    group: str | None = None
    member_group: str | None = None

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        slug = (query.get("tenant") or [""])[0]
        tenant_id = await database_sync_to_async(member_tenant_id)(self.scope.get("user"), slug)
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
