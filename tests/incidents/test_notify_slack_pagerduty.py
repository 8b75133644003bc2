"""Slack and PagerDuty channels, end to end: a real https server on 127.0.0.1 (a test CA the
delivery trusts, a certificate for hooks.example.net) receives what an incident sends, and the
exact shapes are checked: Slack's `text` + Block Kit blocks, PagerDuty's Events API v2 trigger,
acknowledge and resolve under one dedup_key. Every link is the incident's page. Channel input
is checked per kind (API and page), each error naming its field; secrets are never read back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from incidents import services
from incidents.models import Incident, IncidentEvent
from incidents.notifications import delivery as notify
from incidents.notifications import formats
from incidents.notifications.models import NotificationChannel, NotificationDelivery
from portal import netguard
from portal.celery import app as celery_app
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld
from tests.incidents.factories import breach
from tests.incidents.tls_receiver import JsonReceiver, tls_contexts

pytestmark = pytest.mark.django_db

BASE = "https://portal.example.org"
ROUTING_KEY = "R0ut1ngKeyR0ut1ngKeyR0ut1ngKey42"  # 32 characters, like PagerDuty's


@pytest.fixture(autouse=True)
def _setup(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    monkeypatch.setitem(celery_app.conf, "task_eager_propagates", False)
    settings.PORTAL_BASE_URL = BASE + "/"  # a trailing slash is not doubled
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the receiver is on loopback


@pytest.fixture
def receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JsonReceiver]:
    server, client = tls_contexts(tmp_path)
    monkeypatch.setattr(notify, "_tls_context", lambda: client)  # trusts the test CA only
    receiver = JsonReceiver(server)
    yield receiver
    receiver.stop()


def _page(world: TenantWorld, incident: Incident) -> str:
    return f"{BASE}/t/{world.tenant.slug}/incidents/{incident.pk}/"


def _channel(world: TenantWorld, kind: str, **fields: Any) -> NotificationChannel:
    channel, secret = services.notification_channel_create(
        tenant=world.tenant, actor=Actor(user=world.owner), kind=kind, name=kind, **fields
    )
    assert bool(secret) == (kind == "webhook")  # a signing secret for webhooks only
    return channel


def test_a_slack_channel_gets_text_and_blocks_linking_the_incident_page(
    world_a: TenantWorld, receiver: JsonReceiver, django_capture_on_commit_callbacks: Any
) -> None:
    _channel(world_a, "slack", url=receiver.url("/services/T0001/B0001/XXXXXXXXXXXXXXXX"))
    with django_capture_on_commit_callbacks(execute=True):
        _, incident, _ = breach(world_a)
    [request] = receiver.requests
    assert request["path"] == "/services/T0001/B0001/XXXXXXXXXXXXXXXX"
    assert request["headers"]["content-type"] == "application/json"
    assert "x-portal-signature" not in request["headers"]  # Slack's URL is the credential
    page = _page(world_a, incident)
    n = incident.pk
    assert request["body"] == {
        "text": f"[PAGE] #{n} assistant: availability breached (stable) (triggered): <{page}|open>",
        "blocks": [
            {
                "type": "header",
                "text": {"type": "plain_text", "text": "[PAGE] assistant: availability breached (stable)"},
            },
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": "*Deployment*\nassistant"},
                    {"type": "mrkdwn", "text": "*Version*\nserved:s1"},
                    {"type": "mrkdwn", "text": "*SLI*\navailability (stable)"},
                    {"type": "mrkdwn", "text": "*Burn*\n15.0x / 20.0x (long / short window)"},
                ],
            },
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": f"Incident #{n} \u00b7 triggered \u00b7 breach: availability "
                        "(burn, stable): burn rate 14.4x over 1h/5m",
                    }
                ],
            },
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "action_id": "open_incident",
                        "text": {"type": "plain_text", "text": f"Open incident #{n}"},
                        "url": page,
                    }
                ],
            },
        ],
    }  # fmt: skip
    delivery = NotificationDelivery.objects.get(incident=incident)
    assert (delivery.status, delivery.response_code) == ("sent", 202)


def test_pagerduty_triggers_acknowledges_and_resolves_one_alert(
    world_a: TenantWorld, receiver: JsonReceiver, django_capture_on_commit_callbacks: Any
) -> None:
    _channel(world_a, "pagerduty", url=receiver.url("/v2/enqueue"), routing_key=ROUTING_KEY)
    actor = Actor(user=world_a.owner)
    with django_capture_on_commit_callbacks(execute=True):
        _, incident, _ = breach(world_a)
    with django_capture_on_commit_callbacks(execute=True):
        services.incident_acknowledge(tenant=world_a.tenant, actor=actor, incident=incident)
    with django_capture_on_commit_callbacks(execute=True):
        services.incident_resolve(tenant=world_a.tenant, actor=actor, incident=incident)
    assert [r["path"] for r in receiver.requests] == ["/v2/enqueue"] * 3
    trigger, ack, resolve = receiver.bodies()
    key = f"aiops-portal/tenant-{world_a.tenant.pk}/incident-{incident.pk}"
    page = _page(world_a, incident)
    event = IncidentEvent.objects.get(incident=incident, kind="breach")
    assert trigger == {
        "routing_key": ROUTING_KEY,
        "event_action": "trigger",
        "dedup_key": key,
        "payload": {
            "summary": f"#{incident.pk} assistant: availability breached (stable)",
            "source": f"{world_a.tenant.slug}/assistant",
            "severity": "critical",
            "timestamp": event.at.isoformat(),
            "component": "assistant",
            "group": "stable",
            "class": "burn",
            "custom_details": {
                "incident": incident.pk,
                "status": "triggered",
                "severity": "page",
                "is_drill": False,
                "deployment": "assistant",
                "version": "served:s1",
                "sli": "availability (stable)",
                "burn": "15.0x / 20.0x (long / short window)",
                "event": "breach",
                "message": "availability (burn, stable): burn rate 14.4x over 1h/5m",
                "url": page,
            },
        },
        "links": [{"href": page, "text": f"Incident #{incident.pk} in the AI Ops Portal"}],
        "client": "AI Ops Portal",
        "client_url": page,
    }
    assert ack == {"routing_key": ROUTING_KEY, "event_action": "acknowledge", "dedup_key": key}
    assert resolve == {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": key}
    assert set(NotificationDelivery.objects.values_list("status", flat=True)) == {"sent"}


def test_pagerduty_severity_and_actions_follow_the_incident(world_a: TenantWorld) -> None:
    _, incident, _ = breach(world_a, severity="ticket")
    event = IncidentEvent.objects.get(incident=incident, kind="breach")
    delivery = NotificationDelivery(tenant=world_a.tenant, incident=incident, event=event)
    body = formats.pagerduty_event(formats.facts(delivery), routing_key=ROUTING_KEY)
    assert body["payload"]["severity"] == "warning"
    Incident.objects.filter(pk=incident.pk).update(is_drill=True)
    delivery.incident.refresh_from_db()
    body = formats.pagerduty_event(formats.facts(delivery), routing_key=ROUTING_KEY)
    assert body["payload"]["severity"] == "info"  # a rehearsal pages nobody
    assert body["payload"]["summary"].startswith("[drill] ")
    services.incident_mitigate(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), incident=incident
    )
    mitigated = IncidentEvent.objects.filter(incident=incident, kind="status_changed").get()
    delivery = NotificationDelivery(tenant=world_a.tenant, incident=incident, event=mitigated)
    assert formats.pagerduty_action(formats.facts(delivery)) == "acknowledge"


def test_every_kind_links_the_incident_page_never_the_api(
    world_a: TenantWorld, receiver: JsonReceiver, django_capture_on_commit_callbacks: Any
) -> None:
    _channel(world_a, "webhook", url=receiver.url("/hook"))
    _channel(world_a, "slack", url=receiver.url("/slack"))
    _channel(world_a, "pagerduty", url=receiver.url("/pd"), routing_key=ROUTING_KEY)
    with django_capture_on_commit_callbacks(execute=True):
        _, incident, _ = breach(world_a)
    by_path = {r["path"]: r["body"] for r in receiver.requests}
    assert sorted(by_path) == ["/hook", "/pd", "/slack"]
    page = _page(world_a, incident)
    assert by_path["/hook"]["incident"]["url"] == page
    assert by_path["/slack"]["blocks"][-1]["elements"][0]["url"] == page
    assert [link["href"] for link in by_path["/pd"]["links"]] == [page]
    for body in by_path.values():
        assert "/api/" not in json.dumps(body)


# --- channel input, per kind ------------------------------------------------------------------


BAD_INPUT: list[tuple[dict[str, Any], str, str]] = [
    ({"kind": "slack"}, "url", "needs an https URL"),
    ({"kind": "slack", "url": "http://hooks.example.net/services/x"}, "url", "https"),
    ({"kind": "slack", "url": "not a url"}, "url", "valid"),
    ({"kind": "pagerduty"}, "routing_key", "needs a routing key"),
    ({"kind": "pagerduty", "routing_key": "short"}, "routing_key", "32-character"),
    ({"kind": "pagerduty", "routing_key": "x" * 31 + "!"}, "routing_key", "32-character"),
    (
        {"kind": "pagerduty", "routing_key": ROUTING_KEY, "url": "http://hooks.example.net/"},
        "url",
        "https",
    ),
    ({"kind": "webhook", "url": "https://hooks.example.net/", "routing_key": ROUTING_KEY},
     "routing_key", "only a PagerDuty channel"),
    ({"kind": "email"}, "email", "needs an address"),
    ({"kind": "teams", "url": "https://hooks.example.net/"}, "kind", ""),
]  # fmt: skip


def test_bad_channel_input_names_the_field(world_a: TenantWorld) -> None:
    client = world_a.client("operator")
    for body, field, says in BAD_INPUT:
        response = client.post(
            reverse("notification-channel-list"), {"name": "ch", **body}, format="json"
        )
        assert response.status_code == 400, (body, response.content)
        assert says in " ".join(response.json()["error"]["fields"][field]), body
    assert not NotificationChannel.objects.filter(tenant=world_a.tenant).exists()


def test_pagerduty_defaults_to_the_events_endpoint(
    world_a: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = netguard.resolve
    monkeypatch.setattr(
        netguard,
        "resolve",
        lambda host, port: ["44.224.1.10"] if host == "events.pagerduty.com" else real(host, port),
    )  # a public address, answered without asking DNS; nothing is sent in this test
    client = world_a.client("operator")
    body = {"kind": "pagerduty", "name": "pd", "routing_key": ROUTING_KEY}
    response = client.post(reverse("notification-channel-list"), body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["url"] == "https://events.pagerduty.com/v2/enqueue"


def test_secrets_are_never_read_back(world_a: TenantWorld, receiver: JsonReceiver) -> None:
    client = world_a.client("owner")
    slack_url = receiver.url("/services/T0001/B0001/SeCrEtToKeN9876")
    created = client.post(
        reverse("notification-channel-list"),
        {"kind": "pagerduty", "name": "pd", "url": receiver.url("/pd"), "routing_key": ROUTING_KEY},
        format="json",
    )
    assert created.status_code == 201
    assert created.json()["routing_key"] == "****ey42" and "secret" not in created.json()
    slack = client.post(
        reverse("notification-channel-list"),
        {"kind": "slack", "name": "slack", "url": slack_url},
        format="json",
    )
    assert slack.status_code == 201
    assert slack.json()["url"] == f"https://hooks.example.net:{receiver.port}/****9876"
    listed = client.get(reverse("notification-channel-list")).content.decode()
    audit = json.dumps(list(AuditEvent.objects.filter(tenant=world_a.tenant).values()), default=str)
    for text in (created.content.decode(), slack.content.decode(), listed, audit):
        assert ROUTING_KEY not in text and "SeCrEtToKeN" not in text
    # A new key is taken (and checked); a bad one names the field and keeps the old one.
    detail = reverse("notification-channel-detail", kwargs={"pk": created.json()["id"]})
    response = client.patch(detail, {"routing_key": "nope"}, format="json")
    assert response.status_code == 400 and "routing_key" in response.json()["error"]["fields"]
    new_key = "N" * 28 + "wxyz"
    response = client.patch(detail, {"routing_key": new_key}, format="json")
    assert response.status_code == 200 and response.json()["routing_key"] == "****wxyz"
    assert NotificationChannel.objects.get(pk=created.json()["id"]).secret == new_key


# --- the page ---------------------------------------------------------------------------------


def test_the_page_creates_edits_and_removes_channels(
    world_a: TenantWorld, receiver: JsonReceiver
) -> None:
    browser = Client()
    browser.force_login(world_a.operator)
    page = reverse("notification-channels", kwargs={"slug": world_a.tenant.slug})
    form = {"kind": "pagerduty", "name": "pd", "url": receiver.url("/pd"), "min_severity": "page",
            "is_active": "on"}  # fmt: skip
    response = browser.post(page, form)
    assert response.status_code == 200
    assert "needs a routing key" in " ".join(response.context["form"].errors["routing_key"])
    assert not NotificationChannel.objects.filter(tenant=world_a.tenant).exists()
    response = browser.post(page, {**form, "routing_key": ROUTING_KEY})
    assert response.status_code == 200 and not response.context["form"].errors
    channel = NotificationChannel.objects.get(tenant=world_a.tenant)
    assert (channel.kind, channel.secret, channel.min_severity) == (
        "pagerduty",
        ROUTING_KEY,
        "page",
    )
    html = browser.get(page).content.decode()
    assert "****ey42" in html and ROUTING_KEY not in html
    edit = reverse(
        "notification-channel-edit", kwargs={"slug": world_a.tenant.slug, "pk": channel.pk}
    )
    assert ROUTING_KEY not in browser.get(edit).content.decode()
    # A blank key keeps the stored one; a bad URL is refused on its field.
    response = browser.post(edit, {"name": "pager", "url": receiver.url("/pd"),
                                   "min_severity": "ticket", "is_active": "on"})  # fmt: skip
    assert response.status_code == 302
    channel.refresh_from_db()
    assert (channel.name, channel.secret, channel.min_severity) == ("pager", ROUTING_KEY, "ticket")
    response = browser.post(edit, {"name": "pager", "url": "http://hooks.example.net/",
                                   "min_severity": "ticket"})  # fmt: skip
    assert "https" in " ".join(response.context["form"].errors["url"])
    delete = reverse(
        "notification-channel-delete", kwargs={"slug": world_a.tenant.slug, "pk": channel.pk}
    )
    assert browser.post(delete).status_code == 302
    assert not NotificationChannel.objects.filter(tenant=world_a.tenant).exists()


def test_a_viewer_sees_the_channels_but_cannot_change_them(
    world_a: TenantWorld, receiver: JsonReceiver
) -> None:
    channel = _channel(world_a, "slack", url=receiver.url("/services/T/B/abcd"))
    browser = Client()
    browser.force_login(world_a.viewer)
    page = reverse("notification-channels", kwargs={"slug": world_a.tenant.slug})
    html = browser.get(page).content.decode()
    assert (
        "slack" in html
        and "/services/T/B/abcd" not in html
        and 'data-testid="channel-form"' not in html
    )
    browser.post(page, {"kind": "slack", "name": "x", "url": receiver.url("/x")})
    assert NotificationChannel.objects.filter(tenant=world_a.tenant).count() == 1
    edit = reverse(
        "notification-channel-edit", kwargs={"slug": world_a.tenant.slug, "pk": channel.pk}
    )
    assert browser.post(edit, {"name": "renamed", "min_severity": "page"}).status_code == 403
