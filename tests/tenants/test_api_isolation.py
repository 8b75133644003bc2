"""Isolation matrix: tenant B's token and session against every API route and tenant A's objects.

Routes are discovered from the URL conf; a new tenant-scoped route joins the matrix by itself.
Object routes must answer 404 (or 403 for a missing role), never 2xx; list routes must carry
none of A's data; create routes must never write into A.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

import pytest
from django.db import models
from django.urls import reverse
from rest_framework.test import APIClient

from tenants.models import AuditEvent
from tests.api_routes import Route, api_routes, kwargs_of, model_of
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

SCOPED = [r for r in api_routes() if r.tenant_scoped]


def test_the_matrix_sees_the_api() -> None:
    names = {r.name for r in SCOPED}
    assert {
        "member-list",
        "member-detail",
        "token-list",
        "token-revoke",
        "audit-event-list",
        "model-list",
        "model-detail",
        "model-version-list",
        "model-version-detail",
        "model-version-upload",
    } <= names


def _model_of(route: Route) -> type[models.Model]:
    model = model_of(route)
    assert model is not None, f"{route.view_class.__name__} must declare queryset"
    return model


def _a_markers(world_a: TenantWorld) -> list[str]:
    return [
        world_a.tenant.slug,
        world_a.tenant.name,
        world_a.owner.email,
        world_a.viewer.email,
        world_a.token.prefix,
        "acme.example",
    ]


def _clients(world_b: TenantWorld, world_a: TenantWorld) -> dict[str, APIClient]:
    with_header = world_b.client("owner")
    with_header.credentials(HTTP_X_TENANT=world_a.tenant.slug)
    return {
        "b-token": world_b.client("token"),
        "b-owner-session": world_b.client("owner"),
        "b-viewer-session": world_b.client("viewer"),
        "b-session-claiming-a": with_header,
    }


def _send(client: APIClient, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    return getattr(client, method.lower())(url, data=body or {}, format="json")


def _hostile_body(world_a: TenantWorld) -> dict[str, Any]:
    """A body that names A's tenant and ids wherever a field could take them."""
    return {
        "tenant": world_a.tenant.pk,
        "tenant_id": world_a.tenant.pk,
        "tenant_slug": world_a.tenant.slug,
        "name": "intruder",
        "email": "intruder@globex.example",
        "role": "owner",
        "scopes": ["read"],
    }


@pytest.mark.parametrize("route", [r for r in SCOPED if r.detail], ids=lambda r: r.name)
def test_b_cannot_touch_a_objects(route: Route, world_a: TenantWorld, world_b: TenantWorld) -> None:
    url = reverse(route.name, kwargs=kwargs_of(route, world_a))
    before = AuditEvent.objects.filter(tenant=world_a.tenant).count()
    for who, client in _clients(world_b, world_a).items():
        for method in route.methods:
            response = _send(client, method, url, _hostile_body(world_a))
            assert response.status_code in (403, 404), (who, method, url, response.status_code)
            body = response.content.decode()
            for marker in _a_markers(world_a):
                assert marker not in body, (who, method, url, marker)
            if response.status_code == 404:
                assert json.loads(body)["error"]["code"] == "not_found"
    assert AuditEvent.objects.filter(tenant=world_a.tenant).count() == before


@pytest.mark.parametrize("route", [r for r in SCOPED if not r.detail], ids=lambda r: r.name)
def test_b_lists_and_creates_see_and_touch_nothing_of_a(
    route: Route, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    url = reverse(route.name, kwargs=kwargs_of(route, world_a))
    model = _model_of(route)
    a_rows = (
        model.objects.filter(tenant=world_a.tenant).count()
        if any(f.name == "tenant" for f in model._meta.fields)
        else None
    )
    a_audit = AuditEvent.objects.filter(tenant=world_a.tenant).count()
    for who, client in _clients(world_b, world_a).items():
        for method in route.methods:
            response = _send(client, method, url, _hostile_body(world_a))
            body = response.content.decode()
            for marker in _a_markers(world_a):
                assert marker not in body, (who, method, url, marker)
            contextless = route.actions.get(method.lower()) in getattr(
                route.view_class, "contextless_actions", ()
            )
            if who == "b-session-claiming-a" and not contextless:
                assert response.status_code == 404, (who, method, url, response.status_code)
            if route.parent_kwargs:  # under one of A's objects: as if it did not exist
                assert response.status_code in (403, 404), (who, method, url, response.status_code)
    if a_rows is not None:
        assert model.objects.filter(tenant=world_a.tenant).count() == a_rows
    assert AuditEvent.objects.filter(tenant=world_a.tenant).count() == a_audit


@pytest.mark.parametrize("route", SCOPED, ids=lambda r: r.name)
def test_anonymous_is_refused_everywhere(route: Route, world_a: TenantWorld) -> None:
    url = reverse(route.name, kwargs=kwargs_of(route, world_a))
    for method in route.methods:
        response = _send(APIClient(), method, url)
        assert response.status_code in (401, 403), (method, url, response.status_code)
        assert response.json()["error"]["code"] in ("not_authenticated", "forbidden")


def test_foreign_and_missing_objects_give_the_same_404(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    client = world_b.client("token")
    foreign = client.get(reverse("token-detail", kwargs={"pk": world_a.token.pk}))
    missing = client.get(reverse("token-detail", kwargs={"pk": 999_999_999}))
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json() == missing.json()


@pytest.mark.parametrize("slug", ["ac%00me", "acme%0A", "%C3%A9cme"])
def test_a_slug_no_tenant_can_have_gives_the_same_404(world_a: TenantWorld, slug: str) -> None:
    """Found while fuzzing the API: a NUL byte in the slug (URL, or X-Tenant header of a
    session) reached PostgreSQL and was a 500."""
    client = world_a.client("token")
    missing = client.get("/api/v1/tenants/no-such-tenant/")
    for response in (
        client.get(f"/api/v1/tenants/{slug}/"),
        client.patch(f"/api/v1/tenants/{slug}/", {"name": "x"}, format="json"),
    ):
        assert response.status_code == missing.status_code == 404
        assert response.json() == missing.json()
    session = world_a.client("owner")
    session.credentials(HTTP_X_TENANT=unquote(slug))
    unknown = world_a.client("owner")
    unknown.credentials(HTTP_X_TENANT="no-such-tenant")
    response, expected = session.get("/api/v1/members/"), unknown.get("/api/v1/members/")
    assert response.status_code == expected.status_code == 404
    assert response.json() == expected.json()


def test_b_cannot_accept_or_guess_a_invitation(world_a: TenantWorld, world_b: TenantWorld) -> None:
    from tenants import services
    from tenants.actors import Actor

    _, raw = services.invitation_create(
        tenant=world_a.tenant,
        actor=Actor(user=world_a.owner),
        email="newbie@acme.example",
        role="owner",
    )
    client = world_b.client("owner")
    response = client.post(reverse("api-invitation-accept"), {"token": raw}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "token": ["This invitation is addressed to another e-mail address."]
    }
    assert not world_a.tenant.tenants_membership_set.filter(user=world_b.owner).exists()
    token_client = world_b.client("token")
    response = token_client.post(reverse("api-invitation-accept"), {"token": raw}, format="json")
    assert response.status_code == 403


@pytest.fixture(autouse=True)
def _objects_of_a_for_the_route(request: pytest.FixtureRequest) -> None:
    """A's object for a route whose model `make_world` does not build (OBJECT_FACTORIES in
    tests.api_routes), so the route is walked against a real object of A."""
    from tests.api_routes import OBJECT_FACTORIES, build_object_of

    callspec = getattr(request.node, "callspec", None)
    route = callspec.params.get("route") if callspec is not None else None
    if not isinstance(route, Route) or "world_a" not in request.fixturenames:
        return
    model = _model_of(route)
    if model._meta.label not in OBJECT_FACTORIES:
        return
    world_a = request.getfixturevalue("world_a")
    if not model.objects.filter(tenant=world_a.tenant).exists():
        build_object_of(model, world_a)
