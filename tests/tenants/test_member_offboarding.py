"""Offboarding: removing a member revokes the tokens they created and the invitations they
sent, and closes their open sockets of the tenant (4403); demoting one narrows their tokens
at once, even where a token is already in a process's warm cache."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.urls import reverse
from rest_framework.test import APIClient

from portal import ratelimit
from tenants import services
from tenants.actors import Actor
from tenants.auth import token_cache
from tenants.channels import FORBIDDEN
from tenants.models import ApiToken, AuditEvent, Invitation, Role
from tenants.secrets import hash_secret
from tests.conftest import TenantWorld, make_user
from tests.incidents.test_consumers import ORIGIN, WebsocketCommunicator, session_cookie
from tests.incidents.test_consumers import communicator as incidents_socket

pytestmark = pytest.mark.django_db


def _bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _membership(world: TenantWorld, user: User) -> Any:
    return world.tenant.tenants_membership_set.get(user=user)


def _set_role(world: TenantWorld, user: User, role: str) -> None:
    services.membership_set_role(
        tenant=world.tenant, actor=Actor(user=world.owner),
        membership=_membership(world, user), role=role,
    )  # fmt: skip


def _token_of(world: TenantWorld, user: User, scopes: list[str], name: str = "ci") -> str:
    """`user` (made a co-owner for the moment, as only owners create tokens) makes a token
    through the API, the way people do."""
    client = APIClient()
    client.force_login(user)
    response = client.post(
        reverse("token-list"), {"name": name, "scopes": scopes}, format="json",
        HTTP_X_TENANT=world.tenant.slug,
    )  # fmt: skip
    assert response.status_code == 201, response.content
    return str(response.json()["token"])


def _warm(raw: str) -> APIClient:
    client = _bearer(raw)
    assert client.get(reverse("model-list")).status_code == 200
    assert token_cache.get(hash_secret(raw)) is not None  # cached in this process
    return client


def _remove(world: TenantWorld, user: User) -> dict[str, int]:
    return services.membership_remove(
        tenant=world.tenant, actor=Actor(user=world.owner), membership=_membership(world, user)
    )


def test_a_removed_members_tokens_are_refused_at_once_despite_a_warm_cache(
    world_a: TenantWorld,
) -> None:
    _set_role(world_a, world_a.operator, Role.OWNER)
    raw = _token_of(world_a, world_a.operator, ["read", "write"])
    other = _token_of(world_a, world_a.operator, ["read"], name="dashboards")
    client, dashboards = _warm(raw), _warm(other)
    owners_token = _warm(world_a.raw_token)
    counts = _remove(world_a, world_a.operator)
    assert counts == {"tokens": 2, "invitations": 0}
    for victim in (client, dashboards):
        response = victim.get(reverse("model-list"))
        assert response.status_code == 401
        assert "revoked" in response.json()["error"]["message"]
    assert owners_token.get(reverse("model-list")).status_code == 200  # only theirs
    revoked = ApiToken.objects.filter(tenant=world_a.tenant, created_by=world_a.operator)
    assert {t.status for t in revoked} == {"revoked"}
    audit = AuditEvent.objects.filter(tenant=world_a.tenant, action="api_token.revoked")
    assert audit.count() == 2
    assert all(e.after["reason"] == "creator removed from the tenant" for e in audit)
    removed = AuditEvent.objects.get(tenant=world_a.tenant, action="membership.removed")
    assert removed.after == {"tokens_revoked": 2, "invitations_revoked": 0}


def test_a_tokens_made_by_a_members_token_go_with_the_member(world_a: TenantWorld) -> None:
    """A token the member's automation created is theirs too (else it would outlive them)."""
    _set_role(world_a, world_a.operator, Role.OWNER)
    parent = _token_of(world_a, world_a.operator, ["read", "admin"])
    response = _bearer(parent).post(
        reverse("token-list"), {"name": "child", "scopes": ["read"]}, format="json"
    )
    assert response.status_code == 201
    child = response.json()["token"]
    assert ApiToken.objects.get(name="child").created_by == world_a.operator
    _warm(child)
    _remove(world_a, world_a.operator)
    assert _bearer(child).get(reverse("model-list")).status_code == 401


def test_a_removed_members_invitations_cannot_be_accepted(world_a: TenantWorld) -> None:
    _set_role(world_a, world_a.operator, Role.OWNER)
    _, raw = services.invitation_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.operator),
        email="friend@elsewhere.example", role=Role.OWNER,
    )  # fmt: skip
    _, owners = services.invitation_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner),
        email="colleague@elsewhere.example", role=Role.VIEWER,
    )  # fmt: skip
    assert _remove(world_a, world_a.operator) == {"tokens": 0, "invitations": 1}
    friend = make_user("friend@elsewhere.example")
    client = APIClient()
    client.force_login(friend)
    response = client.post(reverse("api-invitation-accept"), {"token": raw}, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["token"]
    assert "revoked" in response.json()["error"]["message"]
    assert not world_a.tenant.tenants_membership_set.filter(user=friend).exists()
    assert Invitation.objects.get(email="colleague@elsewhere.example").status == "pending"
    colleague = make_user("colleague@elsewhere.example")
    services.invitation_accept(user=colleague, raw_token=owners)  # the owner's still works


def test_an_invitation_from_a_member_who_lost_admin_is_refused(world_a: TenantWorld) -> None:
    """Demotion below owner revokes the invitations they sent (an invitation is the admin
    acting later); one that slipped past (sent before this rule) is refused on accept."""
    _set_role(world_a, world_a.operator, Role.OWNER)
    _, raw = services.invitation_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.operator),
        email="friend@elsewhere.example", role=Role.OWNER,
    )  # fmt: skip
    _set_role(world_a, world_a.operator, Role.OPERATOR)
    invitation = Invitation.objects.get(email="friend@elsewhere.example")
    assert invitation.status == "revoked"
    Invitation.objects.filter(pk=invitation.pk).update(revoked_at=None)  # the old data
    friend = make_user("friend@elsewhere.example")
    with pytest.raises(services.ValidationFailed, match="can no longer invite"):
        services.invitation_accept(user=friend, raw_token=raw)


def test_demotion_narrows_a_warm_token_at_once(world_a: TenantWorld) -> None:
    _set_role(world_a, world_a.operator, Role.OWNER)
    raw = _token_of(world_a, world_a.operator, ["read", "write", "deploy"])
    _set_role(world_a, world_a.operator, Role.OPERATOR)
    client = _warm(raw)
    assert client.post(reverse("model-list"), {"name": "before"}, format="json").status_code == 201
    _set_role(world_a, world_a.operator, Role.VIEWER)
    assert token_cache.get(hash_secret(raw)) is not None  # still cached here
    response = client.post(reverse("model-list"), {"name": "after"}, format="json")
    assert response.status_code == 403
    assert "lacks it" in response.json()["error"]["message"]
    assert client.get(reverse("model-list")).status_code == 200  # reading is still allowed
    token = ApiToken.objects.get(token_hash=hash_secret(raw))
    assert token.scopes == ["read"]
    event = AuditEvent.objects.get(tenant=world_a.tenant, action="api_token.scopes_narrowed")
    assert event.before == {"scopes": ["deploy", "read", "write"]}
    assert event.after["scopes"] == ["read"]


def test_demotion_in_another_process_reaches_this_cache(world_a: TenantWorld) -> None:
    """Another process demoted the member: this one only sees Redis (no local copy)."""
    _set_role(world_a, world_a.operator, Role.OWNER)
    raw = _token_of(world_a, world_a.operator, ["read", "write"])
    client = _warm(raw)
    _set_role(world_a, world_a.operator, Role.VIEWER)
    ratelimit._value_memo.clear()
    assert client.post(reverse("model-list"), {"name": "x"}, format="json").status_code == 403
    assert client.get(reverse("model-list")).status_code == 200


def test_promotion_widens_no_token_and_a_cold_token_is_capped_by_its_creators_role(
    world_a: TenantWorld,
) -> None:
    _set_role(world_a, world_a.operator, Role.OWNER)
    raw = _token_of(world_a, world_a.operator, ["read", "write"])
    _set_role(world_a, world_a.operator, Role.VIEWER)
    _set_role(world_a, world_a.operator, Role.OWNER)
    token_cache.clear()
    client = _bearer(raw)
    assert client.post(reverse("model-list"), {"name": "x"}, format="json").status_code == 403
    # A row narrowed by nobody (written before the rule) is still capped at authentication.
    ApiToken.objects.filter(token_hash=hash_secret(raw)).update(scopes=["read", "write"])
    world_a.tenant.tenants_membership_set.filter(user=world_a.operator).update(role=Role.VIEWER)
    token_cache.clear()
    assert client.post(reverse("model-list"), {"name": "y"}, format="json").status_code == 403
    assert client.get(reverse("model-list")).status_code == 200


def test_a_token_whose_creator_left_is_refused_even_unrevoked(world_a: TenantWorld) -> None:
    _set_role(world_a, world_a.operator, Role.OWNER)
    raw = _token_of(world_a, world_a.operator, ["read"])
    world_a.tenant.tenants_membership_set.filter(user=world_a.operator).delete()  # no service
    token_cache.clear()
    response = _bearer(raw).get(reverse("model-list"))
    assert response.status_code == 401
    assert "left the tenant" in response.json()["error"]["message"]


def test_warm_narrowable_tokens_still_need_no_postgres_for_authentication(
    world_a: TenantWorld, django_assert_num_queries: Any
) -> None:
    _set_role(world_a, world_a.operator, Role.OWNER)
    raw = _token_of(world_a, world_a.operator, ["read", "write"])
    client = _warm(raw)
    with django_assert_num_queries(1):  # the model list itself
        assert client.get(reverse("model-list")).status_code == 200


def test_the_members_page_shows_what_removal_revokes(client: Any, world_a: TenantWorld) -> None:
    _set_role(world_a, world_a.operator, Role.OWNER)
    _token_of(world_a, world_a.operator, ["read"], name="one")
    _token_of(world_a, world_a.operator, ["read"], name="two")
    services.invitation_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.operator),
        email="friend@elsewhere.example", role=Role.VIEWER,
    )  # fmt: skip
    client.force_login(world_a.owner)
    url = reverse("tenant-members", args=[world_a.tenant.slug])
    page = client.get(url).content.decode()
    pk = _membership(world_a, world_a.operator).pk
    assert f'data-testid="revokes-{pk}">revokes 2 tokens, 1 invitation<' in page
    response = client.post(reverse("member-remove", args=[world_a.tenant.slug, pk]), follow=True)
    assert "revoked 2 API token(s) and 1 pending invitation(s)" in response.content.decode()
    viewer_client = APIClient()
    viewer_client.force_login(world_a.viewer)
    assert "revokes-" not in viewer_client.get(url).content.decode()  # owners only


# --- sockets -------------------------------------------------------------------------------


def _gpu_socket(world: TenantWorld, user: User) -> WebsocketCommunicator:
    from portal.asgi import application

    headers = [ORIGIN, (b"cookie", session_cookie(user))]
    return WebsocketCommunicator(application, f"/ws/gpu/?tenant={world.tenant.slug}", headers)


async def _closed_with(comm: WebsocketCommunicator, timeout: float = 5) -> int:
    output: dict[str, Any] = await comm.receive_output(timeout=timeout)
    while output["type"] == "websocket.send":  # a GPU sample may come first
        output = await comm.receive_output(timeout=timeout)
    assert output["type"] == "websocket.close", output
    return int(output["code"])


@pytest.mark.django_db(transaction=True)
def test_a_removed_members_open_sockets_are_closed_with_4403(world_a: TenantWorld) -> None:
    from channels.db import database_sync_to_async

    incidents = incidents_socket(world_a.tenant.slug, world_a.operator)
    gpu = _gpu_socket(world_a, world_a.operator)
    bystander = incidents_socket(world_a.tenant.slug, world_a.viewer)

    async def scenario() -> tuple[int, int, bool]:
        for comm in (incidents, gpu, bystander):
            assert (await comm.connect(timeout=5))[0]
        assert await incidents.receive_nothing(timeout=0.3)
        await database_sync_to_async(_remove)(world_a, world_a.operator)
        codes = (await _closed_with(incidents), await _closed_with(gpu))
        still_open = await bystander.receive_nothing(timeout=0.5)
        await bystander.disconnect()
        return codes[0], codes[1], still_open

    incidents_code, gpu_code, bystander_open = async_to_sync(scenario)()
    assert incidents_code == gpu_code == FORBIDDEN == 4403
    assert bystander_open  # another member's socket is untouched


@pytest.mark.django_db(transaction=True)
def test_a_demoted_members_sockets_stay_open(world_a: TenantWorld) -> None:
    from channels.db import database_sync_to_async

    comm = incidents_socket(world_a.tenant.slug, world_a.operator)

    async def scenario() -> bool:
        assert (await comm.connect(timeout=5))[0]
        await database_sync_to_async(_set_role)(world_a, world_a.operator, Role.VIEWER)
        kept = await comm.receive_nothing(timeout=0.5)
        await comm.disconnect()
        return bool(kept)

    assert async_to_sync(scenario)()  # viewers still read the stream
