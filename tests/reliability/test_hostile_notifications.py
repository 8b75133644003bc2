"""A hostile tenant against the Slack and PagerDuty channels: it cannot aim them at internal
addresses (at creation, on a change of URL, or by re-pointing its DNS before a delivery), it
cannot read a neighbour's routing key (or its own back in full), and an incident with a huge
text cannot make a notification unbounded or inject Slack markup."""

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
from incidents.notifications.models import NotificationChannel, NotificationDelivery
from portal import netguard
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld
from tests.incidents.factories import breach
from tests.incidents.tls_receiver import JsonReceiver, tls_contexts

pytestmark = pytest.mark.django_db

ROUTING_KEY = "SecretRoutingKeyOfAcme0123456789"  # 32 characters
INTERNAL = [
    "https://127.0.0.1/services/T/B/x",
    "https://169.254.169.254/latest/meta-data/",
    "https://10.0.0.7/v2/enqueue",
    "https://[::1]/x",
    "https://[::ffff:127.0.0.1]/x",
    "https://localhost/x",
    "https://hooks.example.net/x",  # the suite's resolver answers 127.0.0.1
    "https://2130706433/x",
    "https://user:pw@hooks.example.net/x",
]


@pytest.fixture
def receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JsonReceiver]:
    server, client = tls_contexts(tmp_path)
    monkeypatch.setattr(notify, "_tls_context", lambda: client)
    receiver = JsonReceiver(server)
    yield receiver
    receiver.stop()


def test_a_channel_cannot_aim_at_an_internal_address(
    world_a: TenantWorld, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = []  # the platform's default: public addresses only
    real = netguard.resolve
    monkeypatch.setattr(
        netguard, "resolve", lambda h, p: ["127.0.0.1"] if h == "localhost" else real(h, p)
    )
    client = world_a.client("owner")
    for kind in ("slack", "pagerduty"):
        for url in INTERNAL:
            body = {"kind": kind, "name": "evil", "url": url}
            if kind == "pagerduty":
                body["routing_key"] = ROUTING_KEY
            response = client.post(reverse("notification-channel-list"), body, format="json")
            assert response.status_code == 400, (kind, url, response.content)
            assert "url" in response.json()["error"]["fields"], (kind, url)
    assert not NotificationChannel.objects.filter(tenant=world_a.tenant).exists()


def test_dns_re_pointed_after_creation_sends_nothing_internal(
    world_a: TenantWorld,
    settings: Any,
    receiver: JsonReceiver,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # allowed while the channels are made
    actor = Actor(user=world_a.owner)
    for kind, extra in (("slack", {}), ("pagerduty", {"routing_key": ROUTING_KEY})):
        services.notification_channel_create(
            tenant=world_a.tenant, actor=actor, kind=kind, name=kind,
            url=receiver.url(f"/{kind}"), **extra,
        )  # fmt: skip
    channel = NotificationChannel.objects.get(tenant=world_a.tenant, kind="pagerduty")
    # A change of URL is checked again at once.
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    response = world_a.client("owner").patch(
        reverse("notification-channel-detail", kwargs={"pk": channel.pk}),
        {"url": "https://169.254.169.254/latest/"},
        format="json",
    )
    assert response.status_code == 400 and "url" in response.json()["error"]["fields"]
    # The host now resolves to loopback, which the platform no longer allows: nothing is sent.
    with django_capture_on_commit_callbacks(execute=True):
        _, incident, _ = breach(world_a)
    assert receiver.requests == []
    deliveries = NotificationDelivery.objects.filter(incident=incident)
    assert deliveries.count() == 2
    for delivery in deliveries:
        assert delivery.status == "failed" and delivery.last_error.startswith("refused:")
        assert "loopback" in delivery.last_error


def test_a_neighbour_cannot_read_the_routing_key(
    world_a: TenantWorld, world_b: TenantWorld, settings: Any
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    channel, _ = services.notification_channel_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), kind="pagerduty", name="pd",
        url="https://hooks.example.net/v2/enqueue", routing_key=ROUTING_KEY,
    )  # fmt: skip
    detail = reverse("notification-channel-detail", kwargs={"pk": channel.pk})
    for who in ("owner", "token"):
        neighbour = world_b.client(who)
        assert neighbour.get(detail).status_code == 404
        assert neighbour.patch(detail, {"name": "mine"}, format="json").status_code == 404
        listed = neighbour.get(reverse("notification-channel-list"))
        assert listed.status_code == 200 and listed.json()["results"] == []
    browser = Client()
    browser.force_login(world_b.owner)
    edit = reverse(
        "notification-channel-edit", kwargs={"slug": world_a.tenant.slug, "pk": channel.pk}
    )
    assert browser.get(edit).status_code == 404  # not a member of Acme
    edit_b = reverse(
        "notification-channel-edit", kwargs={"slug": world_b.tenant.slug, "pk": channel.pk}
    )
    assert browser.get(edit_b).status_code == 404  # Acme's channel under Globex's slug
    # Its own owner reads a hint only: in the API, on the page, in the audit log.
    own = world_a.client("owner")
    texts = [
        own.get(detail).content.decode(),
        own.get(reverse("notification-channel-list")).content.decode(),
    ]
    browser.force_login(world_a.owner)
    texts.append(
        browser.get(
            reverse("notification-channels", kwargs={"slug": world_a.tenant.slug})
        ).content.decode()
    )
    texts.append(json.dumps(list(AuditEvent.objects.values()), default=str))
    assert own.get(detail).json()["routing_key"] == "****6789"
    for text in texts:
        assert ROUTING_KEY not in text


def test_a_huge_incident_text_is_bounded_and_escaped(
    world_a: TenantWorld,
    settings: Any,
    receiver: JsonReceiver,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    _, incident, _ = breach(world_a, detail="<!channel> " + "D" * 500_000)
    title = ("<!channel> <https://evil.example|click> " + "T" * 400)[:200]  # the column's limit
    Incident.objects.filter(pk=incident.pk).update(title=title)
    actor = Actor(user=world_a.owner)
    for kind, extra in (
        ("slack", {}),
        ("pagerduty", {"routing_key": ROUTING_KEY}),
        ("webhook", {}),
    ):
        services.notification_channel_create(
            tenant=world_a.tenant, actor=actor, kind=kind, name=kind,
            url=receiver.url(f"/{kind}"), **extra,
        )  # fmt: skip
    event = IncidentEvent.objects.get(incident=incident, kind="breach")
    incident.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        notify.deliveries_create(tenant=world_a.tenant, incident=incident, event=event)
    sent = {r["path"]: r for r in receiver.requests}
    assert sorted(sent) == ["/pagerduty", "/slack", "/webhook"]
    for request in sent.values():
        assert request["size"] < 16_000, request["path"]  # from a 500 kB detail
    slack = sent["/slack"]["body"]
    header = slack["blocks"][0]["text"]["text"]
    assert len(header) <= 150 and header.endswith("\u2026")
    assert len(slack["text"]) <= 3000
    assert all(len(f["text"]) <= 2000 for f in slack["blocks"][1]["fields"])
    context = slack["blocks"][2]["elements"][0]["text"]
    assert len(context) <= 3000
    # Slack markup from the tenant's text arrives escaped: no @channel, no link of its own.
    for text in (slack["text"], context):
        assert "<!channel>" not in text and "&lt;!channel&gt;" in text
        assert "<https://evil.example|click>" not in text
    pagerduty = sent["/pagerduty"]["body"]
    assert len(pagerduty["payload"]["summary"]) <= 1024
    assert len(pagerduty["dedup_key"]) <= 255
    assert len(pagerduty["payload"]["custom_details"]["message"]) <= 2000
    assert len(sent["/webhook"]["body"]["event"]["message"]) <= 2000
