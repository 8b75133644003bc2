"""Checks before a canary: POST .../versions/{id}/verify/ and .../benchmark/ queue a check of a
ready version (202), the worker runs the version's own engine in process (load test at the
asked concurrency, greedy), and GET version-checks/{id}/ shows the per-objective rows and the
verdict, or the measured levels and a contract draft that the contract editor accepts."""

from __future__ import annotations

from typing import Any

import pytest

from serving.deployments.models import Deployment
from serving.ops import contracts
from serving.ops.checks import limits
from serving.ops.checks.models import CheckStatus, VersionCheck
from serving.registry.models import ModelVersion, VersionStatus
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

# One objective every CPU passes (p95 under 10 s), one none does (a million tokens/s), and a
# drift objective whose reference puts every value in [0, 1).
CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: verify-sla
spec:
  window: 30d
  objectives:
    - name: p95-latency
      sli: latency_p95
      threshold_ms: 10000
    - name: throughput
      sli: tokens_per_s
      min: 1000000
    - name: prompt-length
      sli: drift_psi
      feature: prompt_length
      max: 0.2
      reference:
        edges: [0, 1, 2, 3]
        counts: [100, 1, 1]
"""


def _served(world: TenantWorld) -> tuple[Deployment, ModelVersion]:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    return deployment, deployment.current_revision.stable_version


def _url(version: ModelVersion, what: str) -> str:
    return f"/api/v1/models/{version.model_id}/versions/{version.pk}/{what}/"


def _contract(world: TenantWorld, deployment: Deployment) -> None:
    contracts.contract_set(
        tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment, source=CONTRACT
    )


def _run(client: Any, url: str, body: dict[str, Any], capture: Any) -> dict[str, Any]:
    with capture(execute=True):  # the task runs eagerly once the check's row is committed
        response = client.post(url, body, format="json")
    assert response.status_code == 202, response.content
    queued = response.json()
    assert queued["status"] == "queued" and queued["id"]
    shown = client.get(f"/api/v1/version-checks/{queued['id']}/")
    assert shown.status_code == 200
    return dict(shown.json())


def test_verify_gives_a_verdict_per_objective_action(
    world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    deployment, version = _served(world_a)
    _contract(world_a, deployment)
    client = world_a.client("operator")
    body = {
        "deployment_id": deployment.pk,
        "concurrency": 2,
        "requests": 6,
        "max_tokens": 4,
        "gates": {"throughput": "review", "prompt-length": "block"},
        "drift_sample": {"feature": "prompt_length", "values": [0.5] * 50},
    }
    check = _run(client, _url(version, "verify"), body, django_capture_on_commit_callbacks)
    assert check["status"] == "done", check["error"]
    rows = {row["objective"]: row for row in check["result"]["objectives"]}
    assert rows["p95-latency"]["ok"] is True and rows["p95-latency"]["measured"] == 1.0
    assert rows["throughput"]["ok"] is False and rows["throughput"]["action"] == "review"
    assert rows["prompt-length"]["ok"] is True and rows["prompt-length"]["measured"] < 0.2
    level = check["result"]["levels"][0]
    assert level["concurrency"] == 2 and level["requests"] == 6 and level["errors"] == 0
    assert level["tokens"] == 24 and level["tokens_per_s"] > 0
    assert 0 < level["ttft_ms"]["p50"] <= level["latency_ms"]["p95"]
    assert check["verdict"] == "review"  # only the review objective failed

    # The tenant's sample has drifted (every value far above the reference): blocked.
    body["drift_sample"] = {"feature": "prompt_length", "values": [2.5] * 50}
    check = _run(client, _url(version, "verify"), body, django_capture_on_commit_callbacks)
    rows = {row["objective"]: row for row in check["result"]["objectives"]}
    assert rows["prompt-length"]["ok"] is False and rows["prompt-length"]["measured"] > 0.2
    assert check["verdict"] == "block"

    # Without a sample the drift objective is not checked, and never decides the verdict.
    body.pop("drift_sample")
    body["gates"] = {"throughput": "block"}
    check = _run(client, _url(version, "verify"), body, django_capture_on_commit_callbacks)
    rows = {row["objective"]: row for row in check["result"]["objectives"]}
    assert rows["prompt-length"]["ok"] is None and "not checked" in rows["prompt-length"]["detail"]
    assert check["verdict"] == "block"
    assert AuditEvent.objects.filter(tenant=world_a.tenant, action="version.verify_requested")


def test_benchmark_measures_levels_and_drafts_a_contract_the_editor_takes(
    world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    deployment, version = _served(world_a)
    client = world_a.client("operator")
    body = {"concurrencies": [1, 4, 8], "requests": 8, "max_tokens": 4}
    check = _run(client, _url(version, "benchmark"), body, django_capture_on_commit_callbacks)
    assert check["status"] == "done", check["error"]
    levels = check["result"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4, 8]
    assert all(lv["requests"] == 8 and lv["tokens"] == 32 for lv in levels)
    assert all(lv["tokens_per_s"] > 0 and lv["ttft_ms"]["p95"] > 0 for lv in levels)
    for lv in levels:
        print(
            f"benchmark c={lv['concurrency']}: {lv['tokens_per_s']:.0f} tok/s, "
            f"TTFT p95 {lv['ttft_ms']['p95']} ms, latency p95 {lv['latency_ms']['p95']} ms"
        )
    draft = check["draft"]
    assert "concurrency 8:" in draft
    contract = contracts.contract_parse(draft)
    names = {o.name: o for o in contract.objectives}
    worst = max(lv["latency_ms"]["p95"] for lv in levels)
    assert names["p95-latency"].threshold_ms >= worst * 1.5
    assert names["throughput"].min <= levels[0]["tokens_per_s"]
    contracts.contract_set(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment, source=draft
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"concurrency": 9}, "concurrency"),
        ({"requests": 0}, "requests"),
        ({"max_tokens": 33}, "max_tokens"),
        ({"duration_s": 61}, "duration_s"),
        ({"prompts": ["x" * 501]}, "prompts[0]"),
        ({"prompts": ["p"] * 17}, "prompts"),
        ({"gates": {"p95-latency": "explode"}}, "gates.p95-latency"),
        ({"drift_sample": {"feature": "f", "values": ["1"]}}, "drift_sample.values"),
        ({"warmup": 1}, "warmup"),
        ({}, "deployment_id"),
    ],
)
def test_a_bad_verify_request_names_the_field(
    world_a: TenantWorld, body: dict[str, Any], field: str
) -> None:
    deployment, version = _served(world_a)
    _contract(world_a, deployment)
    if field != "deployment_id":
        body = {"deployment_id": deployment.pk, **body}
    response = world_a.client("operator").post(_url(version, "verify"), body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()
    assert not VersionCheck.objects.exists()


def test_checks_are_refused_where_they_cannot_run(world_a: TenantWorld) -> None:
    deployment, version = _served(world_a)
    client = world_a.client("operator")
    body = {"deployment_id": deployment.pk}
    no_contract = client.post(_url(version, "verify"), body, format="json")
    assert (
        no_contract.status_code == 400 and "deployment_id" in no_contract.json()["error"]["fields"]
    )
    _contract(world_a, deployment)
    registered = world_a.version  # registered, never validated
    assert registered.status == VersionStatus.REGISTERED
    response = client.post(_url(registered, "verify"), body, format="json")
    assert response.status_code == 409 and "version" in response.json()["error"]["fields"]
    viewer = world_a.client("viewer").post(_url(version, "verify"), body, format="json")
    assert viewer.status_code == 403
    # At most MAX_ACTIVE_PER_TENANT queued or running at once (none runs here: nothing commits).
    for _ in range(limits.MAX_ACTIVE_PER_TENANT):
        assert client.post(_url(version, "verify"), body, format="json").status_code == 202
    busy = client.post(_url(version, "benchmark"), {}, format="json")
    assert busy.status_code == 403 and busy.json()["error"]["code"] == "quota_exceeded"
    assert VersionCheck.objects.filter(status=CheckStatus.QUEUED).count() == 2


def test_a_drift_sample_must_be_finite(world_a: TenantWorld) -> None:
    deployment, version = _served(world_a)
    _contract(world_a, deployment)
    raw = '{"deployment_id": %d, "drift_sample": {"feature": "f", "values": [1e999]}}'
    response = world_a.client("operator").post(
        _url(version, "verify"), raw % deployment.pk, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert "drift_sample.values" in response.json()["error"]["fields"]


def test_checks_are_rate_limited_per_tenant(
    world_a: TenantWorld, world_b: TenantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "CHECKS_PER_HOUR", 2)
    monkeypatch.setattr(limits, "MAX_ACTIVE_PER_TENANT", 10)
    _, version = _served(world_a)
    client = world_a.client("operator")
    statuses = [
        client.post(_url(version, "benchmark"), {}, format="json").status_code for _ in "abc"
    ]
    assert statuses == [202, 202, 429]
    _, theirs = _served(world_b)  # the neighbour's bucket is its own
    response = world_b.client("operator").post(_url(theirs, "benchmark"), {}, format="json")
    assert response.status_code == 202


def test_another_tenants_version_and_check_are_not_found(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment, version = _served(world_a)
    _contract(world_a, deployment)
    check = world_a.client("operator").post(_url(version, "benchmark"), {}, format="json").json()
    intruder = world_b.client("operator")
    assert intruder.post(_url(version, "benchmark"), {}, format="json").status_code == 404
    _, theirs = _served(world_b)
    forged = f"/api/v1/models/{theirs.model_id}/versions/{version.pk}/benchmark/"
    assert intruder.post(forged, {}, format="json").status_code == 404
    # Their own version against our deployment's contract: the deployment is not theirs.
    body = {"deployment_id": deployment.pk}
    assert intruder.post(_url(theirs, "verify"), body, format="json").status_code == 404
    assert intruder.get(f"/api/v1/version-checks/{check['id']}/").status_code == 404
