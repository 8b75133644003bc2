"""A channel's "Send test" button, end to end: the request queues the test (the row says
"sending…") and the task (run eagerly once the request's transaction commits) sends it; a real
receiver on 127.0.0.1 gets a test of the channel's kind (a signed webhook with X-Portal-Event
`test`, a Slack text, a PagerDuty info trigger then its resolve, an e-mail in the locmem
outbox); the outcome shows in the channel's row and in the audit log; a throttle, a
switched-off channel, a viewer and another tenant's channel are refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse

from incidents import services
from incidents.notifications import delivery as notify
from incidents.notifications.models import NotificationChannel
from incidents.notifications.sendtest import channel_test_send, notification_channel_test
from portal.exceptions import ConflictError, RateLimited
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld
from tests.incidents.test_notify import Receiver
from tests.incidents.tls_receiver import JsonReceiver, tls_contexts

pytestmark = pytest.mark.django_db

ROUTING_KEY = "R0ut1ngKeyR0ut1ngKeyR0ut1ngKey42"


@pytest.fixture(autouse=True)
def _loopback_receivers_allowed(settings: Any) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.PORTAL_BASE_URL = "https://portal.example.org"


@pytest.fixture
def tls_receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JsonReceiver]:
    server, client = tls_contexts(tmp_path)
    monkeypatch.setattr(notify, "_tls_context", lambda: client)
    receiver = JsonReceiver(server)
    yield receiver
    receiver.stop()


def _channel(world: TenantWorld, kind: str, **fields: Any) -> tuple[NotificationChannel, str]:
    return services.notification_channel_create(
        tenant=world.tenant, actor=Actor(user=world.owner), kind=kind, name=f"{kind}-1", **fields
    )


@pytest.fixture
def press(django_capture_on_commit_callbacks: Any) -> Any:
    """Press the channel's button (its commit queues the task, which runs eagerly); the
    channels page the redirect lands on, loaded once the task has run."""

    def press(client: Client, world: TenantWorld, channel: NotificationChannel) -> str:
        url = reverse("notification-channel-test", args=[world.tenant.slug, channel.pk])
        page_url = reverse("notification-channels", args=[world.tenant.slug])
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(url)
        assert response.status_code == 302 and response["Location"] == page_url
        return client.get(page_url).content.decode()

    return press


def _last_test(page: str, channel: NotificationChannel) -> str:
    """The text of the channel's "Last test" cell."""
    row = page.split(f'data-channel="{channel.pk}"', 1)[1]
    return row.split('data-testid="channel-last-test">', 1)[1].split("</td>", 1)[0]


def test_a_webhook_test_is_signed_and_its_outcome_shows_and_is_audited(
    client: Client, world_a: TenantWorld, receiver: Receiver, press: Any
) -> None:
    channel, receiver.secret = _channel(world_a, "webhook", url=receiver.url)
    client.force_login(world_a.operator)
    page = press(client, world_a, channel)
    [request] = receiver.requests
    assert request["valid"] and request["event"] == "test"
    assert request["body"]["type"] == "test" and request["body"]["channel"]["id"] == channel.pk
    assert (
        request["delivery"].startswith("test-")
        and request["delivery"] == request["body"]["delivery"]
    )
    assert "Sending a test message to webhook-1…" in page
    cell = _last_test(page, channel)  # the row keeps the last test
    assert 'class="badge sent"' in cell and "HTTP 200" in cell and "sending" not in cell
    audit = AuditEvent.objects.get(tenant=world_a.tenant, action="notification_channel.tested")
    assert audit.actor_id == world_a.operator.pk and audit.object_id == str(channel.pk)
    assert audit.after["result"] == "sent" and audit.after["response_code"] == 200
    assert channel.secret not in str(audit.after)


def test_a_failing_receiver_shows_its_code_but_never_its_body(
    client: Client, world_a: TenantWorld, receiver: Receiver, press: Any
) -> None:
    channel, receiver.secret = _channel(world_a, "webhook", url=receiver.url)
    receiver.codes = [503]
    client.force_login(world_a.owner)
    page = press(client, world_a, channel)
    cell = _last_test(page, channel)
    assert 'class="badge failed"' in cell and "HTTP 503" in cell
    assert "busy" not in page  # the receiver's body
    audit = AuditEvent.objects.get(tenant=world_a.tenant, action="notification_channel.tested")
    assert (audit.after["result"], audit.after["error"]) == ("failed", "HTTP 503")


def test_an_unreachable_receiver_shows_the_error(
    client: Client, world_a: TenantWorld, press: Any
) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    channel, _ = _channel(world_a, "webhook", url=f"http://127.0.0.1:{port}/hook")
    client.force_login(world_a.owner)
    page = press(client, world_a, channel)
    cell = _last_test(page, channel)
    assert 'class="badge failed"' in cell and "ConnectError" in cell


def test_slack_gets_a_short_escaped_text(
    client: Client, world_a: TenantWorld, tls_receiver: JsonReceiver, press: Any
) -> None:
    channel, _ = services.notification_channel_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), kind="slack",
        name="<!channel> ops & co", url=tls_receiver.url("/services/T1/B1/XXXX"),
    )  # fmt: skip
    client.force_login(world_a.owner)
    page = press(client, world_a, channel)
    [request] = tls_receiver.requests
    assert request["path"] == "/services/T1/B1/XXXX"
    text = request["body"]["text"]
    assert set(request["body"]) == {"text"} and "<!channel>" not in text
    assert "&lt;!channel&gt; ops &amp; co" in text
    assert text.endswith(
        f"<https://portal.example.org/t/{world_a.tenant.slug}/notifications/|channels>"
    )
    assert "HTTP 202" in _last_test(page, channel)


def test_pagerduty_gets_an_info_trigger_then_its_resolve(
    client: Client, world_a: TenantWorld, tls_receiver: JsonReceiver, press: Any
) -> None:
    channel, _ = _channel(
        world_a, "pagerduty", url=tls_receiver.url("/v2/enqueue"), routing_key=ROUTING_KEY
    )
    client.force_login(world_a.owner)
    page = press(client, world_a, channel)
    trigger, resolve = tls_receiver.bodies()
    assert trigger["event_action"] == "trigger" and trigger["routing_key"] == ROUTING_KEY
    assert trigger["payload"]["severity"] == "info" and trigger["payload"]["class"] == "test"
    assert f"channel-test-{channel.pk}-test-" in trigger["dedup_key"]
    assert resolve == {
        "routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": trigger["dedup_key"]
    }  # fmt: skip
    cell = _last_test(page, channel)
    assert 'class="badge sent"' in cell and "HTTP 202" in cell
    assert ROUTING_KEY not in page


def test_a_failed_resolve_is_reported(
    world_a: TenantWorld, tls_receiver: JsonReceiver, django_capture_on_commit_callbacks: Any
) -> None:
    channel, _ = _channel(
        world_a, "pagerduty", url=tls_receiver.url("/v2/enqueue"), routing_key=ROUTING_KEY
    )
    tls_receiver.codes = [202, 400]
    with django_capture_on_commit_callbacks(execute=True):
        notification_channel_test(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), channel=channel
        )
    audit = AuditEvent.objects.get(tenant=world_a.tenant, action="notification_channel.tested")
    assert audit.after["result"] == "failed"
    assert audit.after["error"] == "triggered (HTTP 202), but its resolve failed: HTTP 400"


def test_email_goes_through_send_mail(client: Client, world_a: TenantWorld, press: Any) -> None:
    channel, _ = _channel(world_a, "email", email="oncall@example.com")
    client.force_login(world_a.owner)
    page = press(client, world_a, channel)
    [message] = mail.outbox
    assert message.to == ["oncall@example.com"] and message.subject.startswith("[test]")
    assert 'class="badge sent"' in _last_test(page, channel)


def test_a_second_quick_test_is_throttled(
    client: Client, world_a: TenantWorld, receiver: Receiver, press: Any
) -> None:
    channel, receiver.secret = _channel(world_a, "webhook", url=receiver.url)
    client.force_login(world_a.owner)
    press(client, world_a, channel)
    page = press(client, world_a, channel)
    assert "Test of webhook-1 not sent: too many test messages" in page
    assert len(receiver.requests) == 1
    assert AuditEvent.objects.filter(action="notification_channel.tested").count() == 1


def test_a_switched_off_channel_and_a_suspended_tenant_refuse(
    client: Client, world_a: TenantWorld, receiver: Receiver, press: Any
) -> None:
    channel, _ = _channel(world_a, "webhook", url=receiver.url, is_active=False)
    client.force_login(world_a.owner)
    page = press(client, world_a, channel)
    assert "Test of webhook-1 not sent: the channel &#x27;webhook-1&#x27; is switched off" in page
    world_a.tenant.is_active = False
    world_a.tenant.save(update_fields=["is_active"])
    channel.is_active = True
    channel.save(update_fields=["is_active"])
    with pytest.raises(ConflictError, match="suspended"):
        notification_channel_test(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), channel=channel
        )
    assert receiver.requests == []


def test_the_tenant_budget_bounds_tests_across_channels(
    world_a: TenantWorld, receiver: Receiver, django_capture_on_commit_callbacks: Any
) -> None:
    actor = Actor(user=world_a.owner)
    channels = [
        services.notification_channel_create(
            tenant=world_a.tenant, actor=actor, kind="webhook", name=f"h{i}", url=receiver.url
        )[0]
        for i in range(6)
    ]
    with django_capture_on_commit_callbacks(execute=True) as queued:
        for channel in channels[:5]:
            notification_channel_test(tenant=world_a.tenant, actor=actor, channel=channel)
        with pytest.raises(RateLimited, match="5 per tenant a minute"):
            notification_channel_test(tenant=world_a.tenant, actor=actor, channel=channels[5])
    assert len(queued) == 5 and len(receiver.requests) == 5


def test_the_request_only_queues_and_the_row_says_sending_until_the_worker_sent(
    client: Client,
    world_a: TenantWorld,
    receiver: Receiver,
    django_capture_on_commit_callbacks: Any,
) -> None:
    channel, receiver.secret = _channel(world_a, "webhook", url=receiver.url)
    client.force_login(world_a.owner)
    url = reverse("notification-channel-test", args=[world_a.tenant.slug, channel.pk])
    page_url = reverse("notification-channels", args=[world_a.tenant.slug])
    with django_capture_on_commit_callbacks(execute=False) as queued:
        assert client.post(url).status_code == 302
    # Nothing left the portal during the request: the send is the queued task's.
    assert receiver.requests == [] and len(queued) == 1
    page = client.get(page_url).content.decode()
    assert 'data-testid="channel-test-sending"' in _last_test(page, channel)
    assert not AuditEvent.objects.filter(action="notification_channel.tested").exists()
    queued[0]()  # the commit hands the task to the (eager) worker
    assert len(receiver.requests) == 1
    cell = _last_test(client.get(page_url).content.decode(), channel)
    assert 'class="badge sent"' in cell and "sending" not in cell


def test_a_channel_switched_off_before_the_worker_sends_is_failed_not_sent(
    world_a: TenantWorld, receiver: Receiver, django_capture_on_commit_callbacks: Any
) -> None:
    channel, _ = _channel(world_a, "webhook", url=receiver.url)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        notification_channel_test(
            tenant=world_a.tenant, actor=Actor(user=world_a.operator), channel=channel
        )
    NotificationChannel.objects.filter(pk=channel.pk).update(is_active=False)
    queued[0]()
    assert receiver.requests == []
    audit = AuditEvent.objects.get(tenant=world_a.tenant, action="notification_channel.tested")
    assert audit.actor_id == world_a.operator.pk and audit.after["result"] == "failed"
    assert "not sent: the channel 'webhook-1' is switched off" in audit.after["error"]
    # A channel removed before the worker runs: nothing is sent, nothing is audited.
    assert channel_test_send(channel_id=channel.pk + 10_000, test_id="test-x") is None


def test_a_viewer_cannot_test_and_sees_no_button(
    client: Client, world_a: TenantWorld, receiver: Receiver
) -> None:
    channel, _ = _channel(world_a, "webhook", url=receiver.url)
    client.force_login(world_a.viewer)
    page = client.get(reverse("notification-channels", args=[world_a.tenant.slug]))
    assert 'data-testid="channel-test"' not in page.content.decode()
    url = reverse("notification-channel-test", args=[world_a.tenant.slug, channel.pk])
    assert client.post(url).status_code == 403
    assert client.get(url).status_code == 405
    assert receiver.requests == []


def test_another_tenants_channel_is_not_found(
    client: Client, world_a: TenantWorld, world_b: TenantWorld, receiver: Receiver
) -> None:
    theirs, _ = _channel(world_b, "webhook", url=receiver.url)
    client.force_login(world_a.owner)
    url = reverse("notification-channel-test", args=[world_a.tenant.slug, theirs.pk])
    assert client.post(url).status_code == 404
    assert receiver.requests == []
    assert not AuditEvent.objects.filter(action="notification_channel.tested").exists()
