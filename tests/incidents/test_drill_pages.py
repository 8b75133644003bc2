"""Drill pages: the catalogue and list, the form (errors next to the field, nothing saved),
a run started from the drill page and its live fragment, stop; roles and other tenants."""

from __future__ import annotations

import pytest
from django.test import Client

from incidents import drills
from incidents.drills.models import ChaosDrill, DrillRun, DrillStatus
from tests.conftest import TenantWorld
from tests.incidents.factories import deployment_of, drill_for_world

pytestmark = pytest.mark.django_db


def _client(user: object) -> Client:
    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return client


def _form(world: TenantWorld, **extra: str) -> dict[str, str]:
    return {
        "name": "slow canary", "deployment": str(deployment_of(world).pk),
        "fault": "latency_spike", "group": "stable", "p_latency_spike_delay_ms": "800",
        "p_latency_spike_distribution": "fixed", "p_error_burst_status": "503",
        "traffic_share": "0.5", "replica_share": "1", "duration_s": "30",
        "probe_0_sli": "latency_p95_ms", "probe_0_bound": "500",
        "abort_error_rate_above": "", "schedule": "", "revert": "always", "description": "",
        **extra,
    }  # fmt: skip


def test_the_catalogue_and_a_drill_made_in_the_form(world_a: TenantWorld) -> None:
    client = _client(world_a.operator)
    slug = world_a.tenant.slug
    page = client.get(f"/t/{slug}/drills/").content.decode()
    assert 'data-testid="drill-catalogue"' in page and "replica_crash" in page
    response = client.post(f"/t/{slug}/drills/new/", _form(world_a))
    drill = ChaosDrill.objects.get(tenant=world_a.tenant)
    assert response.status_code == 302 and response["Location"].endswith(f"/drills/{drill.pk}/")
    # The chosen fault's fields only (the error burst's status was ignored); defaults filled.
    assert drill.parameters == {"delay_ms": 800, "jitter_ms": 0, "distribution": "fixed"}
    assert drill.steady_state == {
        "contract": False,
        "probes": [
            {"name": "latency_p95_ms <= 500.0", "sli": "latency_p95_ms", "max": 500.0, "weight": 1}
        ],
    }
    assert drill.abort_conditions == {}
    form = client.get(f"/t/{slug}/drills/new/").content.decode()
    # Each fault's parameters as fields with their range and default, no JSON to type.
    assert 'name="p_latency_spike_delay_ms"' in form and 'max="600000"' in form
    assert 'value="500"' in form and 'name="parameters"' not in form
    assert form.count('data-testid="fault-params"') == len(drills.catalogue())
    detail = client.get(f"/t/{slug}/drills/{drill.pk}/").content.decode()
    assert 'data-testid="drill-start"' in detail


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"p_latency_spike_delay_ms": "oops"}, 'data-field="p_latency_spike_delay_ms"'),
        ({"p_latency_spike_delay_ms": "-1"}, 'data-field="p_latency_spike_delay_ms"'),
        ({"p_latency_spike_distribution": "cubic"}, 'data-field="p_latency_spike_distribution"'),
        ({"schedule": "now"}, "cron expression of 5 fields"),
        ({"probe_0_sli": "mood"}, 'data-field="probe_0_sli"'),
        ({"probe_0_bound": ""}, "give the probe&#x27;s bound"),
        ({"abort_error_rate_above": "2"}, 'data-field="abort_error_rate_above"'),
    ],
)
def test_form_errors_are_shown_and_nothing_is_saved(
    world_a: TenantWorld, extra: dict[str, str], message: str
) -> None:
    client = _client(world_a.operator)
    response = client.post(f"/t/{world_a.tenant.slug}/drills/new/", _form(world_a, **extra))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not ChaosDrill.objects.exists()


def test_a_run_is_started_followed_and_stopped(world_a: TenantWorld) -> None:
    drill = drill_for_world(world_a)
    client = _client(world_a.operator)
    slug = world_a.tenant.slug
    response = client.post(f"/t/{slug}/drills/{drill.pk}/run/")
    run = DrillRun.objects.get(drill=drill)
    assert response["Location"].endswith(f"/drill-runs/{run.pk}/")
    page = client.get(f"/t/{slug}/drill-runs/{run.pk}/").content.decode()
    assert 'data-testid="run-stop"' in page and 'data-testid="sli-chart"' in page
    live = client.get(f"/t/{slug}/drill-runs/{run.pk}/live/").content.decode()
    assert 'data-status="scheduled"' in live and "manual run of latency drill" in live
    client.post(f"/t/{slug}/drill-runs/{run.pk}/stop/")
    run.refresh_from_db()
    assert run.stop_requested and run.status == DrillStatus.SCHEDULED
    # A second run on the same deployment is refused while this one is active.
    again = client.post(f"/t/{slug}/drills/{drill.pk}/run/", follow=True).content.decode()
    assert "another drill run is in progress" in again


def test_viewers_watch_and_strangers_get_404(world_a: TenantWorld, world_b: TenantWorld) -> None:
    drill = drill_for_world(world_a)
    viewer = _client(world_a.viewer)
    slug = world_a.tenant.slug
    page = viewer.get(f"/t/{slug}/drills/{drill.pk}/").content.decode()
    assert 'data-testid="drill-start"' not in page
    assert viewer.post(f"/t/{slug}/drills/{drill.pk}/run/").status_code == 403
    assert viewer.get(f"/t/{slug}/drills/new/").status_code == 403
    stranger = _client(world_b.owner)
    assert stranger.get(f"/t/{slug}/drills/{drill.pk}/").status_code == 404
    other = world_b.tenant.slug
    assert stranger.get(f"/t/{other}/drills/{drill.pk}/").status_code == 404
    assert not DrillRun.objects.exists()
