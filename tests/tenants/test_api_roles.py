"""Role and scope matrix: viewers cannot write, operators cannot manage members or tokens."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tenants import services
from tenants.actors import Actor
from tenants.models import Membership
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _target(world: TenantWorld, what: str) -> Any:
    if what == "viewer-membership":
        return Membership.objects.get(tenant=world.tenant, user=world.viewer).pk
    if what == "quota":
        return world.tenant.tenants_quota_set.get().pk
    if what == "token":
        return world.token.pk
    if what == "invitation":
        invitation, _ = services.invitation_create(
            tenant=world.tenant,
            actor=Actor(user=world.owner),
            email="x@acme.example",
            role="viewer",
        )
        return invitation.pk
    raise AssertionError(what)


# (name, method, url name, lookup target or None, body, expected {viewer, operator, owner})
MATRIX = [
    ("list members", "get", "member-list", None, None, (200, 200, 200)),
    ("change role", "patch", "member-detail", "viewer-membership", {"role": "operator"}, (403, 403, 200)),
    ("remove member", "delete", "member-detail", "viewer-membership", None, (403, 403, 204)),
    ("list invitations", "get", "invitation-list", None, None, (403, 403, 200)),
    ("invite", "post", "invitation-list", None, {"email": "n@acme.example", "role": "viewer"}, (403, 403, 201)),
    ("revoke invitation", "delete", "invitation-detail", "invitation", None, (403, 403, 204)),
    ("list tokens", "get", "token-list", None, None, (403, 403, 200)),
    ("create token", "post", "token-list", None, {"name": "t", "scopes": ["read"]}, (403, 403, 201)),
    ("revoke token", "post", "token-revoke", "token", None, (403, 403, 200)),
    ("rename tenant", "patch", "tenant-detail", "slug", {"name": "Acme 2"}, (403, 403, 200)),
    ("read tenant", "get", "tenant-detail", "slug", None, (200, 200, 200)),
    ("read quota", "get", "quota-list", None, None, (200, 200, 200)),
    ("raise own quota", "patch", "quota-detail", "quota", {"max_gpus": 64}, (403, 403, 403)),
    ("audit log", "get", "audit-event-list", None, None, (200, 200, 200)),
]  # fmt: skip


@pytest.mark.parametrize("row", MATRIX, ids=[row[0] for row in MATRIX])
@pytest.mark.parametrize("role_index", [0, 1, 2], ids=["viewer", "operator", "owner"])
def test_role_matrix(row: tuple, role_index: int, world_a: TenantWorld) -> None:
    _, method, url_name, target, body, expected = row
    role = ("viewer", "operator", "owner")[role_index]
    kwargs = {}
    if target == "slug":
        kwargs = {"slug": world_a.tenant.slug}
    elif target is not None:
        kwargs = {"pk": _target(world_a, target)}
    client = world_a.client(role)
    response = getattr(client, method)(reverse(url_name, kwargs=kwargs), data=body, format="json")
    assert response.status_code == expected[role_index], response.content
    if response.status_code == 403:
        assert response.json()["error"]["code"] == "forbidden"


@pytest.mark.parametrize(
    ("scopes", "method", "url_name", "body", "expected"),
    [
        (["read"], "get", "member-list", None, 200),
        (["read"], "post", "invitation-list", {"email": "n@acme.example", "role": "viewer"}, 403),
        (["read", "write", "deploy"], "get", "token-list", None, 403),
        (["read", "write", "deploy"], "post", "token-list", {"name": "x", "scopes": ["read"]}, 403),
        (["admin"], "get", "token-list", None, 200),
        (["admin"], "get", "audit-event-list", None, 403),
        (["read", "admin"], "post", "token-list", {"name": "x", "scopes": ["read"]}, 201),
    ],
)
def test_token_scopes_are_enforced(
    scopes: list[str], method: str, url_name: str, body: Any, expected: int, world_a: TenantWorld
) -> None:
    _, raw = services.api_token_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), name="scoped", scopes=scopes
    )
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = getattr(client, method)(reverse(url_name), data=body, format="json")
    assert response.status_code == expected, response.content
    if expected == 403:
        assert "scope" in response.json()["error"]["message"]
