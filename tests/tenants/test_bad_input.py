"""Bad input on every write endpoint: 400 that names the field, and nothing written.

The table must cover every API route and method that takes a body; a new write endpoint
without a row here fails `test_every_write_endpoint_is_covered`.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.urls import reverse
from rest_framework.test import APIClient

from tenants.models import Membership
from tests.api_routes import api_routes
from tests.conftest import TenantWorld, make_user

pytestmark = pytest.mark.django_db

# Routes/methods that take no body (DELETE, action without input) and are not in the table.
BODYLESS = {("token-revoke", "POST")}

# (url name, method, lookup, body, field that must be named)
CASES: list[tuple[str, str, str | None, Any, str]] = [
    ("api-signup", "POST", None, {"email": "nope", "password": "x", "organisation": "O"}, "email"),
    ("api-signup", "POST", None, {"email": "a@b.example", "organisation": "O"}, "password"),
    ("api-signup", "POST", None, {"email": "a@b.example", "password": "Zq8!longpass"}, "organisation"),
    ("api-signup", "POST", None, {"email": "a@b.example", "password": "123", "organisation": "O"}, "password"),
    ("api-invitation-accept", "POST", None, {}, "token"),
    ("api-invitation-accept", "POST", None, {"token": "inv_bogus"}, "token"),
    ("tenant-list", "POST", None, {"name": ""}, "name"),
    ("tenant-list", "POST", None, {"name": "x" * 121}, "name"),
    ("tenant-detail", "PATCH", "slug", {"name": ""}, "name"),
    ("tenant-detail", "PATCH", "slug", {}, "name"),
    ("member-detail", "PATCH", "member", {"role": "god"}, "role"),
    ("member-detail", "PATCH", "member", {}, "role"),
    ("invitation-list", "POST", None, {"email": "not-mail", "role": "viewer"}, "email"),
    ("invitation-list", "POST", None, {"email": "ok@acme.example", "role": "root"}, "role"),
    ("invitation-list", "POST", None, {"role": "viewer"}, "email"),
    ("token-list", "POST", None, {"scopes": ["read"]}, "name"),
    ("token-list", "POST", None, {"name": "t"}, "scopes"),
    ("token-list", "POST", None, {"name": "t", "scopes": []}, "scopes"),
    ("token-list", "POST", None, {"name": "t", "scopes": ["root"]}, "scopes"),
    ("token-list", "POST", None, {"name": "t", "scopes": ["read"], "expires_in_days": 0}, "expires_in_days"),
    ("token-list", "POST", None, {"name": "t", "scopes": ["read"], "expires_in_days": 99999}, "expires_in_days"),
    ("token-list", "POST", None, {"name": "t", "scopes": ["read"], "rate_limit_per_second": 0}, "rate_limit_per_second"),
    ("quota-detail", "PATCH", "quota", {"max_gpus": -1}, "max_gpus"),
    ("quota-detail", "PATCH", "quota", {"requests_per_second": "fast"}, "requests_per_second"),
]  # fmt: skip


def _row_counts() -> dict[str, int]:
    counts = {}
    for model in apps.get_models():
        if model._meta.app_label in {"tenants", "auth", "serving", "incidents"}:
            counts[model._meta.label] = model.objects.count()
    return counts


def _client_for(name: str, world: TenantWorld) -> APIClient:
    if name == "api-signup":
        return APIClient()
    if name == "quota-detail":
        staff = make_user("sre@platform.example")
        staff.is_staff = True
        staff.save()
        Membership.objects.create(tenant=world.tenant, user=staff, role="owner")
        client = APIClient()
        client.force_login(staff)
        return client
    return world.client("owner")


def test_every_write_endpoint_is_covered() -> None:
    covered = {(name, method) for name, method, *_ in CASES} | BODYLESS
    for route in api_routes():
        for method in route.methods:
            if method in ("POST", "PUT", "PATCH") and route.name not in ("api-schema",):
                assert (route.name, method) in covered, (
                    f"add bad-input cases for {method} {route.pattern}"
                )


@pytest.mark.parametrize(("name", "method", "lookup", "body", "field"), CASES)
def test_bad_input_names_the_field_and_writes_nothing(
    name: str, method: str, lookup: str | None, body: Any, field: str, world_a: TenantWorld
) -> None:
    client = _client_for(name, world_a)
    kwargs: dict[str, Any] = {}
    if lookup == "slug":
        kwargs = {"slug": world_a.tenant.slug}
    elif lookup == "member":
        kwargs = {"pk": Membership.objects.get(tenant=world_a.tenant, user=world_a.viewer).pk}
    elif lookup == "quota":
        kwargs = {"pk": world_a.tenant.tenants_quota_set.get().pk}
    before = _row_counts()
    response = getattr(client, method.lower())(reverse(name, kwargs=kwargs), body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    named = [key for key in error["fields"] if key == field or key.startswith(f"{field}[")]
    assert named, error
    assert field in error["message"]
    assert _row_counts() == before


def test_malformed_json_is_a_clear_400(world_a: TenantWorld) -> None:
    response = world_a.client("owner").generic(
        "POST", reverse("token-list"), "{not json", content_type="application/json"
    )
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]
