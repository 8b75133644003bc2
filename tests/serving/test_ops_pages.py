"""Ops pages of a deployment: the contract editor (errors inline by line and field, versions,
OpenSLO export and import), health (objectives, budget, burn rates, probe, KV; the polled
fragment; the SLI series endpoint), rollouts (policy, start, progress, pause/resume/confirm/
abort) and rollbacks ("roll back to previous"); roles and foreign tenants."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from serving.dataplane.sli import SliRecorder, publish
from serving.deployments import services as deploy
from serving.deployments.models import Deployment, DeploymentStatus
from serving.ops import health, rollbacks
from serving.ops.contracts import contract_current, contract_set
from serving.ops.forms import STARTER
from serving.ops.models import Rollback, RollbackStatus, Rollout, RolloutPolicy, RolloutStatus
from serving.registry import services as registry
from serving.registry.models import ModelVersion
from tenants.actors import Actor
from tests.conftest import TenantWorld, world_checkpoint
from tests.incidents.slis import sample

pytestmark = pytest.mark.django_db

CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: chat-sla
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.05
      for: 15s
      min_requests: 10
      action: notify
  alerts:
    - {severity: page, burn_rate: 14.4, long: 1h, short: 5m, action: notify}
"""


def _deployment(world: TenantWorld) -> Deployment:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    Deployment.objects.filter(pk=deployment.pk).update(status=DeploymentStatus.RUNNING)
    deployment.refresh_from_db()
    return deployment


def _url(world: TenantWorld, name: str, deployment: Deployment, **extra: Any) -> str:
    return reverse(name, kwargs={"slug": world.tenant.slug, "pk": deployment.pk, **extra})


def _second_version(world: TenantWorld) -> ModelVersion:
    served = ModelVersion.objects.get(tenant=world.tenant, label="s1").model
    version = registry.version_register_path(
        tenant=world.tenant, actor=Actor(user=world.owner), model=served, label="s2",
        path=str(world_checkpoint()),
    )  # fmt: skip
    registry.version_validate(tenant=world.tenant, version_id=version.pk)
    return version


def publish_sli(
    deployment: Deployment,
    group: str,
    ok: int,
    failed: int = 0,
    faults: dict[str, Any] | None = None,
) -> None:
    """One replica's SLI counters, published to the real Redis as the data plane does (with
    `faults`, the replica's fault report, as a drill's replica sends it)."""
    revision = Deployment.objects.get(pk=deployment.pk).current_revision
    version = revision.canary_version if group == "canary" else revision.stable_version
    label = f"{version.model.name}:{version.label}"  # what a replica with those weights says
    recorder = SliRecorder(f"{deployment.tenant.slug}.{deployment.name}", group, label, "r1")
    for index in range(ok + failed):
        recorder.current.record(latency_s=0.02, ok=index < ok, tokens_out=4)
    kv: dict[str, Any] = {"num_blocks": 64, "free_blocks": 48}
    if faults is not None:
        kv["faults"] = faults
    snapshot = recorder.roll(kv=kv)

    async def send() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        await publish(client, settings.SLI_KEY_PREFIX, snapshot)
        await client.aclose()

    asyncio.run(send())


# --- Contract ----------------------------------------------------------------------------------


def test_contract_editor_starts_from_a_valid_template_and_keeps_versions(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    client.force_login(world_a.operator)
    url = _url(world_a, "serving-deployment-contract", deployment)
    page = client.get(url).content.decode()
    assert 'data-testid="contract-none"' in page and 'data-testid="contract-form"' in page
    assert "# SLA contract of assistant" in page and 'data-testid="openslo-export"' not in page
    starter = STARTER.format(name=deployment.name)
    response = client.post(url, {"source": starter})
    assert response.status_code == 302 and response["Location"] == url
    first = contract_current(tenant=world_a.tenant, deployment=deployment)
    assert first is not None and first.version == 1 and first.name == "assistant-sla"
    client.post(url, {"source": CONTRACT})
    page = client.get(url).content.decode()
    assert "chat-sla v2" in page and 'data-testid="openslo-export"' in page
    assert page.count('data-testid="contract-version-row"') == 2
    version_url = _url(world_a, "serving-deployment-contract-version", deployment, version=1)
    assert f'href="{version_url}"' in page
    shown = client.get(version_url).content.decode()
    assert "assistant-sla v1" in shown and 'data-testid="contract-restore"' in shown
    # "Load into the editor" puts an old version back in the textarea (saving is explicit).
    assert "assistant-sla" in client.get(url + "?from=1").content.decode().split("<textarea")[1]
    assert client.post(url, {"source": CONTRACT}).status_code == 302  # same source: no v3
    assert contract_current(tenant=world_a.tenant, deployment=deployment).version == 2
    assert client.get(version_url.replace("/v1/", "/v9/")).status_code == 404


def test_invalid_contract_shows_every_error_by_line_and_field_and_keeps_the_old_one(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    contract_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        source=CONTRACT,
    )  # fmt: skip
    client.force_login(world_a.owner)
    url = _url(world_a, "serving-deployment-contract", deployment)
    bad = CONTRACT.replace("sli: availability", "sli: latency_p42").replace(
        "target: 0.99", "target: -0.5"
    )
    response = client.post(url, {"source": bad})
    assert response.status_code == 200
    page = response.content.decode()
    errors = page.split('data-testid="contract-error-list"')[1].split("</ul>")[0]
    assert re.search(r"line 9</a> — spec\.objectives\[0\]\.sli — ", errors), errors
    assert re.search(r"line 10</a> — spec\.objectives\[0\]\.target — ", errors), errors
    view = page.split('data-testid="contract-source-view"')[1].split("</table>")[0]
    marked = re.findall(r'<tr id="L(\d+)" data-line="\d+" class="bad"', view)
    assert marked == ["9", "10"]
    assert "latency_p42" in view and "spec.objectives[0].sli:" in view
    assert "latency_p42" in page.split("<textarea")[1]  # the bad source stays in the editor
    assert "The contract in force (v1) is unchanged" in page
    current = contract_current(tenant=world_a.tenant, deployment=deployment)
    assert current.version == 1 and current.source == CONTRACT
    # A YAML syntax error at the end of the text marks the line past the last one.
    page = client.post(url, {"source": "spec: [unclosed\n"}).content.decode()
    assert 'data-line="2" class="bad"' in page and "line 2</a> — document — " in page


def test_openslo_export_with_the_session_and_import_from_the_page(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    client.force_login(world_a.operator)
    url = _url(world_a, "serving-deployment-contract", deployment)
    client.post(url, {"source": CONTRACT})
    page = client.get(url).content.decode()
    export = re.search(r'href="([^"]+)"[^>]*data-testid="openslo-export"', page)
    assert export is not None
    exported = client.get(export[1])
    assert exported.status_code == 200 and b"openslo/v1" in exported.content
    imported = client.post(
        _url(world_a, "serving-deployment-contract-import", deployment),
        {"text": exported.content.decode()},
    )
    assert imported.status_code == 302
    assert contract_current(tenant=world_a.tenant, deployment=deployment).version == 2
    broken = client.post(
        _url(world_a, "serving-deployment-contract-import", deployment),
        {"text": "apiVersion: openslo/v1\nkind: SLO\nmetadata: {name: x}\nspec: {}\n"},
    )
    assert broken.status_code == 200
    assert 'data-testid="import-error-list"' in broken.content.decode()
    assert contract_current(tenant=world_a.tenant, deployment=deployment).version == 2
    empty = client.post(_url(world_a, "serving-deployment-contract-import", deployment), {})
    assert "Paste the OpenSLO YAML" in empty.content.decode()


def test_viewer_reads_the_contract_and_cannot_change_it(client: Any, world_a: TenantWorld) -> None:
    deployment = _deployment(world_a)
    contract_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        source=CONTRACT,
    )  # fmt: skip
    client.force_login(world_a.viewer)
    url = _url(world_a, "serving-deployment-contract", deployment)
    page = client.get(url).content.decode()
    assert 'data-testid="contract-read-only"' in page and "chat-sla" in page
    assert 'data-testid="contract-form"' not in page and 'data-testid="import-form"' not in page
    assert client.post(url, {"source": STARTER.format(name="x")}).status_code == 403
    import_url = _url(world_a, "serving-deployment-contract-import", deployment)
    assert client.post(import_url, {"text": "x"}).status_code == 403
    assert contract_current(tenant=world_a.tenant, deployment=deployment).version == 1


# --- Health ------------------------------------------------------------------------------------


def test_health_page_shows_objectives_budget_burn_rates_probe_and_kv(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    client.force_login(world_a.viewer)
    url = _url(world_a, "serving-deployment-health", deployment)
    assert 'data-testid="health-none"' in client.get(url).content.decode()
    contract_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        source=CONTRACT,
    )  # fmt: skip
    publish_sli(deployment, "stable", ok=90, failed=10)
    health.tick(now=time.time(), act=False)
    page = client.get(url).content.decode()
    assert 'hx-trigger="every 2s"' in page and "data-sli-chart" in page
    assert "Checked every 2 s against" in page  # no canary in flight
    row = page.split('data-testid="objective-row"')[1].split("</tr>")[0]
    assert 'data-objective="availability"' in row and 'data-state="breach"' in row
    assert "<td>99%</td>" in row and ">90%</td>" in row  # target and current value
    assert 'data-testid="budget-left"' in row and "Burn 1h" in page and "Burn 5m" in page
    firing = page.split('data-testid="firing"')[1].split("</table>")[0]
    assert "error-spike" in firing and "availability" in firing
    assert "16 of 64 blocks used (25%)" in page
    assert "not probed" in page  # no Serve URL in this tick
    live = client.get(_url(world_a, "serving-deployment-health-live", deployment))
    assert live.status_code == 200 and live.content.decode().startswith('<div id="health-live"')


def test_sli_series_per_slot_and_range(client: Any, world_a: TenantWorld) -> None:
    deployment = _deployment(world_a)
    now = timezone.now()
    for seconds in (30, 20, 10):
        sample(deployment, now - timedelta(seconds=seconds), requests=100, errors=5)
    sample(deployment, now - timedelta(seconds=10), group="canary", requests=10, errors=5,
           latency_ms=300)  # fmt: skip
    for minutes in (3, 2):  # two minute rows in one 2-minute bucket of the 24h range
        sample(deployment, now - timedelta(minutes=minutes), seconds=60, requests=600,
               resolution=60)  # fmt: skip
    client.force_login(world_a.viewer)
    url = _url(world_a, "serving-deployment-health-series", deployment)
    data = client.get(url).json()
    assert data["range"] == "15m" and len(data["x"]) == 3
    stable, canary = data["series"]["stable"], data["series"]["canary"]
    assert stable["rps"] == [10.0, 10.0, 10.0] and stable["error_ratio"] == [0.05] * 3
    assert stable["p95_ms"] == [50.0] * 3
    assert canary["rps"] == [None, None, 1.0] and canary["p95_ms"][-1] == 500.0
    day = client.get(url + "?range=24h").json()
    assert day["bucket_s"] == 120 and "canary" not in day["series"]
    assert sum(r is not None for r in day["series"]["stable"]["rps"]) in (1, 2)
    assert client.get(url + "?range=1y").status_code == 400


# --- Rollouts and rollbacks ----------------------------------------------------------------------


POLICY = {"steps": "20:0\n50:0", "analysis_interval_s": 1, "failure_limit": 0,
          "min_requests": 10, "on_failure": "abort"}  # fmt: skip


def test_rollout_policy_start_progress_pause_resume_and_confirm(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    v2 = _second_version(world_a)
    client.force_login(world_a.operator)
    page_url = _url(world_a, "serving-deployment-rollouts", deployment)
    page = client.get(page_url).content.decode()
    assert 'data-testid="no-rollout"' in page and 'data-testid="start-needs-policy"' in page
    policy_url = _url(world_a, "serving-deployment-rollout-policy", deployment)
    bad = client.post(policy_url, {**POLICY, "steps": "50:0\n20:0"}).content.decode()
    assert "step 2: weight must be in (0, 100] and never decrease." in bad
    assert (
        "line 2: write weight:pause_s"
        in client.post(policy_url, {**POLICY, "steps": "20:0\nlots"}).content.decode()
    )
    assert client.post(policy_url, POLICY).status_code == 302
    policy = RolloutPolicy.objects.get(deployment=deployment)
    assert policy.steps == [{"weight": 20.0, "pause_s": 0.0}, {"weight": 50.0, "pause_s": 0.0}]
    assert "20:0\n50:0" in client.get(page_url).content.decode()

    start = client.post(_url(world_a, "serving-deployment-rollout-start", deployment),
                        {"version": v2.pk})  # fmt: skip
    assert start.status_code == 302
    rollout = Rollout.objects.get(deployment=deployment)
    deployment.refresh_from_db()
    assert deployment.current_revision.canary_version_id == v2.pk
    progress = client.get(_url(world_a, "serving-deployment-rollout-progress", deployment))
    html = progress.content.decode()
    assert 'hx-trigger="every 2s"' in html and 'data-state="current"' in html
    assert html.count('class="step ') == 2 and ">Pause</button>" in html

    def act(action: str) -> str:
        url = _url(world_a, "serving-deployment-rollout-action", deployment,
                   rollout_pk=rollout.pk, action=action)  # fmt: skip
        response = client.post(url, follow=True)
        rollout.refresh_from_db()
        return response.content.decode()

    assert "Rollout paused." in act("pause") and rollout.status == RolloutStatus.PAUSED
    assert ">Resume</button>" in client.get(page_url).content.decode()
    assert "Rollout resumed." in act("resume") and rollout.status == RolloutStatus.PROGRESSING
    assert "not needs_review" in act("confirm") and rollout.status == RolloutStatus.PROGRESSING
    Rollout.objects.filter(pk=rollout.pk).update(status=RolloutStatus.NEEDS_REVIEW)
    assert "Confirm and promote" in client.get(page_url).content.decode()
    assert "promoted" in act("confirm") and rollout.status == RolloutStatus.SUCCESSFUL
    deployment.refresh_from_db()
    assert deployment.current_revision.stable_version_id == v2.pk
    final = client.get(page_url).content.decode()
    assert "Last rollout" in final and 'hx-trigger="every 2s"' not in final.split("</section>")[0]
    assert (
        client.post(
            _url(
                world_a,
                "serving-deployment-rollout-action",
                deployment,
                rollout_pk=rollout.pk,
                action="explode",
            )  # fmt: skip
        ).status_code
        == 404
    )


def test_abort_rolls_back_and_roll_back_to_previous_from_the_deployment_page(
    client: Any,
    world_a: TenantWorld,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    monkeypatch.setattr(rollbacks, "_apply", lambda: None)  # no Ray: the reconcile is a no-op
    deployment = _deployment(world_a)
    v1 = deployment.current_revision.stable_version_id
    v2 = _second_version(world_a)
    client.force_login(world_a.operator)
    client.post(_url(world_a, "serving-deployment-rollout-policy", deployment), POLICY)
    client.post(_url(world_a, "serving-deployment-rollout-start", deployment), {"version": v2.pk})
    rollout = Rollout.objects.get(deployment=deployment)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(_url(world_a, "serving-deployment-rollout-action", deployment,
                         rollout_pk=rollout.pk, action="abort"))  # fmt: skip
    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.FAILED
    aborted = Rollback.objects.get(deployment=deployment)
    assert aborted.trigger == "manual" and aborted.status == RollbackStatus.DONE

    # Promote v2 by hand; "roll back to previous" then brings v1 back in one click.
    actor = Actor(user=world_a.owner)
    deploy.deployment_set_canary(tenant=world_a.tenant, actor=actor, deployment=deployment,
                                 version_id=v2.pk, percent=10)  # fmt: skip
    health_url = _url(world_a, "serving-deployment-health", deployment)
    shown = client.get(health_url).content.decode()
    assert "Checked every 1 s while its canary is in flight (2 s without) against" in shown
    deploy.deployment_promote(tenant=world_a.tenant, actor=actor, deployment=deployment)
    detail = client.get(reverse("serving-deployment", args=[world_a.tenant.slug, deployment.pk]))
    panel_url = _url(world_a, "serving-deployment-rollbacks", deployment)
    assert f'hx-get="{panel_url}" hx-trigger="load"' in detail.content.decode()
    panel = client.get(panel_url).content.decode()
    assert "Roll back to previous (revision #" in panel and "served:s1" in panel
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(panel_url)
    assert response.status_code == 302
    assert response["Location"] == reverse(
        "serving-deployment", args=[world_a.tenant.slug, deployment.pk]
    )
    deployment.refresh_from_db()
    assert deployment.current_revision.stable_version_id == v1
    done = Rollback.objects.filter(deployment=deployment).order_by("-created_at").first()
    assert done.status == RollbackStatus.DONE and done.trigger == "manual"
    panel = client.get(panel_url).content.decode()
    assert panel.count('data-testid="rollback-row"') == 2 and " s</td>" in panel
    assert 'data-status="done"' in panel and "hx-trigger" not in panel  # nothing running


def test_viewer_sees_rollouts_and_rollbacks_but_changes_nothing(
    client: Any, world_a: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    v2 = _second_version(world_a)
    client.force_login(world_a.viewer)
    page = client.get(_url(world_a, "serving-deployment-rollouts", deployment)).content.decode()
    assert (
        'data-testid="policy-form"' not in page and 'data-testid="rollout-start-form"' not in page
    )
    assert 'data-testid="rollback-form"' not in page and 'data-testid="rollbacks-table"' in page
    for name, data in (
        ("serving-deployment-rollout-policy", POLICY),
        ("serving-deployment-rollout-start", {"version": v2.pk}),
        ("serving-deployment-rollbacks", {}),
    ):
        assert client.post(_url(world_a, name, deployment), data).status_code == 403, name
    assert not RolloutPolicy.objects.filter(deployment=deployment).exists()
    assert not Rollback.objects.filter(deployment=deployment).exists()


def test_a_first_revision_has_nothing_to_roll_back_to(client: Any, world_a: TenantWorld) -> None:
    deployment = _deployment(world_a)
    client.force_login(world_a.owner)
    panel_url = _url(world_a, "serving-deployment-rollbacks", deployment)
    assert 'data-testid="no-rollback-target"' in client.get(panel_url).content.decode()
    response = client.post(panel_url, follow=True)
    assert "no earlier good revision" in response.content.decode()
    assert not Rollback.objects.filter(deployment=deployment).exists()


# --- Tenancy -------------------------------------------------------------------------------------

GET_PAGES = [
    ("serving-deployment-contract", {}),
    ("serving-deployment-contract-version", {"version": 1}),
    ("serving-deployment-health", {}),
    ("serving-deployment-health-live", {}),
    ("serving-deployment-health-series", {}),
    ("serving-deployment-rollouts", {}),
    ("serving-deployment-rollout-progress", {}),
    ("serving-deployment-rollbacks", {}),
]
POST_PAGES = [
    ("serving-deployment-contract", {}, {"source": CONTRACT}),
    ("serving-deployment-contract-import", {}, {"text": "x"}),
    ("serving-deployment-rollout-policy", {}, POLICY),
    ("serving-deployment-rollout-start", {}, {"version": 1}),
    ("serving-deployment-rollout-action", {"rollout_pk": 1, "action": "pause"}, {}),
    ("serving-deployment-rollbacks", {}, {}),
]


def test_another_tenant_gets_404_everywhere(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = _deployment(world_a)
    contract_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
        source=CONTRACT,
    )  # fmt: skip
    client.force_login(world_b.owner)
    for slug in (world_a.tenant.slug, world_b.tenant.slug):
        for name, extra in GET_PAGES:
            url = reverse(name, kwargs={"slug": slug, "pk": deployment.pk, **extra})
            assert client.get(url).status_code == 404, url
        for name, extra, data in POST_PAGES:
            url = reverse(name, kwargs={"slug": slug, "pk": deployment.pk, **extra})
            assert client.post(url, data).status_code == 404, url
    assert contract_current(tenant=world_a.tenant, deployment=deployment).version == 1
    client.logout()
    url = _url(world_a, "serving-deployment-health", deployment)
    assert client.get(url)["Location"].startswith(reverse("login"))


def test_deployment_page_links_the_ops_pages(client: Any, world_a: TenantWorld) -> None:
    deployment = _deployment(world_a)
    client.force_login(world_a.viewer)
    page = client.get(reverse("serving-deployment", args=[world_a.tenant.slug, deployment.pk]))
    html = page.content.decode()
    for name in ("serving-deployment-health", "serving-deployment-contract",
                 "serving-deployment-rollouts"):  # fmt: skip
        assert f'href="{_url(world_a, name, deployment)}"' in html
    assert f'href="{reverse("incident-list", args=[world_a.tenant.slug])}"' in html  # the nav
