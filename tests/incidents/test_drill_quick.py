"""The overview's "Run a drill" card: an htmx fragment of the incidents room (tenants never
imports incidents) listing the newest drills, a button that starts a run and lands on its live
page, a link to a run in progress; roles, other tenants, and the overview's hx-get."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from incidents import drills
from incidents.drills.models import ChaosDrill, DrillRun, DrillStatus
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.factories import deployment_of, drill_for_world

pytestmark = pytest.mark.django_db


def _client(user: object) -> Client:
    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return client


def _quick(world: TenantWorld) -> str:
    return reverse("drill-quick", args=[world.tenant.slug])


def _error_burst(world: TenantWorld, name: str = "canary-error-burst") -> Any:
    return drills.drill_create(
        tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment_of(world),
        name=name, fault="error_burst", parameters={}, duration_s=45,
    )  # fmt: skip


def test_an_owner_sees_the_drill_with_a_run_button(world_a: TenantWorld) -> None:
    drill = _error_burst(world_a)
    response = _client(world_a.owner).get(_quick(world_a))
    page = response.content.decode()
    assert response.status_code == 200
    assert 'data-testid="drill-quick"' in page and "canary-error-burst" in page
    assert "assistant" in page and "Error burst" in page and "45 s" in page
    start = reverse("drill-start", args=[world_a.tenant.slug, drill.pk])
    assert f'action="{start}"' in page and 'data-testid="run-drill"' in page
    assert "csrfmiddlewaretoken" in page


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


def test_the_newest_three_active_drills_in_a_fixed_number_of_queries(
    world_a: TenantWorld,
) -> None:
    client = _client(world_a.owner)
    _error_burst(world_a, name="burst-0")
    client.get(_quick(world_a))  # warm the per-process caches
    one = _queries(client, _quick(world_a))
    for n in range(1, 5):
        _error_burst(world_a, name=f"burst-{n}")
    ChaosDrill.objects.filter(name="burst-4").update(is_active=False)
    # The page's own queries (session, user, tenant, membership) plus the drills and their
    # active runs: more rows cost no more queries (the deployment comes with the drill).
    assert _queries(client, _quick(world_a)) == one <= 10
    page = client.get(_quick(world_a)).content.decode()
    shown = [f"burst-{n}" for n in range(5) if f"burst-{n}" in page]
    assert shown == ["burst-1", "burst-2", "burst-3"]  # the oldest is left out, the inactive too
    assert page.index("burst-3") < page.index("burst-2") < page.index("burst-1")


def test_a_viewer_sees_the_drill_but_no_button(world_a: TenantWorld) -> None:
    _error_burst(world_a)
    page = _client(world_a.viewer).get(_quick(world_a)).content.decode()
    assert "canary-error-burst" in page
    assert 'data-testid="run-drill"' not in page


def test_no_drills_links_to_the_form(world_a: TenantWorld) -> None:
    page = _client(world_a.operator).get(_quick(world_a)).content.decode()
    assert 'data-testid="run-drill"' not in page
    assert reverse("drill-new", args=[world_a.tenant.slug]) in page
    viewer = _client(world_a.viewer).get(_quick(world_a)).content.decode()
    assert reverse("drill-new", args=[world_a.tenant.slug]) not in viewer


def test_other_tenants_drills_never_show_and_strangers_get_404(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    _error_burst(world_a)
    drill_for_world(world_b)
    page = _client(world_b.owner).get(_quick(world_b)).content.decode()
    assert "latency drill" in page and "canary-error-burst" not in page
    assert _client(world_b.owner).get(_quick(world_a)).status_code == 404
    assert Client().get(_quick(world_a)).status_code == 302  # anonymous: to the login page


def test_the_button_starts_a_run_and_lands_on_its_live_page(world_a: TenantWorld) -> None:
    drill = _error_burst(world_a)
    client = _client(world_a.owner)
    start = reverse("drill-start", args=[world_a.tenant.slug, drill.pk])
    response = client.post(start)
    run = DrillRun.objects.get(drill=drill)
    # The advance task is enqueued on commit: the test's transaction never commits, so the run
    # stays scheduled, as in test_drill_pages.
    assert run.status == DrillStatus.SCHEDULED and run.trigger == "manual"
    assert response.status_code == 302
    assert response["Location"] == reverse("drill-run", args=[world_a.tenant.slug, run.pk])
    live = client.get(response["Location"]).content.decode()
    assert 'data-testid="run-live"' in live and 'data-testid="run-mttd"' in live
    # While the run is active the card links to it instead of offering a second run.
    page = client.get(_quick(world_a)).content.decode()
    assert 'data-testid="run-drill"' not in page and 'data-testid="watch-run"' in page
    assert reverse("drill-run", args=[world_a.tenant.slug, run.pk]) in page


def test_the_overview_loads_the_card_by_htmx(world_a: TenantWorld) -> None:
    page = _client(world_a.viewer).get(reverse("tenant-overview", args=[world_a.tenant.slug]))
    assert f'hx-get="{_quick(world_a)}"' in page.content.decode()
    assert 'hx-trigger="load"' in page.content.decode()
