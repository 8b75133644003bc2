"""Webhooks reach public addresses only: every refused kind of address and URL, the platform's
allowance, DNS rebinding between creation and delivery, the connection going to the checked
address (one lookup per attempt), TLS checked against the host name, no redirects, no receiver
body kept, and a suspended tenant's deliveries not sent.

Name lookups are faked (`dns`, a fake resolver in place of socket.getaddrinfo: nothing real is
resolved) and every socket connection is recorded by `fence`, which refuses any address off
loopback; the real receivers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse

from incidents import services
from incidents.notifications import delivery as notify
from incidents.notifications.models import NotificationChannel, NotificationDelivery
from portal import netguard
from tenants.actors import Actor
from tenants.models import Tenant
from tests.conftest import TenantWorld
from tests.incidents.factories import breach
from tests.incidents.tls_receiver import tls_contexts

pytestmark = pytest.mark.django_db

REAL_RESOLVE = netguard.resolve
REAL_GETADDRINFO = socket.getaddrinfo
PUBLIC = "93.184.215.14"  # answered by the fake resolver only; never connected to
LOOPBACK = ["127.0.0.0/8", "::1/128"]


def _is_ip(host: Any) -> bool:
    try:
        ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False
    return True


@dataclass
class FakeDns:
    """Answers for host names (a list per name: the next answer each lookup, the last one
    repeated); IP literals go to the real resolver, which reads them without asking anyone."""

    answers: dict[str, list[list[str]]] = field(default_factory=dict)
    lookups: list[str] = field(default_factory=list)

    def set(self, name: str, *answers: list[str]) -> None:
        self.answers[name] = list(answers)

    def getaddrinfo(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_ip(host):
            return REAL_GETADDRINFO(host, port, *args, **kwargs)
        self.lookups.append(str(host))
        queue = self.answers.get(str(host))
        if not queue:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, int(port), 0, 0))
            if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, int(port)))
            for a in addresses
        ]


@pytest.fixture(autouse=True)
def dns(monkeypatch: pytest.MonkeyPatch) -> FakeDns:
    fake = FakeDns()
    monkeypatch.setattr(netguard, "resolve", REAL_RESOLVE)  # whatever a conftest put there
    monkeypatch.setattr(socket, "getaddrinfo", fake.getaddrinfo)
    return fake


@dataclass
class Fence:
    """Every TCP connection attempt of the test, as (address, port); one off loopback is
    refused. The database and Redis connect on loopback too, so tests look at ports."""

    attempts: list[tuple[str, int]] = field(default_factory=list)

    def to(self, port: int) -> list[str]:
        return [address for address, p in self.attempts if p == port]

    def off_loopback(self) -> list[str]:
        return [
            a for a, _ in self.attempts if not ipaddress.ip_address(a.split("%")[0]).is_loopback
        ]


@pytest.fixture(autouse=True)
def fence(monkeypatch: pytest.MonkeyPatch) -> Iterator[Fence]:
    fence = Fence()
    real_connect = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            fence.attempts.append((address[0], address[1]))
            if fence.off_loopback():
                raise ConnectionRefusedError("off-loopback connection refused by the test")
        real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield fence
    assert fence.off_loopback() == [], "a test tried to leave loopback"


@pytest.fixture(autouse=True)
def _nothing_allowed(settings: Any) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = []  # the production default, whatever the test settings


class Receiver:
    """A webhook receiver on 127.0.0.1: answers (code, headers, body) from `answers`, then
    200; records each request's path, Host header and the TLS name the client asked for."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.answers: list[tuple[int, dict[str, str], bytes]] = []
        self.requests: list[dict[str, Any]] = []
        self.sni: list[str | None] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append({"path": self.path, "host": self.headers["Host"]})
                code, headers, body = (
                    receiver.answers.pop(0) if receiver.answers else (200, {}, b"")
                )
                self.send_response(code)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        if tls is not None:

            def record_sni(_sock: Any, name: str | None, _context: Any) -> None:
                self.sni.append(name)

            tls.sni_callback = record_sni
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.stop()


def _channel(world: TenantWorld, url: str) -> NotificationChannel:
    channel, _ = services.notification_channel_create(
        tenant=world.tenant, actor=Actor(user=world.owner), kind="webhook", name="hook", url=url
    )
    return channel


def _pending_delivery(world: TenantWorld, url: str) -> NotificationDelivery:
    """A channel, and an incident whose delivery waits (its on-commit task never runs here)."""
    _channel(world, url)
    _, incident, _ = breach(world)
    return NotificationDelivery.objects.get(incident=incident)


# --- the check itself --------------------------------------------------------------------------

REFUSED_LITERALS = [
    ("http://127.0.0.1/", "loopback"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://10.1.2.3/", "private"),
    ("http://172.16.0.1/", "private"),
    ("http://192.168.1.1:6379/", "private"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://224.0.0.1/", "multicast"),
    ("http://[::1]:8265/", "loopback"),
    ("http://[fe80::1]/", "link-local"),
    ("http://[fc00::1]/", "private"),
    ("http://[fec0::1]/", "site-local"),
    ("http://[ff02::1]/", "multicast"),
    ("http://[::]/", "unspecified"),
    ("http://[::ffff:127.0.0.1]/", "127.0.0.1, a loopback"),
    ("http://[::ffff:169.254.169.254]/", "169.254.169.254, a link-local"),
    ("http://[2002:7f00:1::]/", "127.0.0.1, a loopback"),  # 6to4
    ("http://[64:ff9b::a9fe:a9fe]/", "169.254.169.254, a link-local"),  # NAT64
    ("http://2130706433/", "non-standard form"),
    ("http://0x7f000001/", "non-standard form"),
    ("http://0x7f.1/", "non-standard form"),
    ("http://127.1/", "non-standard form"),
    ("http://017700000001/", "non-standard form"),
    ("http://127.000.000.001/", "non-standard form"),
    ("ftp://hooks.example.net/", "only http and https"),
    ("gopher://127.0.0.1:6379/_INFO", "only http and https"),
    ("http://user:pass@hooks.example.net/", "user name or password"),
    ("http://hooks.example.net@127.0.0.1/", "user name or password"),
    ("http:///hook", "needs a host"),
    ("http://[fe80::1%25eth0]/", "zone index"),
    ("http://hooks.example.net:0/", "port"),
    ("http://hooks.example.net:70000/", "port"),
    ("http://hooks.exam ple.net/", "spaces or control characters"),
    ("http://hooks.example.net\n.evil/", "spaces or control characters"),
]


@pytest.mark.parametrize(("url", "reason"), REFUSED_LITERALS)
def test_refused_urls_are_refused_before_any_lookup_or_connection(
    url: str, reason: str, dns: FakeDns, fence: Fence
) -> None:
    with pytest.raises(netguard.Refused) as refused:
        notify.webhook_check(url)
    assert reason in str(refused.value)
    assert dns.lookups == [] and fence.attempts == []


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (["127.0.0.1", "::1"], "localhost resolves to 127.0.0.1, a loopback address"),
        (["::1"], "localhost resolves to ::1, a loopback address"),
        (["::ffff:127.0.0.1"], "a form of 127.0.0.1, a loopback address"),
    ],
)
def test_a_name_resolving_to_loopback_is_refused(
    answer: list[str], reason: str, dns: FakeDns, fence: Fence
) -> None:
    dns.set("localhost", answer)
    with pytest.raises(netguard.Refused) as refused:
        notify.webhook_check("http://localhost:8265/api/jobs/")
    assert reason in str(refused.value)
    assert "webhooks must reach a public address" in str(refused.value)
    assert dns.lookups == ["localhost"] and fence.attempts == []


def test_every_address_of_a_name_is_checked(dns: FakeDns, fence: Fence) -> None:
    dns.set("mixed.example.net", [PUBLIC, "10.0.0.7"])
    with pytest.raises(netguard.Refused, match=r"resolves to 10\.0\.0\.7, a private address"):
        notify.webhook_check("https://mixed.example.net/hook")
    dns.set("public.example.net", [PUBLIC])
    target = notify.webhook_check("https://Public.Example.NET:8443/hook?x=1#frag")
    assert (target.host, target.port, target.addresses) == ("public.example.net", 8443, (PUBLIC,))
    assert target.host_header == "public.example.net:8443"
    assert target.url_for(PUBLIC) == f"https://{PUBLIC}:8443/hook?x=1"
    assert fence.attempts == []


def test_a_name_that_does_not_resolve_is_unresolvable(dns: FakeDns) -> None:
    with pytest.raises(netguard.Unresolvable, match="nowhere.example.net does not resolve"):
        notify.webhook_check("https://nowhere.example.net/")


def test_the_platform_can_allow_networks(settings: Any, fence: Fence) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    assert notify.webhook_check("http://127.0.0.1:9/").addresses == ("127.0.0.1",)
    assert notify.webhook_check("http://[::ffff:127.0.0.2]:9/").port == 9  # its IPv4 counts
    with pytest.raises(netguard.Refused, match="loopback"):
        notify.webhook_check("http://[::1]:9/")  # not in the allowance
    with pytest.raises(netguard.Refused, match="link-local"):
        notify.webhook_check("http://169.254.169.254/")
    settings.WEBHOOK_ALLOWED_NETWORKS = "127.0.0.0/8, ::1/128"  # the env var's comma form
    assert notify.webhook_check("http://[::1]:9/").host_header == "[::1]:9"
    settings.WEBHOOK_ALLOWED_NETWORKS = ["not-a-network"]
    with pytest.raises(ImproperlyConfigured, match="WEBHOOK_ALLOWED_NETWORKS: 'not-a-network'"):
        notify.webhook_check("http://127.0.0.1:9/")
    assert fence.attempts == []


# --- creating and changing channels ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:6399/", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://localhost:8265/", "loopback"),
        ("http://internal.example.net/", "private"),
        ("http://nowhere.example.net/", "does not resolve"),
        ("http://2130706433/", ""),
        ("http://user:pass@hooks.example.net/", ""),
    ],
)
def test_the_api_refuses_a_non_public_url_naming_url(
    world_a: TenantWorld, dns: FakeDns, fence: Fence, url: str, reason: str
) -> None:
    dns.set("localhost", ["127.0.0.1"])
    dns.set("internal.example.net", ["10.20.30.40"])
    client = world_a.client("operator")
    body = {"kind": "webhook", "name": "ops", "url": url}
    response = client.post(reverse("notification-channel-list"), body, format="json")
    assert response.status_code == 400, response.content
    assert reason in " ".join(response.json()["error"]["fields"]["url"])
    assert not NotificationChannel.objects.filter(tenant=world_a.tenant).exists()
    assert fence.to(urlsplit(url).port or 80) == []


def test_changing_the_url_is_checked_too(world_a: TenantWorld, dns: FakeDns, fence: Fence) -> None:
    dns.set("hooks.example.net", [PUBLIC])
    dns.set("internal.example.net", ["192.168.0.10"])
    channel = _channel(world_a, "https://hooks.example.net/portal")
    client = world_a.client("operator")
    detail = reverse("notification-channel-detail", kwargs={"pk": channel.pk})
    response = client.patch(detail, {"url": "https://internal.example.net/"}, format="json")
    assert response.status_code == 400
    assert "192.168.0.10, a private address" in response.json()["error"]["fields"]["url"][0]
    channel.refresh_from_db()
    assert channel.url == "https://hooks.example.net/portal"
    # Other changes do not look the host up again (a broken host can still be switched off).
    dns.set("hooks.example.net", [])
    response = client.patch(detail, {"is_active": False}, format="json")
    assert response.status_code == 200 and response.json()["is_active"] is False
    assert fence.to(443) == []


# --- deliveries --------------------------------------------------------------------------------


def test_dns_rebinding_after_creation_fails_the_delivery_without_sending(
    world_a: TenantWorld, dns: FakeDns, fence: Fence, receiver: Receiver
) -> None:
    dns.set("rebind.example.net", [PUBLIC], ["127.0.0.1"])  # public when checked, then not
    delivery = _pending_delivery(world_a, f"http://rebind.example.net:{receiver.port}/hook")
    outcome = notify.delivery_attempt(delivery_id=delivery.pk)
    assert (outcome.status, outcome.retry_in) == ("failed", None)  # final: no retries
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("failed", 1, None)
    assert delivery.last_error.startswith("refused: rebind.example.net resolves to 127.0.0.1")
    assert "loopback" in delivery.last_error
    assert receiver.requests == [] and fence.to(receiver.port) == []


def test_a_delivery_connects_to_the_checked_address_with_one_lookup_per_attempt(
    world_a: TenantWorld, dns: FakeDns, fence: Fence, receiver: Receiver, settings: Any
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    # Creation and each attempt's lookup get 127.0.0.1; any further lookup would get
    # 127.0.0.2, where nothing listens, and the delivery would not arrive.
    dns.set("hooks.example.net", ["127.0.0.1"], ["127.0.0.1"], ["127.0.0.1"], ["127.0.0.2"])
    receiver.answers = [(503, {}, b"busy")]
    delivery = _pending_delivery(world_a, f"http://hooks.example.net:{receiver.port}/hook")
    assert notify.delivery_attempt(delivery_id=delivery.pk).retry_in == 2
    assert notify.delivery_attempt(delivery_id=delivery.pk).status == "sent"
    assert dns.lookups == ["hooks.example.net"] * 3  # creation, then one per attempt
    assert fence.to(receiver.port) == ["127.0.0.1", "127.0.0.1"]
    assert (
        receiver.requests == [{"path": "/hook", "host": f"hooks.example.net:{receiver.port}"}] * 2
    )
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("sent", 2, 200)


def test_the_checked_addresses_are_tried_in_order(
    world_a: TenantWorld, dns: FakeDns, fence: Fence, receiver: Receiver, settings: Any
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    dns.set("hooks.example.net", ["127.0.0.2", "127.0.0.1"])  # nothing listens on the first
    delivery = _pending_delivery(world_a, f"http://hooks.example.net:{receiver.port}/hook")
    assert notify.delivery_attempt(delivery_id=delivery.pk).status == "sent"
    assert fence.to(receiver.port) == ["127.0.0.2", "127.0.0.1"] and len(receiver.requests) == 1


def test_an_allowed_network_with_a_refused_neighbour_is_still_refused_at_delivery(
    world_a: TenantWorld, dns: FakeDns, fence: Fence, receiver: Receiver, settings: Any
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    dns.set("hooks.example.net", ["127.0.0.1"], ["127.0.0.1", "10.0.0.1"])
    delivery = _pending_delivery(world_a, f"http://hooks.example.net:{receiver.port}/hook")
    assert notify.delivery_attempt(delivery_id=delivery.pk).status == "failed"
    delivery.refresh_from_db()
    assert "10.0.0.1, a private address" in delivery.last_error
    assert receiver.requests == [] and fence.to(receiver.port) == []


def test_a_lookup_failure_at_delivery_is_retried(
    world_a: TenantWorld, dns: FakeDns, fence: Fence, settings: Any
) -> None:
    dns.set("flaky.example.net", [PUBLIC], [])
    delivery = _pending_delivery(world_a, "https://flaky.example.net/hook")
    outcome = notify.delivery_attempt(delivery_id=delivery.pk)
    assert (outcome.status, outcome.retry_in) == ("pending", 2)
    delivery.refresh_from_db()
    assert "flaky.example.net does not resolve" in delivery.last_error
    assert fence.to(443) == []


def test_redirects_are_not_followed(
    world_a: TenantWorld, dns: FakeDns, fence: Fence, receiver: Receiver, settings: Any
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    elsewhere = f"http://127.0.0.1:{receiver.port}/elsewhere"
    receiver.answers = [(307, {"Location": elsewhere}, b"")]
    delivery = _pending_delivery(world_a, f"http://127.0.0.1:{receiver.port}/hook")
    outcome = notify.delivery_attempt(delivery_id=delivery.pk)
    assert (outcome.status, outcome.retry_in) == ("failed", None)
    delivery.refresh_from_db()
    assert delivery.response_code == 307
    assert delivery.last_error == "HTTP 307: redirects are not followed."
    assert [r["path"] for r in receiver.requests] == ["/hook"]


def test_the_receivers_answer_is_not_kept_or_logged(
    world_a: TenantWorld,
    dns: FakeDns,
    receiver: Receiver,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    leak = b"root:x:0:0 AWS_SECRET_ACCESS_KEY=abc\r\n\x1b[31mforged log line"
    receiver.answers = [(500, {"X-Debug": "internal-hostname"}, leak), (404, {}, leak)]
    delivery = _pending_delivery(world_a, f"http://127.0.0.1:{receiver.port}/hook")
    with caplog.at_level(logging.INFO, logger="incidents.notifications.delivery"):
        notify.delivery_attempt(delivery_id=delivery.pk)
        delivery.refresh_from_db()
        assert (delivery.last_error, delivery.response_code) == ("HTTP 500", 500)
        notify.delivery_attempt(delivery_id=delivery.pk)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.last_error, delivery.response_code) == (
        "failed",
        "HTTP 404",
        404,
    )
    assert "HTTP 404" in caplog.text
    for fragment in ("root:x", "AWS_SECRET", "forged", "internal-hostname", "\x1b"):
        assert fragment not in caplog.text and fragment not in delivery.last_error


def test_a_suspended_tenants_pending_delivery_is_not_sent_and_none_is_queued(
    world_a: TenantWorld, receiver: Receiver, settings: Any, world_b: TenantWorld
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    delivery = _pending_delivery(world_a, f"http://127.0.0.1:{receiver.port}/hook")
    neighbour = _pending_delivery(world_b, f"http://127.0.0.1:{receiver.port}/hook")
    Tenant.objects.filter(pk=world_a.tenant.pk).update(is_active=False)
    outcome = notify.delivery_attempt(delivery_id=delivery.pk)
    assert (outcome.status, outcome.retry_in) == ("failed", None)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("failed", 0)
    assert delivery.last_error == "tenant suspended: not sent."
    assert receiver.requests == []
    # Nothing new is queued for it, even by a caller holding the tenant from before.
    assert world_a.tenant.is_active
    assert (
        notify.deliveries_create(tenant=world_a.tenant, incident=delivery.incident, event=None)
        == []
    )
    # The neighbour is untouched.
    assert notify.delivery_attempt(delivery_id=neighbour.pk).status == "sent"
    assert len(receiver.requests) == 1


def test_a_switched_off_channels_pending_delivery_is_not_sent(
    world_a: TenantWorld, receiver: Receiver, settings: Any
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    delivery = _pending_delivery(world_a, f"http://127.0.0.1:{receiver.port}/hook")
    NotificationChannel.objects.filter(pk=delivery.channel_id).update(is_active=False)
    assert notify.delivery_attempt(delivery_id=delivery.pk).status == "failed"
    delivery.refresh_from_db()
    assert delivery.last_error == "channel switched off: not sent."
    assert receiver.requests == []


# --- TLS: the certificate is checked against the URL's host, not the address connected to ----


@pytest.fixture
def tls_receiver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> Iterator[Receiver]:
    server, client = tls_contexts(tmp_path, "hooks.example.net")
    monkeypatch.setattr(notify, "_tls_context", lambda: client)  # trusts the test CA only
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    receiver = Receiver(tls=server)
    yield receiver
    receiver.stop()


def test_https_verifies_the_host_name_while_connecting_to_the_checked_address(
    world_a: TenantWorld, dns: FakeDns, fence: Fence, tls_receiver: Receiver
) -> None:
    dns.set("hooks.example.net", ["127.0.0.1"])
    delivery = _pending_delivery(world_a, f"https://hooks.example.net:{tls_receiver.port}/hook")
    assert notify.delivery_attempt(delivery_id=delivery.pk).status == "sent"
    assert tls_receiver.sni == ["hooks.example.net"] and fence.to(tls_receiver.port) == [
        "127.0.0.1"
    ]
    assert tls_receiver.requests[0]["host"] == f"hooks.example.net:{tls_receiver.port}"


def test_https_refuses_a_certificate_for_another_name(
    world_a: TenantWorld, dns: FakeDns, tls_receiver: Receiver
) -> None:
    dns.set("other.example.net", ["127.0.0.1"])
    delivery = _pending_delivery(world_a, f"https://other.example.net:{tls_receiver.port}/hook")
    assert notify.delivery_attempt(delivery_id=delivery.pk).status == "pending"  # retried
    delivery.refresh_from_db()
    assert "ConnectError" in delivery.last_error and "certificate" in delivery.last_error
    assert tls_receiver.requests == [] and tls_receiver.sni == ["other.example.net"]
