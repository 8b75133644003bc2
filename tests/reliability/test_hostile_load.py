"""The hostile-tenant suite, load holes without Ray: one tenant (Acme) hammers the pages whose
work is costly per load, while its neighbour (Globex) uses the same pages. Attacks: reloading
the cause rules' match counts (each load recomputes up to 50 incidents' signals) from many tabs
or a script; queueing "Send test" of many channels (outbound HTTP, formerly inside the web
request); many members running the deployment playground at once (each run holds a web worker
up to its timeout). Asserted: the hostile tenant gets a clear refusal naming the limit (429
with Retry-After, or the flash message), the work it may still queue is bounded, and the
neighbour's loads, tests and runs go through untouched."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from incidents import services as incident_services
from incidents.rca import rule_matches
from serving.ops import playground_limits
from tenants.actors import Actor
from tenants.models import AuditEvent, Role
from tests.conftest import TenantWorld, add_member
from tests.incidents.conftest import receiver  # noqa: F401 (a fixture)
from tests.incidents.factories import breach, cause_rule_for_world
from tests.incidents.test_notify import Receiver
from tests.serving.test_playground import (  # noqa: F401 (serve_proxy is a fixture)
    HTMX,
    _answers,
    _field_errors,
    _post,
    _Router,
    _serving,
    _url,
    serve_proxy,
)

pytestmark = pytest.mark.django_db


# --- The cause rules' match counts -------------------------------------------------------


def _matches_url(world: TenantWorld) -> str:
    return reverse("cause-rule-matches", args=[world.tenant.slug])


def _rules_with_an_incident(world: TenantWorld) -> None:
    cause_rule_for_world(world)
    breach(world, objective="latency")  # open: its signals are the costly, short-cached kind


def test_reloading_the_match_counts_is_bounded_per_tenant_not_per_member(
    client: Client, world_a: TenantWorld, world_b: TenantWorld, settings: Any
) -> None:
    settings.RULE_MATCHES_PER_MINUTE = 3
    _rules_with_an_incident(world_a)
    _rules_with_an_incident(world_b)
    url = _matches_url(world_a)
    for member in (world_a.viewer, world_a.operator, world_a.owner):  # three "tabs"
        client.force_login(member)
        page = client.get(url)
        assert page.status_code == 200 and 'data-testid="rules-window"' in page.content.decode()
    # A fourth load, by any member: refused before any signal is read, naming the limit.
    client.force_login(world_a.viewer)
    refused = client.get(url)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 20
    text = refused.content.decode()
    assert "at most 3 a minute per tenant" in text and 'data-testid="throttled"' in text
    assert 'data-testid="rules-window"' not in text  # no counts were made
    # The page's own htmx load gets the same refusal as a 200 (htmx swaps only 2xx), and the
    # fragment loads itself again once Retry-After has passed, not at once.
    htmx = client.get(url, **HTMX)
    assert htmx.status_code == 200 and htmx["Retry-After"]
    assert f'hx-trigger="load delay:{htmx["Retry-After"]}s"' in htmx.content.decode()
    # The neighbour counts as usual.
    client.force_login(world_b.viewer)
    theirs = client.get(_matches_url(world_b))
    assert theirs.status_code == 200 and 'data-testid="rules-window"' in theirs.content.decode()
    assert "throttled" not in theirs.content.decode()


def test_concurrent_loads_of_one_tenant_count_one_at_a_time(
    client: Client,
    world_a: TenantWorld,
    world_b: TenantWorld,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.RULE_MATCHES_WAIT_S = 0.3
    _rules_with_an_incident(world_a)
    _rules_with_an_incident(world_b)
    computed: list[int] = []
    released = threading.Event()
    real = rule_matches.incident_signals

    def spy(**kwargs: Any) -> Any:  # the real computation, recorded
        computed.append(kwargs["tenant"].pk)
        if kwargs["tenant"].pk == world_a.tenant.pk:
            assert released.is_set(), "Acme's signals were computed while its count ran"
        return real(**kwargs)

    monkeypatch.setattr(rule_matches, "incident_signals", spy)
    # Another load of Acme's is counting (it holds the tenant's turn, as a web process does).
    running = rule_matches.rule_matches_turn(tenant=world_a.tenant)
    assert running.acquire(blocking=False)
    client.force_login(world_a.viewer)
    busy = client.get(_matches_url(world_a))
    assert busy.status_code == 429 and int(busy["Retry-After"]) >= 1
    assert "already being computed (one at a time per tenant)" in busy.content.decode()
    # Globex is not behind Acme's turn.
    client.force_login(world_b.viewer)
    assert client.get(_matches_url(world_b)).status_code == 200
    assert computed == [world_b.tenant.pk]
    # A load that arrives while the count runs waits for it, then counts.
    settings.RULE_MATCHES_WAIT_S = 10

    def finish() -> None:
        released.set()
        running.release()

    timer = threading.Timer(0.5, finish)
    timer.start()
    client.force_login(world_a.viewer)
    try:
        waited = client.get(_matches_url(world_a))
    finally:
        timer.cancel()
        timer.join()
    assert waited.status_code == 200 and released.is_set()
    assert computed == [world_b.tenant.pk, world_a.tenant.pk]
    # The next load reuses what that count cached: no signal is computed again.
    assert client.get(_matches_url(world_a)).status_code == 200
    assert computed == [world_b.tenant.pk, world_a.tenant.pk]


# --- "Send test" of notification channels ------------------------------------------------


def test_hammering_send_test_queues_a_bounded_few_and_never_sends_inside_the_request(
    client: Client,
    world_a: TenantWorld,
    world_b: TenantWorld,
    receiver: Receiver,  # noqa: F811
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    actor = Actor(user=world_a.owner)
    channels = [
        incident_services.notification_channel_create(
            tenant=world_a.tenant, actor=actor, kind="webhook", name=f"victim-{i}",
            url=f"{receiver.url}/a{i}",
        )[0]
        for i in range(8)
    ]  # fmt: skip
    theirs, _ = incident_services.notification_channel_create(
        tenant=world_b.tenant, actor=Actor(user=world_b.owner), kind="webhook", name="ops",
        url=f"{receiver.url}/b",
    )  # fmt: skip
    client.force_login(world_a.operator)
    refused: list[str] = []
    with django_capture_on_commit_callbacks(execute=False) as queued:
        for channel in channels * 2:
            url = reverse("notification-channel-test", args=[world_a.tenant.slug, channel.pk])
            page = client.post(url, follow=True).content.decode()
            if "not sent: too many test messages" in page:
                refused.append(page)
    # Every press answered without reaching any receiver: the sends are queued tasks.
    assert receiver.requests == []
    assert len(queued) == 5 and len(refused) == 11
    assert all("5 per tenant a minute" in page for page in refused)
    # The neighbour's test is queued and sent as usual, next to Acme's bounded few.
    client.force_login(world_b.operator)
    with django_capture_on_commit_callbacks(execute=False) as theirs_queued:
        response = client.post(
            reverse("notification-channel-test", args=[world_b.tenant.slug, theirs.pk]),
            follow=True,
        )
    assert "Sending a test message to ops…" in response.content.decode()
    for callback in [*queued, *theirs_queued]:  # the worker (eager here) runs them
        callback()
    paths = sorted(r["body"]["channel"]["id"] for r in receiver.requests)
    assert len(paths) == 6 and theirs.pk in paths
    audits = AuditEvent.objects.filter(action="notification_channel.tested")
    assert audits.filter(tenant=world_b.tenant, after__result="sent").count() == 1
    assert audits.filter(tenant=world_a.tenant).count() == 5


def test_send_test_of_a_neighbours_or_a_missing_channel_names_the_refusal(
    client: Client,
    world_a: TenantWorld,
    world_b: TenantWorld,
    receiver: Receiver,  # noqa: F811
) -> None:
    theirs, _ = incident_services.notification_channel_create(
        tenant=world_b.tenant, actor=Actor(user=world_b.owner), kind="webhook", name="ops",
        url=receiver.url,
    )  # fmt: skip
    mine, _ = incident_services.notification_channel_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), kind="webhook", name="off",
        url=receiver.url, is_active=False,
    )  # fmt: skip
    client.force_login(world_a.owner)
    url = reverse("notification-channel-test", args=[world_a.tenant.slug, theirs.pk])
    assert client.post(url).status_code == 404
    url = reverse("notification-channel-test", args=[world_a.tenant.slug, mine.pk])
    page = client.post(url, follow=True).content.decode()
    assert "Test of off not sent: the channel &#x27;off&#x27; is switched off" in page
    assert receiver.requests == []
    assert not AuditEvent.objects.filter(action="notification_channel.tested").exists()


# --- The deployment playground -------------------------------------------------------------


@pytest.mark.usefixtures("serve_proxy")
def test_many_members_of_one_tenant_share_its_playground_budget(
    client: Client, world_a: TenantWorld, world_b: TenantWorld, settings: Any
) -> None:
    settings.PLAYGROUND_PER_MINUTE = 10
    settings.PLAYGROUND_TENANT_PER_MINUTE = 3
    ours = _serving(world_a)
    members = [world_a.owner, world_a.operator] + [
        add_member(world_a.tenant, world_a.owner, f"sock{i}@acme.example", Role.OPERATOR)
        for i in range(3)
    ]
    for member in members[:3]:  # each member well inside their own bucket
        client.force_login(member)
        assert _answers(_post(client, _url(world_a, ours), arm="stable").content.decode())
    client.force_login(members[3])
    data = {"kind": "completion", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    refused = client.post(_url(world_a, ours), {**data, "arm": "stable"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "3 a minute for the tenant" in refused.content.decode()
    client.force_login(members[4])
    page = _post(client, _url(world_a, ours), arm="stable").content.decode()
    assert "Too many playground runs" in page and not _answers(page)
    assert len(_Router.seen) == 3
    # The neighbour's members run as usual.
    theirs = _serving(world_b)
    client.force_login(world_b.operator)
    assert _answers(_post(client, _url(world_b, theirs), arm="stable").content.decode())
    assert len(_Router.seen) == 4


@pytest.mark.usefixtures("serve_proxy")
def test_a_tenant_holds_at_most_its_cap_of_playground_runs_at_once(
    client: Client, world_a: TenantWorld, world_b: TenantWorld, settings: Any
) -> None:
    settings.PLAYGROUND_TENANT_CONCURRENT = 2
    ours = _serving(world_a)
    limits = playground_limits.playground_limits(deployment=ours)
    client.force_login(world_a.operator)
    with ExitStack() as running:
        # Two of Acme's runs are answering (two other members' web workers hold them).
        for _ in range(2):
            running.enter_context(
                playground_limits.playground_slot(tenant=world_a.tenant, limits=limits)
            )
        data = {"kind": "completion", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        refused = client.post(_url(world_a, ours), {**data, "arm": "both"})
        assert refused.status_code == 429
        assert 1 <= int(refused["Retry-After"]) <= int(limits.timeout_s) + 10
        text = refused.content.decode()
        assert "at most 2 at once per tenant" in text and not _answers(text)
        assert _Router.seen == []
        # Globex's run is not behind Acme's.
        theirs = _serving(world_b)
        client.force_login(world_b.operator)
        assert _answers(_post(client, _url(world_b, theirs), arm="stable").content.decode())
    # Acme's runs ended: its slots are free again, and a finished run gives its own back.
    # The refused run cost no bucket: the member still has all its runs of the minute.
    settings.PLAYGROUND_PER_MINUTE = 3
    client.force_login(world_a.operator)
    for _ in range(3):
        assert _answers(_post(client, _url(world_a, ours), arm="stable").content.decode())


@pytest.mark.usefixtures("serve_proxy")
def test_bad_playground_input_names_its_field_and_sends_nothing(
    client: Client, world_a: TenantWorld
) -> None:
    ours = _serving(world_a)
    limits = playground_limits.playground_limits(deployment=ours)
    client.force_login(world_a.operator)
    for field, value in (("max_tokens", 10_000), ("temperature", 9), ("arm", "all")):
        fields = {"arm": "stable", field: value}
        page = _post(client, _url(world_a, ours), **fields).content.decode()
        errors = _field_errors(page)
        assert list(errors) == [field], (field, errors)
        assert not _answers(page)
    assert (
        f"must be from 1 to {limits.max_tokens}"
        in _field_errors(
            _post(client, _url(world_a, ours), arm="stable", max_tokens=0).content.decode()
        )["max_tokens"]
    )
    assert _Router.seen == []
