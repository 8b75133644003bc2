"""Incident pages: the list (filters, open first, fragments the live stream re-fetches) and the
detail (status buttons by role, timeline, breaches, linked rollback, hints, notes, postmortem);
roles, other tenants, anonymous."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from incidents import services
from incidents.models import EventKind, Incident, IncidentStatus
from serving.ops.models import Rollback, RollbackStatus
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.factories import breach, deployment_of

pytestmark = pytest.mark.django_db


def _url(world: TenantWorld, name: str, incident: Incident | None = None, **extra: Any) -> str:
    kwargs: dict[str, Any] = {"slug": world.tenant.slug, **extra}
    if incident is not None:
        kwargs["pk"] = incident.pk
    return reverse(name, kwargs=kwargs)


def _three(world: TenantWorld) -> tuple[Incident, Incident, Incident]:
    """A resolved page (the oldest), an open ticket, and the newest open page."""
    now = timezone.now()
    resolved = breach(world, group="stable", detected_at=now - timedelta(hours=3))[1]
    services.incident_resolve(tenant=world.tenant, actor=None, incident=resolved)
    ticket = breach(world, group="canary", severity="ticket",
                    detected_at=now - timedelta(hours=2))[1]  # fmt: skip
    newest = breach(world, group="all", detected_at=now - timedelta(minutes=1))[1]
    return resolved, ticket, newest


def _ids(html: str) -> list[int]:
    return [int(part.split('"')[0]) for part in html.split('data-incident="')[1:]]


def test_list_puts_open_incidents_first_and_filters(
    client: Any, world_a: TenantWorld, django_assert_max_num_queries: Any
) -> None:
    resolved, ticket, newest = _three(world_a)
    client.force_login(world_a.viewer)
    url = _url(world_a, "incident-list")
    with django_assert_max_num_queries(12):
        page = client.get(url)
    html = page.content.decode()
    assert _ids(html) == [newest.pk, ticket.pk, resolved.pk]
    assert f'href="{url}"' in html  # the nav link
    assert 'data-incidents-live data-tenant="acme"' in html and "js/incidents-live.js" in html
    assert _ids(client.get(url + "?status=open").content.decode()) == [newest.pk, ticket.pk]
    assert _ids(client.get(url + "?status=resolved").content.decode()) == [resolved.pk]
    assert _ids(client.get(url + "?severity=ticket").content.decode()) == [ticket.pk]
    filtered = client.get(url + "?status=open&severity=page").content.decode()
    assert _ids(filtered) == [newest.pk]
    assert f'data-live-url="{_url(world_a, "incident-table")}?status=open&amp;severity=page"' in (
        filtered
    )
    # A filter that makes no sense finds nothing and names itself.
    bogus = client.get(url + "?status=bogus").content.decode()
    assert _ids(bogus) == [] and 'data-testid="filter-errors"' in bogus and "status:" in bogus
    # By deployment (the tenant's own only), real or drill, and day.
    deployment = deployment_of(world_a)
    assert _ids(client.get(url + f"?deployment={deployment.pk}").content.decode()) == _ids(html)
    Incident.objects.filter(pk=ticket.pk).update(is_drill=True)
    assert _ids(client.get(url + "?kind=drill").content.decode()) == [ticket.pk]
    assert _ids(client.get(url + "?kind=real").content.decode()) == [newest.pk, resolved.pk]
    # Days in UTC, from the incidents' own (three hours back crosses midnight after 21:00).
    first, last = resolved.triggered_at.date(), newest.triggered_at.date()
    assert _ids(client.get(url + f"?since={last + timedelta(days=1)}").content.decode()) == []
    assert _ids(client.get(url + f"?until={first - timedelta(days=1)}").content.decode()) == []
    assert len(_ids(client.get(url + f"?since={first}").content.decode())) == 3
    assert _ids(client.get(url + f"?since={last}&until={last}").content.decode())[0] == newest.pk
    table = client.get(_url(world_a, "incident-table") + "?status=resolved").content.decode()
    assert table.startswith('<div id="incident-table"') and _ids(table) == [resolved.pk]
    row = client.get(_url(world_a, "incident-row", ticket)).content.decode()
    assert row.startswith(f'<tr id="incident-{ticket.pk}"') and "Triggered" in row


def test_detail_shows_status_timeline_breaches_rollback_and_hints(
    client: Any, world_a: TenantWorld, django_assert_max_num_queries: Any
) -> None:
    _, incident, _ = breach(world_a)
    breach(world_a, objective="p95", kind="burn")  # joins the same incident
    deployment = deployment_of(world_a)
    revision = deployment.current_revision
    now = timezone.now()
    rollback = Rollback.objects.create(
        tenant=world_a.tenant, deployment=deployment, key="test", trigger="breach",
        from_revision=revision, to_revision=revision, status=RollbackStatus.DONE,
        detected_at=now, started_at=now, traffic_switched_at=now, finished_at=now,
    )  # fmt: skip
    services.incident_link_rollback(tenant=world_a.tenant, incident=incident, rollback=rollback)
    client.force_login(world_a.operator)
    with django_assert_max_num_queries(20):  # hints included; flat in events and breaches
        html = client.get(_url(world_a, "incident-detail", incident)).content.decode()
    assert f"#{incident.pk} assistant: availability breached (stable)" in html
    assert 'data-testid="incident-status">Triggered' in html
    for action in ("acknowledge", "mitigate", "resolve"):
        assert f'data-testid="action-{action}"' in html
    assert html.count('data-testid="breach-row"') == 2
    assert html.count('data-testid="timeline-event"') == 2  # opened, then p95 joined
    assert "revision #1 → #1" in html and "Traffic switched" in html
    assert 'data-testid="hints"' in html and 'data-testid="note-form"' in html
    assert f'href="{_url(world_a, "incident-postmortem", incident)}" download' in html
    live = client.get(_url(world_a, "incident-live", incident)).content.decode()
    assert live.startswith('<div id="incident-live"') and f'data-incident="{incident.pk}"' in live


def test_status_buttons_notes_and_postmortem(client: Any, world_a: TenantWorld) -> None:
    incident = breach(world_a)[1]
    client.force_login(world_a.operator)
    detail = _url(world_a, "incident-detail", incident)

    def act(action: str) -> str:
        url = _url(world_a, "incident-action", incident, action=action)
        response = client.post(url, follow=True)
        assert response.redirect_chain[-1][0] == detail
        incident.refresh_from_db()
        return response.content.decode()

    assert "is acknowledged" in act("acknowledge") and incident.status == "acknowledged"
    html = act("mitigate")
    assert incident.status == IncidentStatus.MITIGATED
    assert 'data-testid="action-acknowledge"' not in html and 'data-testid="action-resolve"' in html
    assert "cannot become acknowledged" in act("acknowledge")  # never backwards
    assert incident.status == IncidentStatus.MITIGATED
    url = _url(world_a, "incident-action", incident, action="reopen")
    assert client.post(url).status_code == 404

    note_url = _url(world_a, "incident-note", incident)
    response = client.post(note_url, {"text": "Rolled back by hand; watching p95."}, follow=True)
    assert "Rolled back by hand; watching p95." in response.content.decode()
    note = incident.events.get(kind=EventKind.NOTE)
    assert note.actor == world_a.operator
    empty = client.post(note_url, {"text": "   "})
    assert empty.status_code == 200 and "errorlist" in empty.content.decode()
    assert incident.events.filter(kind=EventKind.NOTE).count() == 1

    act("resolve")
    assert incident.status == IncidentStatus.RESOLVED
    markdown = client.get(_url(world_a, "incident-postmortem", incident))
    assert markdown.status_code == 200
    assert markdown["Content-Type"].startswith("text/markdown")
    assert markdown["Content-Disposition"] == f'attachment; filename="incident-{incident.pk}.md"'
    assert "Rolled back by hand" in markdown.content.decode()


def test_viewer_reads_but_cannot_act_or_write_notes(client: Any, world_a: TenantWorld) -> None:
    incident = breach(world_a)[1]
    client.force_login(world_a.viewer)
    html = client.get(_url(world_a, "incident-detail", incident)).content.decode()
    assert 'data-testid="incident-actions"' not in html and 'data-testid="note-form"' not in html
    for action in ("acknowledge", "mitigate", "resolve"):
        url = _url(world_a, "incident-action", incident, action=action)
        assert client.post(url).status_code == 403
    assert client.post(_url(world_a, "incident-note", incident), {"text": "x"}).status_code == 403
    assert client.get(_url(world_a, "incident-postmortem", incident)).status_code == 200
    incident.refresh_from_db()
    assert incident.status == IncidentStatus.TRIGGERED
    assert not incident.events.filter(kind=EventKind.NOTE).exists()


def test_another_tenant_gets_404_and_anonymous_goes_to_login(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    incident = breach(world_a)[1]
    client.force_login(world_b.owner)
    for slug in (world_a.tenant.slug, world_b.tenant.slug):
        for name in ("incident-detail", "incident-row", "incident-live", "incident-postmortem"):
            url = reverse(name, kwargs={"slug": slug, "pk": incident.pk})
            assert client.get(url).status_code == 404, url
        for action in ("acknowledge", "resolve"):
            url = reverse("incident-action", kwargs={"slug": slug, "pk": incident.pk,
                                                     "action": action})  # fmt: skip
            assert client.post(url).status_code == 404, url
        url = reverse("incident-note", kwargs={"slug": slug, "pk": incident.pk})
        assert client.post(url, {"text": "x"}).status_code == 404
    assert client.get(_url(world_a, "incident-list")).status_code == 404
    assert _ids(client.get(_url(world_b, "incident-list")).content.decode()) == []
    incident.refresh_from_db()
    assert incident.status == IncidentStatus.TRIGGERED and incident.events.count() == 1
    client.logout()
    response = client.get(_url(world_a, "incident-detail", incident))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_actions_record_who_acted(client: Any, world_a: TenantWorld) -> None:
    incident = breach(world_a)[1]
    client.force_login(world_a.owner)
    client.post(_url(world_a, "incident-action", incident, action="acknowledge"))
    event = incident.events.get(kind=EventKind.STATUS_CHANGED)
    assert event.actor == world_a.owner and event.data == {
        "from": "triggered",
        "to": "acknowledged",
    }
    assert (
        services.incident_note(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), incident=incident, text="ok"
        ).kind
        == EventKind.NOTE
    )


def test_the_deployment_filter_knows_only_the_tenants_own(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    breach(world_a)
    client.force_login(world_a.viewer)
    url = _url(world_a, "incident-list")
    foreign = deployment_of(world_b)
    page = client.get(url + f"?deployment={foreign.pk}").content.decode()
    assert _ids(page) == [] and "deployment:" in page  # not a choice: an error, not a leak
    assert f'<option value="{foreign.pk}"' not in client.get(url).content.decode()
