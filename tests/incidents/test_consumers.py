"""The live incident stream (`/ws/incidents/?tenant=<slug>`) through the real ASGI app (origin
check, session auth) and the real Redis channel layer: members get `incident.updated` for
their tenant only; everyone else is closed with 4403."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from incidents import services
from incidents.notifications.delivery import group_name
from portal.asgi import application
from tenants.actors import Actor
from tenants.channels import FORBIDDEN
from tests.conftest import TenantWorld
from tests.incidents.factories import incident_for_world

# The consumer reads the database from its own threads: the data must be committed.
pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1")


class WebsocketCommunicator(ApplicationCommunicator):  # type: ignore[misc]
    """A WebSocket client of an ASGI app, in process (channels.testing's own needs daphne,
    which the portal does not install: it serves with uvicorn)."""

    def __init__(self, app: Any, path: str, headers: list[tuple[bytes, bytes]]) -> None:
        url = urlsplit(path)
        scope = {"type": "websocket", "path": url.path, "query_string": url.query.encode(),
                 "headers": headers, "subprotocols": []}  # fmt: skip
        super().__init__(app, scope)

    async def connect(self, timeout: float = 1) -> tuple[bool, Any]:
        """(True, subprotocol) when accepted, (False, close code) when refused."""
        await self.send_input({"type": "websocket.connect"})
        response = await self.receive_output(timeout)
        if response["type"] == "websocket.close":
            return False, response.get("code", 1000)
        assert response["type"] == "websocket.accept", response
        return True, response.get("subprotocol")

    async def receive_json_from(self, timeout: float = 1) -> Any:
        response = await self.receive_output(timeout)
        assert response["type"] == "websocket.send", response
        return json.loads(response["text"])

    async def disconnect(self, code: int = 1000, timeout: float = 1) -> None:
        await self.send_input({"type": "websocket.disconnect", "code": code})
        await self.wait(timeout)


def session_cookie(user: User) -> bytes:
    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()


def communicator(slug: str | None, user: User | None = None) -> WebsocketCommunicator:
    """A client of the whole ASGI app; build it in sync code (the session is written here)."""
    headers = [ORIGIN]
    if user is not None:
        headers.append((b"cookie", session_cookie(user)))
    path = "/ws/incidents/" + (f"?tenant={slug}" if slug is not None else "")
    return WebsocketCommunicator(application, path, headers=headers)


async def close_code(comm: WebsocketCommunicator) -> int | None:
    """Connect and return the close code the server sent right away (None: it stayed open)."""
    connected, code = await comm.connect(timeout=5)
    if not connected:  # closed before the handshake
        return int(code)
    for _ in range(20):  # an open stream may send at once (a sample already in its log)
        if await comm.receive_nothing(timeout=0.5):
            await comm.disconnect()
            return None
        output: dict[str, Any] = await comm.receive_output(timeout=1)
        if output["type"] == "websocket.close":
            return int(output["code"])
        assert output["type"] == "websocket.send", output
    await comm.disconnect()
    return None  # still streaming: open


def test_a_member_receives_incident_updated_after_a_note(world_a: TenantWorld) -> None:
    incident = incident_for_world(world_a)
    comm = communicator(world_a.tenant.slug, world_a.viewer)  # viewers follow too

    async def scenario() -> dict[str, Any]:
        connected, _ = await comm.connect(timeout=5)
        assert connected
        assert await comm.receive_nothing(timeout=0.3)  # accepted and kept open
        await database_sync_to_async(services.incident_note)(
            tenant=world_a.tenant, actor=Actor(user=world_a.operator), incident=incident,
            text="Looking at the canary.",
        )  # fmt: skip
        message: dict[str, Any] = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return message

    assert type(get_channel_layer()).__name__ == "RedisPubSubChannelLayer"  # the real one
    message = async_to_sync(scenario)()
    assert message == {
        "type": "incident.updated",
        "incident": incident.pk,
        "status": "triggered",
        "event": "note",
    }


def test_a_member_hears_only_their_own_tenant(world_a: TenantWorld, world_b: TenantWorld) -> None:
    theirs = incident_for_world(world_b)
    mine = incident_for_world(world_a)
    comm = communicator(world_a.tenant.slug, world_a.owner)

    async def scenario() -> dict[str, Any]:
        assert (await comm.connect(timeout=5))[0]
        await database_sync_to_async(services.incident_acknowledge)(
            tenant=world_b.tenant, actor=Actor(user=world_b.owner), incident=theirs
        )
        await get_channel_layer().group_send(
            group_name(world_b.tenant.pk), {"type": "incident.updated", "incident": theirs.pk}
        )
        assert await comm.receive_nothing(timeout=1)  # nothing of tenant B's
        await database_sync_to_async(services.incident_acknowledge)(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), incident=mine
        )
        message: dict[str, Any] = await comm.receive_json_from(timeout=5)
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()
        return message

    message = async_to_sync(scenario)()
    assert message["incident"] == mine.pk and message["status"] == "acknowledged"
    assert message["event"] == "status_changed"


def test_a_user_of_another_tenant_is_closed_with_4403(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    code = async_to_sync(close_code)(communicator(world_a.tenant.slug, world_b.owner))
    assert code == FORBIDDEN == 4403


@pytest.mark.parametrize("slug", ["acme", "", None, "no-such-tenant"])
def test_anonymous_and_bad_tenants_are_closed_with_4403(
    world_a: TenantWorld, slug: str | None
) -> None:
    code = async_to_sync(close_code)(communicator(slug))
    assert code == FORBIDDEN
    if slug != "acme":  # a member naming no tenant of theirs is refused too
        code = async_to_sync(close_code)(communicator(slug, world_a.owner))
        assert code == FORBIDDEN


def test_a_foreign_origin_is_refused_before_the_handshake(world_a: TenantWorld) -> None:
    comm = WebsocketCommunicator(
        application,
        f"/ws/incidents/?tenant={world_a.tenant.slug}",
        headers=[(b"origin", b"https://evil.example"), (b"cookie", session_cookie(world_a.owner))],
    )
    connected, _ = async_to_sync(comm.connect)(5)
    assert not connected
