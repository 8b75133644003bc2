"""The playground on a real local Ray cluster: a deployment with a canary on a sticky split,
"both side by side" from the page, each side answered by its own slot and version (the
`x-ab-group` pin holds on a sticky split because the playground sends no client key)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.models import Deployment
from serving.ops.playground import version_label
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_ops_loop import _version
from tests.serving.test_ops_ray import wait_running

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

ANSWER = re.compile(
    r'data-testid="playground-answer" data-arm="(\w*)" data-group="(\w*)" '
    r'data-version="([^"]*)" data-status="(\d*)"'
)
LATENCY = re.compile(r'data-testid="playground-latency">([\d.]+) ms<')


def test_both_sides_answer_from_their_own_version(
    client: Any,
    world_a: TenantWorld,
    ray_cluster: RayCluster,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    for name, value in ray_cluster.portal_env().items():
        monkeypatch.setenv(name, value)  # the portal's configured Serve proxy
    settings.PLAYGROUND_TIMEOUT_S = 60.0  # a first answer on a shared 2-core machine
    actor = Actor(user=world_a.owner)
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    canary = _version(world_a, "v2")
    deployments.deployment_change(
        tenant=world_a.tenant, actor=actor, deployment=deployment,
        changes={"canary_version": canary.pk, "canary_percent": 50,
                 "traffic": {"sticky": True}},
        reason="playground: canary v2 at 50% on a sticky split",
    )  # fmt: skip
    cluster = ray_cluster.client()
    control.reconcile(target=ray_cluster.target, client=cluster)
    app = f"{world_a.tenant.slug}.assistant"
    cluster.wait_until([app, f"{app}.canary"], timeout=180)
    wait_running(deployment, cluster)
    revision = Deployment.objects.get(pk=deployment.pk).current_revision
    expected = {
        "stable": version_label(revision.stable_version),
        "canary": version_label(revision.canary_version),
    }
    assert expected["stable"] != expected["canary"]

    client.force_login(world_a.operator)
    url = reverse(
        "serving-deployment-playground", kwargs={"slug": world_a.tenant.slug, "pk": deployment.pk}
    )
    data = {"kind": "completion", "prompt": "The quick brown fox", "max_tokens": 8,
            "temperature": 0, "arm": "both"}  # fmt: skip
    latencies: list[float] = []
    for kind in ("completion", "chat", "completion"):  # 50%: a lucky random split fails 1 in 8
        response = client.post(url, {**data, "kind": kind}, HTTP_HX_REQUEST="true")
        page = response.content.decode()
        answers = ANSWER.findall(page)
        assert [(arm, group, status) for arm, group, _, status in answers] == [
            ("stable", "stable", "200"), ("canary", "canary", "200")
        ], page  # fmt: skip
        for arm, _, version, _ in answers:
            assert version == expected[arm]
        assert len(re.findall(r"\d+ in, [1-8] out", page)) == 2  # each side's usage
        # Each side's traceparent and request id from the reply's headers.
        assert page.count("<code>00-") == 2 and "<code>–</code>" not in page
        latencies += [float(ms) for ms in LATENCY.findall(page)]
    print(f"playground latencies (ms, stable/canary per run): {latencies}")
