"""The incidents REST API: roles, tenant isolation, bad input, the shapes, query budgets."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from incidents import services
from incidents.models import CauseRule
from incidents.notifications.models import NotificationChannel
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.factories import breach, deployment_of

pytestmark = pytest.mark.django_db


def _url(name: str, **kwargs: Any) -> str:
    return reverse(name, kwargs=kwargs or None)


def test_list_filters_and_detail(world_a: TenantWorld) -> None:
    _, open_one, _ = breach(world_a)
    _, drill, _ = breach(world_a, objective="latency", severity="ticket", is_drill=True)
    services.incident_resolve(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), incident=drill
    )
    client = world_a.client("viewer")
    listed = client.get(_url("incident-list")).json()["results"]
    assert [i["id"] for i in listed] == [drill.pk, open_one.pk]
    assert listed[1]["deployment_name"] == "assistant" and "events" not in listed[1]
    for query, expected in [
        ({"status": "resolved"}, [drill.pk]),
        ({"severity": "page"}, [open_one.pk]),
        ({"is_drill": "true"}, [drill.pk]),
        ({"deployment": deployment_of(world_a).pk}, [drill.pk, open_one.pk]),
        ({"deployment": 999999}, []),
    ]:
        got = client.get(_url("incident-list"), query).json()["results"]
        assert [i["id"] for i in got] == expected, query
    detail = client.get(_url("incident-detail", pk=open_one.pk)).json()
    assert [e["kind"] for e in detail["events"]] == ["breach"]
    assert detail["breaches"][0]["objective"] == "availability"
    assert detail["breaches"][0]["occurrences"] == 1
    assert detail["rollback_summary"] is None and detail["status"] == "triggered"


@pytest.mark.parametrize(
    ("role", "expected"), [("viewer", 403), ("operator", 200), ("owner", 200), ("token", 200)]
)
def test_who_may_acknowledge(world_a: TenantWorld, role: str, expected: int) -> None:
    _, incident, _ = breach(world_a)
    response = world_a.client(role).post(_url("incident-acknowledge", pk=incident.pk))
    assert response.status_code == expected, response.content
    incident.refresh_from_db()
    assert incident.status == ("acknowledged" if expected == 200 else "triggered")
    if expected == 403:
        assert response.json()["error"]["code"] == "forbidden"


def test_the_lifecycle_over_the_api(world_a: TenantWorld) -> None:
    _, incident, _ = breach(world_a)
    client = world_a.client("operator")
    assert client.post(_url("incident-mitigate", pk=incident.pk)).json()["status"] == "mitigated"
    refused = client.post(_url("incident-acknowledge", pk=incident.pk))
    assert refused.status_code == 409
    assert refused.json()["error"]["fields"] == {
        "status": ["an incident that is mitigated cannot become acknowledged."]
    }
    note = client.post(
        _url("incident-notes", pk=incident.pk), {"text": "rolled back"}, format="json"
    )
    assert note.status_code == 201 and note.json()["actor"] == "operator@acme.example"
    assert client.post(_url("incident-resolve", pk=incident.pk)).json()["status"] == "resolved"
    timeline = world_a.client("viewer").get(_url("incident-timeline", pk=incident.pk)).json()
    assert [e["kind"] for e in timeline] == ["breach", "status_changed", "note", "status_changed"]


def test_hints_and_postmortem(world_a: TenantWorld) -> None:
    _, incident, _ = breach(world_a, group="canary")
    client = world_a.client("viewer")
    hints = client.get(_url("incident-hints", pk=incident.pk)).json()
    assert hints["signals"]["canary_involved"] is True
    assert hints["hints"][0]["cause"] == "Canary regression"
    assert hints["hints"][0]["evidence"] == ["canary_involved = true"]
    response = client.get(_url("incident-postmortem", pk=incident.pk))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")
    assert response.content.decode().startswith("# Postmortem:")


def test_another_tenant_gets_404_like_a_missing_incident(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    _, incident, _ = breach(world_a)
    client = world_b.client("token")
    for name in ("incident-detail", "incident-timeline", "incident-hints", "incident-postmortem"):
        foreign = client.get(_url(name, pk=incident.pk))
        missing = client.get(_url(name, pk=999_999_999))
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json() == missing.json()
    assert client.post(_url("incident-resolve", pk=incident.pk)).status_code == 404
    assert client.get(_url("incident-list")).json()["results"] == []
    assert client.get(_url("breach-list")).json()["results"] == []
    incident.refresh_from_db()
    assert incident.status == "triggered"


def test_breaches_are_read_only(world_a: TenantWorld) -> None:
    first, _, _ = breach(world_a)
    breach(world_a)
    client = world_a.client("viewer")
    [row] = client.get(_url("breach-list")).json()["results"]
    assert row["id"] == first.pk and row["occurrences"] == 2 and row["burn_long"] == 15.0
    assert world_a.client("owner").post(_url("breach-list"), {}).status_code == 405


def test_cause_rules_crud(world_a: TenantWorld) -> None:
    client = world_a.client("operator")
    body = {"symptom": "kv_usage", "op": "gte", "threshold": 0.9, "cause": "Pool too small",
            "fix": "ask SRE", "weight": 4}  # fmt: skip
    assert (
        world_a.client("viewer").post(_url("cause-rule-list"), body, format="json").status_code
        == 403
    )
    created = client.post(_url("cause-rule-list"), body, format="json")
    assert created.status_code == 201, created.content
    rule_id = created.json()["id"]
    changed = client.patch(_url("cause-rule-detail", pk=rule_id), {"op": "true"}, format="json")
    assert changed.json()["op"] == "true" and changed.json()["threshold"] is None
    assert client.get(_url("cause-rule-list")).json()["results"][0]["cause"] == "Pool too small"
    assert client.delete(_url("cause-rule-detail", pk=rule_id)).status_code == 204
    assert not CauseRule.objects.filter(pk=rule_id).exists()


def test_channels_show_the_secret_once(world_a: TenantWorld) -> None:
    client = world_a.client("operator")
    body = {"kind": "webhook", "name": "ops", "url": "https://hooks.example.net/x"}
    created = client.post(_url("notification-channel-list"), body, format="json")
    assert created.status_code == 201, created.content
    secret = created.json()["secret"]
    channel = NotificationChannel.objects.get(pk=created.json()["id"])
    assert secret.startswith("whsec_") and channel.secret == secret
    for response in (
        client.get(_url("notification-channel-list")),
        client.get(_url("notification-channel-detail", pk=channel.pk)),
        client.patch(
            _url("notification-channel-detail", pk=channel.pk),
            {"min_severity": "page"},
            format="json",
        ),
        world_a.client("owner").get(reverse("audit-event-list")),
    ):
        assert response.status_code == 200 and secret not in response.content.decode()
    again = client.post(_url("notification-channel-list"), body, format="json")
    assert again.status_code == 409 and "name" in again.json()["error"]["fields"]
    assert client.delete(_url("notification-channel-detail", pk=channel.pk)).status_code == 204


def test_list_endpoints_stay_within_a_query_budget(
    world_a: TenantWorld, django_assert_max_num_queries: Any
) -> None:
    actor = Actor(user=world_a.owner)
    for n in range(6):
        _, opened, _ = breach(world_a, objective=f"objective-{n}")
        services.incident_resolve(tenant=world_a.tenant, actor=actor, incident=opened)
        services.cause_rule_create(
            tenant=world_a.tenant, actor=actor, symptom="kv_usage", op="gt", threshold=n,
            cause=f"cause {n}",
        )  # fmt: skip
        services.notification_channel_create(
            tenant=world_a.tenant, actor=actor, kind="email", name=f"c{n}", email=f"c{n}@x.example"
        )
    client: APIClient = world_a.client("token")
    client.get(_url("incident-list"))  # warm the token cache, like a running client
    for name in ("incident-list", "breach-list", "cause-rule-list", "notification-channel-list"):
        with django_assert_max_num_queries(2):
            assert len(client.get(_url(name)).json()["results"]) == 6, name
    _, incident, _ = breach(world_a)
    for _ in range(5):
        services.incident_note(tenant=world_a.tenant, actor=actor, incident=incident, text="n")
    with django_assert_max_num_queries(6):
        detail = client.get(_url("incident-detail", pk=incident.pk)).json()
    assert len(detail["events"]) == 6
    with django_assert_max_num_queries(3):
        assert len(client.get(_url("incident-timeline", pk=incident.pk)).json()) == 6


def test_the_schema_documents_the_incidents_api() -> None:
    text = APIClient().get(reverse("api-schema")).content.decode()
    for path in (
        "/api/v1/incidents/",
        "/api/v1/incidents/{id}/acknowledge/",
        "/api/v1/incidents/{id}/postmortem/",
        "/api/v1/breaches/",
        "/api/v1/cause-rules/{id}/",
        "/api/v1/notification-channels/",
    ):
        assert path in text, path
    assert "text/markdown" in text
