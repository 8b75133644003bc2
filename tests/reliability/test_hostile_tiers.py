"""The hostile-tenant suite, degraded tiers: a tenant cannot make its router serve another
tenant's weights as a tier, keep unbounded drift state, declare more tiers than the seed's
levels, make the drift detector read more than a bounded part of each prompt, declare a
saturation trigger that never lets go, or pass the replicas anything but a known standby
precision. Every refusal
is a 4xx whose body names the field."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from serving.dataplane.drift import MAX_CHARS, DriftDetector, char_classes
from serving.deployments.models import Deployment
from serving.registry import services as registry
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db


def _patch(world: TenantWorld, tiers: Any) -> Any:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    return world.client().patch(
        reverse("deployment-detail", args=[deployment.pk]), {"tiers": tiers}, format="json"
    )


def test_a_hostile_tenant_cannot_abuse_tiers(world_a: TenantWorld, world_b: TenantWorld) -> None:
    ours = registry.version_validate(tenant=world_a.tenant, version_id=world_a.version.pk)
    theirs = registry.version_validate(tenant=world_b.tenant, version_id=world_b.version.pk)
    level = {"name": "distilled", "version_id": ours.pk}
    attacks = [
        # The neighbour's weights behind our route: the same answer as a missing id.
        ({"levels": [{**level, "version_id": theirs.pk}]}, "tiers.levels.0.version_id"),
        ({"levels": [{**level, "version_id": 10**12}]}, "tiers.levels.0.version_id"),
        # Unbounded state in the router: windows, reference, history window.
        ({"levels": [level], "window": 10**9}, "tiers.window"),
        ({"levels": [level], "reference_requests": 10**9}, "tiers.reference_requests"),
        ({"levels": [level], "sla_window_s": 10**12}, "tiers.sla_window_s"),
        ({"levels": [level], "dwell_s": float("1e300")}, "tiers.dwell_s"),
        # More tiers (more replicas) than the seed's levels; names the scheme does not know.
        ({"levels": [level] * 50}, "tiers.levels"),
        ({"levels": [{**level, "name": "canary"}]}, "tiers.levels.0.name"),
        ({"levels": [{**level, "name": "x" * 10000}]}, "tiers.levels.0.name"),
        ({"levels": [level], "pin": "stable"}, "tiers.pin"),
        ({"levels": [level], "extra": {"deep": [1] * 1000}}, "tiers.extra"),
        # A saturation trigger that would pin the router degraded for good (enter at 0, an
        # exit at or above enter), aim at a level it does not declare, or carry a payload.
        ({"levels": [level], "saturation": {"enter": 0}}, "tiers.saturation.enter"),
        ({"levels": [level], "saturation": {"enter": 1e-9}}, "tiers.saturation.enter"),
        ({"levels": [level], "saturation": {"enter": 0.5, "exit": 5}}, "tiers.saturation.exit"),
        ({"levels": [level], "saturation": {"level": "proxy"}}, "tiers.saturation.level"),
        ({"levels": [level], "saturation": {"x": [1] * 1000}}, "tiers.saturation.x"),
        ({"levels": [level], "saturation": [1] * 1000}, "tiers.saturation"),
        # The standby precision is one of two words, nothing the replica would interpret.
        ({"standby_precision": "x" * 10000}, "tiers.standby_precision"),
        ({"standby_precision": {"dtype": "int1"}}, "tiers.standby_precision"),
    ]
    for tiers, field in attacks:
        response = _patch(world_a, tiers)
        assert response.status_code == 400, (tiers, response.content)
        assert list(response.json()["error"]["fields"]) == [field], tiers
    # Nothing of that reached a revision.
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    assert deployment.current_revision.tiers == {}
    assert deployment.current_revision.number == 1


def test_the_drift_detector_reads_a_bounded_part_of_each_prompt() -> None:
    assert sum(char_classes("a" * 10**6)) == MAX_CHARS
    detector = DriftDetector(reference=5, window=5)
    for _ in range(100):
        detector.observe("x" * 10**5)
    assert len(detector.recent) == 5  # the window never grows past its size
