"""Incident analytics on known data: incidents per week by severity, MTTD and MTTR p50 / p95
with real incidents and drills apart, availability per deployment; the page and the API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from incidents.analytics import incident_analytics, merged_seconds, percentile
from incidents.models import Incident
from serving.ops.models import Resolution
from tests.conftest import TenantWorld
from tests.incidents.factories import deployment_of, drill_run_for_world
from tests.incidents.learning_support import api, incident_of, page, resolved
from tests.incidents.slis import sample


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.95) == 7.0
    assert percentile([60, 120, 180, 600], 0.5) == 150
    assert percentile([60, 120, 180, 600], 0.95) == pytest.approx(537)
    assert percentile(list(range(1, 11)), 0.5) == 5.5


def test_merged_spans_count_overlaps_once() -> None:
    t = timezone.now()
    spans = [(t, t + timedelta(seconds=60)), (t + timedelta(seconds=30), t + timedelta(seconds=90))]
    assert merged_seconds([*spans, (t + timedelta(seconds=200), t + timedelta(seconds=210))]) == 100


def _timed(world: TenantWorld, hours_ago: float, restore_s: float, **fields: Any) -> Incident:
    """An incident opened `hours_ago`, mitigated `restore_s` later, then resolved."""
    incident = resolved(world, incident_of(world))
    triggered = timezone.now() - timedelta(hours=hours_ago)
    Incident.objects.filter(pk=incident.pk).update(
        triggered_at=triggered,
        acknowledged_at=None,
        mitigated_at=triggered + timedelta(seconds=restore_s),
        resolved_at=triggered + timedelta(seconds=restore_s + 600),
        **fields,
    )
    return Incident.objects.get(pk=incident.pk)


def _known_history(world: TenantWorld) -> dict[str, Any]:
    deployment = deployment_of(world)
    real = [
        _timed(world, 10, 60),
        _timed(world, 20, 120, severity="ticket"),
        _timed(world, 30, 180),
        _timed(world, 40, 600),
    ]
    # Onsets: errors 90 s before the first opened, 300 s before the second; none for the rest.
    sample(deployment, real[0].triggered_at - timedelta(seconds=30), seconds=60, errors=5)
    sample(deployment, real[1].triggered_at - timedelta(seconds=240), seconds=60, errors=5)
    sample(deployment, real[2].triggered_at - timedelta(seconds=120), seconds=60, errors=0)
    run = drill_run_for_world(world)
    drill = _timed(world, 5, 30, is_drill=True, drill_run_id=run.pk)
    type(run).objects.filter(pk=run.pk).update(
        injected_at=drill.triggered_at - timedelta(seconds=45)
    )
    sample(
        deployment, timezone.now() - timedelta(hours=1), seconds=60, requests=1000, errors=10,
        resolution=Resolution.MINUTE,
    )  # fmt: skip
    return {"real": real, "drill": drill}


@pytest.mark.django_db
def test_figures_on_known_data(world_a: TenantWorld, world_b: TenantWorld) -> None:
    _known_history(world_a)
    resolved(world_b, incident_of(world_b))  # another tenant's: counted nowhere here
    data = incident_analytics(tenant=world_a.tenant, weeks=4, window_days=7)
    real, drill = data["timings"]["real"], data["timings"]["drill"]
    assert real["incidents"] == 4 and drill["incidents"] == 1
    assert real["mttr"] == {"n": 4, "p50_s": pytest.approx(150), "p95_s": pytest.approx(537)}
    assert real["mttd"] == {"n": 2, "p50_s": pytest.approx(195), "p95_s": pytest.approx(289.5)}
    assert drill["mttd"] == {"n": 1, "p50_s": pytest.approx(45), "p95_s": pytest.approx(45)}
    assert drill["mttr"]["p50_s"] == pytest.approx(30)
    weeks = data["per_week"]
    assert len(weeks) in (5, 6)  # four weeks back, Monday-aligned, to this week
    assert sum(w["page"] for w in weeks) == 3
    assert sum(w["ticket"] for w in weeks) == 1
    assert sum(w["drill"] for w in weeks) == 1
    [row] = data["availability"]
    assert row["name"] == "assistant" and (row["requests"], row["errors"]) == (1000, 10)
    assert row["request_availability"] == pytest.approx(0.99)
    down = 60 + 120 + 180 + 600  # the real incidents, opened to mitigated
    assert row["incident_free"] == pytest.approx(1 - down / (7 * 86400), abs=1e-6)
    assert row["incidents"] == 4


@pytest.mark.django_db
def test_an_open_incident_counts_down_to_now_and_bounds_hold(world_a: TenantWorld) -> None:
    incident = incident_of(world_a)
    Incident.objects.filter(pk=incident.pk).update(triggered_at=timezone.now() - timedelta(hours=1))
    data = incident_analytics(tenant=world_a.tenant, weeks=999, window_days=999)
    assert data["weeks"] == 52 and data["window_days"] == 30
    [row] = data["availability"]
    assert row["request_availability"] is None  # no traffic stored
    assert row["incident_free"] == pytest.approx(1 - 3600 / (30 * 86400), abs=1e-4)
    assert data["timings"]["real"]["mttr"] == {"n": 0, "p50_s": None, "p95_s": None}


@pytest.mark.django_db
def test_page_and_api(world_a: TenantWorld) -> None:
    _known_history(world_a)
    client = world_a.client("viewer")
    body = client.get(api("incident-analytics"), {"weeks": 4, "days": 7}).json()
    assert body["timings"]["real"]["mttr"]["p50_s"] == pytest.approx(150)
    assert body["availability"][0]["request_availability"] == pytest.approx(0.99)
    bad = client.get(api("incident-analytics"), {"weeks": 0})
    assert bad.status_code == 400 and "weeks" in bad.json()["error"]["fields"]
    listing = client.get(page(world_a, "incident-list")).content.decode()
    assert page(world_a, "incident-analytics-page") in listing
    html = client.get(page(world_a, "incident-analytics-page"), {"weeks": 4}).content.decode()
    assert 'data-testid="timing-real"' in html and 'data-testid="timing-drill"' in html
    assert "2.5 min" in html  # the real incidents' p50 time to restore
    assert 'data-testid="availability-row"' in html and "0.99000" in html
