"""The API's shared plumbing: one error shape, cursor pagination, filters, schema, query budget."""

from __future__ import annotations

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from tenants.models import AuditEvent
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def test_errors_have_one_shape(world_a: TenantWorld) -> None:
    client = world_a.client("token")
    cases = [
        (client.get("/api/v1/tokens/999999/"), 404, "not_found"),
        (client.put(reverse("quota-list"), {}, format="json"), 405, "method_not_allowed"),
        (APIClient().get(reverse("member-list")), 401, "not_authenticated"),
        (client.post(reverse("token-list"), {}, format="json"), 400, "invalid"),
    ]
    for response, status, code in cases:
        assert response.status_code == status
        body = response.json()
        assert set(body) == {"error"}
        assert set(body["error"]) == {"code", "message", "fields"}
        assert body["error"]["code"] == code
        assert "Traceback" not in response.content.decode()


def test_audit_events_paginate_by_cursor_with_a_constant_query_count(
    world_a: TenantWorld, django_assert_max_num_queries
) -> None:
    AuditEvent.objects.bulk_create(
        AuditEvent(
            tenant=world_a.tenant,
            actor_label="bulk",
            action="bench.event",
            object_type="x",
            object_id=str(i),
        )
        for i in range(120)
    )
    client = world_a.client("token")
    seen: list[int] = []
    url = reverse("audit-event-list") + "?page_size=50"
    pages = 0
    while url:
        with django_assert_max_num_queries(6):
            body = client.get(url).json()
        seen.extend(item["id"] for item in body["results"])
        url = body["next"]
        pages += 1
    total = AuditEvent.objects.filter(tenant=world_a.tenant).count()
    assert len(seen) == len(set(seen)) == total
    assert seen == sorted(seen, reverse=True)
    assert pages == -(-total // 50)


def test_audit_filters(world_a: TenantWorld) -> None:
    client = world_a.client("token")
    body = client.get(reverse("audit-event-list"), {"action": "api_token.created"}).json()
    assert body["results"] and {e["action"] for e in body["results"]} == {"api_token.created"}
    body = client.get(reverse("audit-event-list"), {"action_prefix": "membership."}).json()
    assert {e["action"] for e in body["results"]} <= {"membership.created"}
    bad = client.get(reverse("audit-event-list"), {"created_after": "yesterday"})
    assert bad.status_code == 400
    assert "created_after" in bad.json()["error"]["fields"]


def test_members_filter_and_query_budget(
    world_a: TenantWorld, django_assert_max_num_queries
) -> None:
    client = world_a.client("owner")
    with django_assert_max_num_queries(8):
        body = client.get(reverse("member-list"), {"role": "viewer"}).json()
    assert [m["email"] for m in body["results"]] == [world_a.viewer.email]


def test_schema_and_docs_are_served() -> None:
    client = APIClient()
    schema = client.get(reverse("api-schema"))
    assert schema.status_code == 200
    text = schema.content.decode()
    assert text.startswith("openapi: 3")
    for path in ("/api/v1/tokens/", "/api/v1/audit-events/", "/api/v1/signup/"):
        assert path in text
    assert "bearerAuth" in text
    docs = client.get(reverse("api-docs"))
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()


def test_signup_through_the_api_signs_in(db) -> None:
    client = APIClient()
    response = client.post(
        reverse("api-signup"),
        {"email": "api@new.example", "password": "Sturdy-pass-2026", "organisation": "New Co"},
        format="json",
    )
    assert response.status_code == 201
    assert response.json()["tenant"]["slug"] == "new-co"
    assert "password" not in response.content.decode()
    me = client.get(reverse("tenant-list")).json()
    assert [t["slug"] for t in me] == ["new-co"]
