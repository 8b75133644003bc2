"""The API's shared plumbing: one error shape, cursor pagination, filters, schema, query budget."""

from __future__ import annotations

import base64

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


@pytest.mark.parametrize("position", ["%00", "abc", "1.5"])
def test_a_forged_cursor_is_a_404_not_a_500(world_a: TenantWorld, position: str) -> None:
    """Found while fuzzing the API: DRF checks a cursor's offset, not its position, which went
    into `id < position` and raised ValueError for anything but a number."""
    client = world_a.client("token")
    cursor = base64.b64encode(f"p={position}".encode()).decode()
    for name in ("audit-event-list", "token-list", "model-list"):
        response = client.get(reverse(name), {"cursor": cursor})
        assert response.status_code == 404, (name, response.status_code)
        assert response.json()["error"] == {
            "code": "not_found",
            "message": "Invalid cursor",
            "fields": {},
        }
    issued = base64.b64encode(b"p=999999999").decode()
    assert client.get(reverse("audit-event-list"), {"cursor": issued}).status_code == 200


def test_audit_filters(world_a: TenantWorld) -> None:
    client = world_a.client("token")
    body = client.get(reverse("audit-event-list"), {"action": "api_token.created"}).json()
    assert body["results"] and {e["action"] for e in body["results"]} == {"api_token.created"}
    body = client.get(reverse("audit-event-list"), {"action_prefix": "membership."}).json()
    assert {e["action"] for e in body["results"]} <= {"membership.created"}
    bad = client.get(reverse("audit-event-list"), {"created_after": "yesterday"})
    assert bad.status_code == 400
    assert "created_after" in bad.json()["error"]["fields"]


def test_audit_time_filters_take_any_iso_offset(world_a: TenantWorld) -> None:
    """Found by the schema fuzzer: offsets beyond PostgreSQL's 15:59 were a DataError (500);
    they are converted to UTC now, and a time outside UTC's calendar is a 400."""
    client = world_a.client("token")
    url = reverse("audit-event-list")
    everything = client.get(url, {"created_after": "1077-01-17T12:08:57.57-22:55"})
    assert everything.status_code == 200 and everything.json()["results"]
    nothing = client.get(url, {"created_before": "1077-01-17T12:08:57.57+23:59"})
    assert nothing.status_code == 200 and nothing.json()["results"] == []
    for name, value in (
        ("created_after", "0001-01-01T00:00:00+14:00"),
        ("created_before", "9999-12-31T23:59:59-01:00"),
    ):
        response = client.get(url, {name: value})
        assert response.status_code == 400
        assert list(response.json()["error"]["fields"]) == [name]


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
