"""The hostile-tenant suite, signal SLIs: a tenant's contract cannot name unbounded or unknown
critical signals, an error reason the replicas do not count, a window longer than the series
the tick keeps, or a fraction above 1; each refusal is a 400 naming the field, and the
contract in force stays. Another tenant's health panel (with its replicas' weights and
coverage) is the same 404 as a missing deployment."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import health
from serving.slo.signals import SIGNALS
from tests.conftest import TenantWorld
from tests.serving.test_health_signals import FakeReplica, _version_label

pytestmark = pytest.mark.django_db

GOOD = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: signals
spec:
  window: 1h
  objectives:
    - {name: divergence, sli: state_divergence, max: 0.03}
    - {name: reasons, sli: errors_by_reason, reason: timeout, max: 0.1, window: 1m}
  critical_signals: [latency, weights]
"""


def _put(world: TenantWorld, source: str) -> Any:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    url = f"/api/v1/deployments/{deployment.pk}/contract/"
    return world.client().put(url, {"source": source}, format="json")


def test_a_hostile_tenant_cannot_abuse_signal_slis(world_a: TenantWorld) -> None:
    assert _put(world_a, GOOD).status_code == 200
    every = ", ".join(SIGNALS)
    attacks = [
        # Unbounded or unknown critical signals: the vocabulary is closed, no repeats.
        ("[latency, weights]", f"[{', '.join(['latency'] * 5000)}]", "spec.critical_signals"),
        ("[latency, weights]", f"[{every}, {every}]", "spec.critical_signals"),
        ("[latency, weights]", "[latency, '../../etc/passwd']", "spec.critical_signals[1]"),
        # A reason nobody counts, a window past the series, a fraction above 1.
        ("reason: timeout", "reason: '*'", "spec.objectives[1].reason"),
        ("window: 1m}", "window: 90d}", "spec.objectives[1].window"),
        ("max: 0.03}", "max: 1e308}", "spec.objectives[0].max"),
        ("max: 0.03}", "max: .nan}", "spec.objectives[0].max"),
    ]
    for old, new, field in attacks:
        assert GOOD.count(old) == 1, old
        response = _put(world_a, GOOD.replace(old, new))
        assert response.status_code == 400, (new[:80], response.content[:300])
        fields = response.json()["error"]["fields"]
        assert any(name == field or name.startswith(field) for name in fields), (field, fields)
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    current = world_a.client().get(f"/api/v1/deployments/{deployment.pk}/contract/").json()
    assert current["version"] == 1 and current["source"] == GOOD


def test_another_tenants_signals_panel_is_a_404(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    FakeReplica(deployment, "r1", _version_label(deployment), "sha-secret").serve(ok=3)
    health.tick(act=False)
    client.force_login(world_b.owner)
    for name in ("serving-deployment-health", "serving-deployment-health-live"):
        # world_b's slug with world_a's deployment id: the same 404 as a missing one.
        url = reverse(name, kwargs={"slug": world_b.tenant.slug, "pk": deployment.pk})
        response = client.get(url)
        assert response.status_code == 404 and b"sha-secret" not in response.content
