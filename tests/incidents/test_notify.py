"""Notifications: a real HTTP server on 127.0.0.1 receives the signed webhooks (and fails on
purpose to exercise the retries); e-mail goes to Django's locmem outbox. Celery runs eagerly in
the tests, so a retry runs at once (its countdown is not waited for); eager errors are not
propagated here, since Celery propagates an eager task's Retry instead of running it."""

from __future__ import annotations

import hashlib
import hmac
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core import mail

from incidents import services
from incidents.notifications import delivery as notify
from incidents.notifications.models import NotificationDelivery
from incidents.notifications.tasks import deliver_notification
from portal.celery import app as celery_app
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.factories import breach

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _eager_retries_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(celery_app.conf, "task_eager_propagates", False)


@pytest.fixture(autouse=True)
def _loopback_receivers_allowed(settings: Any) -> None:
    # The receiver listens on 127.0.0.1, which webhooks may reach only when the platform says so.
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


class Receiver:
    """A webhook receiver: answers with the scripted codes (then 200), checks signatures."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.secret = ""
        self.requests: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                timestamp = self.headers["X-Portal-Timestamp"]
                expected = hmac.new(
                    receiver.secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256
                ).hexdigest()
                receiver.requests.append(
                    {
                        "body": json.loads(body),
                        "event": self.headers["X-Portal-Event"],
                        "delivery": self.headers["X-Portal-Delivery"],
                        "valid": hmac.compare_digest(
                            self.headers["X-Portal-Signature"], f"sha256={expected}"
                        ),
                    }
                )
                code = receiver.codes.pop(0) if receiver.codes else 200
                self.send_response(code)
                self.end_headers()
                self.wfile.write(b"ok" if code == 200 else b"busy")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


def _webhook(world: TenantWorld, url: str, **extra: Any) -> str:
    _, secret = services.notification_channel_create(
        tenant=world.tenant, actor=Actor(user=world.owner), kind="webhook", name="hook",
        url=url, **extra,
    )  # fmt: skip
    return secret


def test_a_new_incident_is_posted_signed(
    world_a: TenantWorld, receiver: Receiver, django_capture_on_commit_callbacks: Any
) -> None:
    receiver.secret = _webhook(world_a, receiver.url)
    with django_capture_on_commit_callbacks(execute=True):
        _, incident, _ = breach(world_a)
    [request] = receiver.requests
    assert request["valid"] and request["event"] == "incident.breach"
    assert request["body"]["incident"]["id"] == incident.pk
    assert request["body"]["incident"]["severity"] == "page"
    delivery = NotificationDelivery.objects.get(incident=incident)
    assert request["delivery"] == str(delivery.pk)
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("sent", 1, 200)
    assert delivery.sent_at is not None


def test_status_changes_are_posted_too(
    world_a: TenantWorld, receiver: Receiver, django_capture_on_commit_callbacks: Any
) -> None:
    receiver.secret = _webhook(world_a, receiver.url)
    with django_capture_on_commit_callbacks(execute=True):
        _, incident, _ = breach(world_a)
        breach(world_a)  # a repeat tells nobody
        services.incident_acknowledge(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), incident=incident
        )
        services.incident_note(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), incident=incident, text="hi"
        )
    events = [r["event"] for r in receiver.requests]
    assert events == ["incident.breach", "incident.status_changed"]
    assert receiver.requests[1]["body"]["incident"]["status"] == "acknowledged"


def test_5xx_is_retried_until_it_gets_through(
    world_a: TenantWorld, receiver: Receiver, django_capture_on_commit_callbacks: Any
) -> None:
    receiver.secret = _webhook(world_a, receiver.url)
    receiver.codes = [500, 503, 429]
    with django_capture_on_commit_callbacks(execute=True):
        _, incident, _ = breach(world_a)
    assert len(receiver.requests) == 4 and all(r["valid"] for r in receiver.requests)
    assert len({r["delivery"] for r in receiver.requests}) == 1
    delivery = NotificationDelivery.objects.get(incident=incident)
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("sent", 4, 200)


def test_backoff_doubles_and_gives_up_after_the_last_attempt(
    world_a: TenantWorld, receiver: Receiver
) -> None:
    receiver.secret = _webhook(world_a, receiver.url)
    receiver.codes = [502] * 10
    _, incident, _ = breach(world_a)  # on_commit not run: attempts are driven by hand here
    delivery = NotificationDelivery.objects.get(incident=incident)
    outcomes = [notify.delivery_attempt(delivery_id=delivery.pk) for _ in range(7)]
    assert [o.retry_in for o in outcomes[:5]] == [2, 4, 8, 16, 32]
    assert outcomes[5].status == "failed" and outcomes[5].retry_in is None
    assert outcomes[6].status == "skipped"  # a finished delivery is left alone
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("failed", 6, 502)
    assert "HTTP 502" in delivery.last_error
    assert len(receiver.requests) == 6


def test_a_client_error_is_final_and_a_dead_receiver_is_retried(
    world_a: TenantWorld, receiver: Receiver
) -> None:
    receiver.secret = _webhook(world_a, receiver.url)
    receiver.codes = [410]
    _, incident, _ = breach(world_a)
    delivery = NotificationDelivery.objects.get(incident=incident)
    assert deliver_notification.delay(delivery.pk).get() == "failed"
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.response_code) == (1, 410)

    # Nothing listens on the port any more: connection errors are retried, then fail.
    receiver.server.shutdown()
    receiver.server.server_close()
    _, other, _ = breach(world_a, group="canary")  # another slot: a new incident
    delivery = NotificationDelivery.objects.get(incident=other)
    assert deliver_notification.delay(delivery.pk).get() == "failed"
    delivery.refresh_from_db()
    assert delivery.attempts == notify.MAX_ATTEMPTS and delivery.response_code is None
    assert "ConnectError" in delivery.last_error


def test_a_delivery_whose_task_was_lost_is_swept_and_sent_once(
    world_a: TenantWorld, receiver: Receiver, django_capture_on_commit_callbacks: Any
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from incidents.notifications.tasks import sweep_notifications

    receiver.secret = _webhook(world_a, receiver.url)
    _, incident, _ = breach(world_a)  # its task never ran: the broker was down at commit
    delivery = NotificationDelivery.objects.get(incident=incident)
    assert notify.deliveries_sweep() == []  # not overdue yet: its task may still come
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_notifications.delay().get() == 0
    later = timezone.now() + timedelta(seconds=notify.SWEEP_GRACE_S + 1)
    with django_capture_on_commit_callbacks(execute=True):
        assert notify.deliveries_sweep(now=later) == [delivery.pk]
        assert notify.deliveries_sweep(now=later) == []  # claimed: a second sweep skips it
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("sent", 1)
    assert [r["delivery"] for r in receiver.requests] == [str(delivery.pk)]


def test_email_and_severity_filter(
    world_a: TenantWorld, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.PORTAL_BASE_URL = "http://portal.test/"
    actor = Actor(user=world_a.owner)
    services.notification_channel_create(
        tenant=world_a.tenant, actor=actor, kind="email", name="oncall", email="Oncall@Acme.example"
    )
    services.notification_channel_create(
        tenant=world_a.tenant, actor=actor, kind="email", name="pager", email="pager@acme.example",
        min_severity="page",
    )  # fmt: skip
    services.notification_channel_create(
        tenant=world_a.tenant, actor=actor, kind="email", name="off", email="off@acme.example",
        is_active=False,
    )  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        _, incident, _ = breach(world_a, severity="ticket")
    [message] = mail.outbox
    assert message.to == ["oncall@acme.example"]
    assert f"#{incident.pk}" in message.subject and "[ticket]" in message.subject
    page = f"http://portal.test/t/{world_a.tenant.slug}/incidents/{incident.pk}/"
    assert incident.title in message.body and page in message.body  # the page, not the API
    assert "/api/" not in message.body
    assert NotificationDelivery.objects.get(incident=incident).status == "sent"


def test_the_signature_scheme() -> None:
    body = '{"a":1}'
    expected = hmac.new(b"s3cret", b"1700000000." + body.encode(), hashlib.sha256).hexdigest()
    assert notify.sign("s3cret", "1700000000", body) == f"sha256={expected}"
