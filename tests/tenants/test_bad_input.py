"""Bad input on every write endpoint: 400 that names the field, and nothing written.

The table must cover every API route and method that takes a body; a new write endpoint
without a row here fails `test_every_write_endpoint_is_covered`.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from django.apps import apps
from django.urls import reverse
from rest_framework.test import APIClient

from tenants.models import Membership
from tests.api_routes import api_routes, object_of
from tests.conftest import TenantWorld, make_user

pytestmark = pytest.mark.django_db
TMP = tempfile.gettempdir()

# Routes/methods that take no body (DELETE, action without input) and are not in the table.
BODYLESS = {("token-revoke", "POST")}

# (url name, method, lookup, body, field that must be named)
CASES: list[tuple[str, str, str | None, Any, str]] = [
    ("api-signup", "POST", None, {"email": "nope", "password": "x", "organisation": "O"}, "email"),
    ("api-signup", "POST", None, {"email": "a@b.example", "organisation": "O"}, "password"),
    ("api-signup", "POST", None, {"email": "a@b.example", "password": "Zq8!longpass"}, "organisation"),
    ("api-signup", "POST", None, {"email": "a@b.example", "password": "123", "organisation": "O"}, "password"),
    ("api-invitation-accept", "POST", None, {}, "token"),
    ("api-invitation-accept", "POST", None, {"token": "inv_bogus"}, "token"),
    ("tenant-list", "POST", None, {"name": ""}, "name"),
    ("tenant-list", "POST", None, {"name": "x" * 121}, "name"),
    ("tenant-detail", "PATCH", "slug", {"name": ""}, "name"),
    ("tenant-detail", "PATCH", "slug", {}, "name"),
    ("member-detail", "PATCH", "member", {"role": "god"}, "role"),
    ("member-detail", "PATCH", "member", {}, "role"),
    ("invitation-list", "POST", None, {"email": "not-mail", "role": "viewer"}, "email"),
    ("invitation-list", "POST", None, {"email": "ok@acme.example", "role": "root"}, "role"),
    ("invitation-list", "POST", None, {"role": "viewer"}, "email"),
    ("token-list", "POST", None, {"scopes": ["read"]}, "name"),
    ("token-list", "POST", None, {"name": "t"}, "scopes"),
    ("token-list", "POST", None, {"name": "t", "scopes": []}, "scopes"),
    ("token-list", "POST", None, {"name": "t", "scopes": ["root"]}, "scopes"),
    ("token-list", "POST", None, {"name": "t", "scopes": ["read"], "expires_in_days": 0}, "expires_in_days"),
    ("token-list", "POST", None, {"name": "t", "scopes": ["read"], "expires_in_days": 99999}, "expires_in_days"),
    ("token-list", "POST", None, {"name": "t", "scopes": ["read"], "rate_limit_per_second": 0}, "rate_limit_per_second"),
    ("quota-detail", "PATCH", "quota", {"max_gpus": -1}, "max_gpus"),
    ("quota-detail", "PATCH", "quota", {"requests_per_second": "fast"}, "requests_per_second"),
    ("model-list", "POST", None, {"task": "text-generation"}, "name"),
    ("model-list", "POST", None, {"name": "has spaces"}, "name"),
    ("model-list", "POST", None, {"name": "x" * 101}, "name"),
    ("model-list", "POST", None, {"name": "m2", "task": "painting"}, "task"),
    ("model-list", "POST", None, {"name": "m2", "description": "x" * 2001}, "description"),
    ("model-detail", "PATCH", "model", {}, "description"),
    ("model-detail", "PATCH", "model", {"description": "x" * 2001}, "description"),
    ("model-version-list", "POST", "versions", {"path": TMP}, "label"),
    ("model-version-list", "POST", "versions", {"label": "v2"}, "path"),
    ("model-version-list", "POST", "versions", {"label": "no spaces", "path": TMP}, "label"),
    ("model-version-list", "POST", "versions", {"label": "v2", "path": "relative/dir"}, "path"),
    ("model-version-list", "POST", "versions", {"label": "v2", "path": "/proc/self"}, "path"),
    ("model-version-list", "POST", "versions", {"label": "v2", "path": f"{TMP}/portal-no-such-dir-42"}, "path"),
    ("model-version-list", "POST", "versions", {"label": "v2", "path": TMP, "sha256": "abc"}, "sha256"),
    ("model-version-upload", "POST", "versions", {}, "label"),
    ("model-version-upload", "PUT", "versions", {"label": "v2"}, "label"),
    ("model-version-golden", "PUT", "served-version", {"prompts": ["x" * 201]}, "prompts"),
    ("model-version-golden", "PUT", "served-version", {"prompts": ["a"] * 5}, "prompts"),
    ("model-version-checks-verify", "POST", "served-version", {"concurrency": 99}, "concurrency"),
    ("model-version-checks-benchmark", "POST", "served-version", {"requests": 0}, "requests"),
    ("deployment-list", "POST", None, {"version": 1}, "name"),
    ("deployment-list", "POST", None, {"name": "Bad_Name", "version": "served"}, "name"),
    ("deployment-list", "POST", None, {"name": "web"}, "version"),
    ("deployment-list", "POST", None, {"name": "web", "version": 999999}, "version"),
    ("deployment-list", "POST", None, {"name": "web", "version": "served", "num_cpus": -1}, "num_cpus"),
    ("deployment-list", "POST", None, {"name": "web", "version": "served", "breaker": {"failure_rate": 7}}, "breaker.failure_rate"),
    ("deployment-list", "POST", None, {"name": "web", "version": "served", "guard": {"nope": 1}}, "guard.nope"),
    ("deployment-list", "POST", None, {"name": "web", "version": "served", "num_replicas": 2, "autoscaling": {"max_replicas": 3}}, "autoscaling"),
    ("deployment-detail", "PATCH", "deployment", {"num_replicas": 0}, "num_replicas"),
    ("deployment-detail", "PATCH", "deployment", {"pool": "x"}, "pool"),
    ("deployment-canary", "POST", "deployment", {"percent": 10}, "version"),
    ("deployment-canary", "POST", "deployment", {"version": "served", "percent": 101}, "percent"),
    ("deployment-canary", "POST", "deployment", {"version": "served", "percent": 10}, "canary_version"),
    ("deployment-traffic", "POST", "deployment", {}, "percent"),
    ("deployment-keys", "POST", "deployment", {"name": ""}, "name"),
    ("incident-notes", "POST", "object:incidents.Incident", {}, "text"),
    ("incident-notes", "POST", "object:incidents.Incident", {"text": ""}, "text"),
    ("incident-notes", "POST", "object:incidents.Incident", {"text": "x" * 10001}, "text"),
    ("incident-hint-feedback", "POST", "object:incidents.Incident", {"verdict": "right"}, "cause"),
    ("incident-hint-feedback", "POST", "object:incidents.Incident", {"cause": "Aliens", "verdict": "right"}, "cause"),
    ("incident-hint-feedback", "POST", "object:incidents.Incident", {"cause": "KV cache exhausted", "verdict": "maybe"}, "verdict"),
    ("cause-rule-list", "POST", None, {"op": "gte", "threshold": 0.9, "cause": "c"}, "symptom"),
    ("cause-rule-list", "POST", None, {"symptom": "mood", "op": "gte", "threshold": 1, "cause": "c"}, "symptom"),
    ("cause-rule-list", "POST", None, {"symptom": "kv_usage", "op": "approx", "threshold": 1, "cause": "c"}, "op"),
    ("cause-rule-list", "POST", None, {"symptom": "kv_usage", "op": "gte", "cause": "c"}, "threshold"),
    ("cause-rule-list", "POST", None, {"symptom": "kv_usage", "op": "gte", "threshold": 1}, "cause"),
    ("cause-rule-list", "POST", None, {"symptom": "kv_usage", "op": "gte", "threshold": 1, "cause": "c", "weight": 11}, "weight"),
    ("cause-rule-detail", "PATCH", "object:incidents.CauseRule", {"weight": -1}, "weight"),
    ("cause-rule-detail", "PATCH", "object:incidents.CauseRule", {"threshold": None}, "threshold"),
    ("notification-channel-list", "POST", None, {"name": "hook", "url": "https://h.example.net/"}, "kind"),
    ("notification-channel-list", "POST", None, {"kind": "webhook", "url": "https://h.example.net/"}, "name"),
    ("notification-channel-list", "POST", None, {"kind": "webhook", "name": "hook"}, "url"),
    ("notification-channel-list", "POST", None, {"kind": "webhook", "name": "hook", "url": "ftp://h.example.net/"}, "url"),
    ("notification-channel-list", "POST", None, {"kind": "email", "name": "mail"}, "email"),
    ("notification-channel-list", "POST", None, {"kind": "email", "name": "mail", "email": "not-mail"}, "email"),
    ("notification-channel-list", "POST", None, {"kind": "email", "name": "mail", "email": "a@b.example", "min_severity": "sev1"}, "min_severity"),
    ("notification-channel-detail", "PATCH", "object:incidents.NotificationChannel", {"url": ""}, "url"),
    ("notification-channel-detail", "PATCH", "object:incidents.NotificationChannel", {"name": ""}, "name"),
]  # fmt: skip
_BAD_TARGET = "apiVersion: aiops.portal/v1\nkind: SlaContract\nmetadata: {name: c}\nspec:\n  window: 30d\n  objectives:\n    - {name: a, sli: availability, target: -1}\n"
CASES += [
    ("deployment-ops-contract", "PUT", "deployment", {}, "source"),
    ("deployment-ops-contract", "PUT", "deployment", {"source": "spec: [unclosed"}, "document"),
    ("deployment-ops-contract", "PUT", "deployment", {"source": _BAD_TARGET}, "spec.objectives[0].target"),
    ("deployment-ops-openslo", "POST", "deployment", {}, "source"),
    ("deployment-ops-rollbacks", "POST", "deployment", {"revision": 0}, "revision"),
    ("deployment-ops-rollbacks", "POST", "deployment", {"revision": 99}, "revision"),
    ("deployment-ops-rollout-policy", "PUT", "deployment", {"steps": []}, "steps"),
    ("deployment-ops-rollout-policy", "PUT", "deployment", {"steps": [{"weight": 101}]}, "steps[0].weight"),
    ("deployment-ops-rollout-policy", "PUT", "deployment", {"steps": [{"weight": 5}], "on_failure": "explode"}, "on_failure"),
    ("deployment-ops-rollouts", "POST", "deployment", {}, "version"),
    ("deployment-ops-features", "POST", "deployment", {"drift": "nope"}, "drift"),
    ("deployment-ops-features", "POST", "deployment", {"freshness": {"f": "soon"}}, "freshness.f"),
]  # fmt: skip
BODYLESS |= {("deployment-promote", "POST"), ("inference-key-revoke", "POST")}
BODYLESS |= {("drill-runs", "POST"), ("drill-run-stop", "POST")}
_DRILL = {"name": "d", "deployment": "assistant", "fault": "latency_spike"}
CASES += [
    ("drill-list", "POST", None, {**_DRILL, "name": ""}, "name"),
    ("drill-list", "POST", None, {**_DRILL, "fault": "meteor"}, "fault"),
    ("drill-list", "POST", None, {**_DRILL, "deployment": 0}, "deployment"),
    ("drill-list", "POST", None, {**_DRILL, "parameters": {"delay_ms": -5}}, "parameters.delay_ms"),
    ("drill-list", "POST", None, {**_DRILL, "parameters": {"bogus": 1}}, "parameters.bogus"),
    ("drill-list", "POST", None, {**_DRILL, "duration_s": 2}, "duration_s"),
    ("drill-list", "POST", None, {**_DRILL, "schedule": "sometimes"}, "schedule"),
    (
        "drill-list",
        "POST",
        None,
        {**_DRILL, "steady_state": {"probes": [{"sli": "x"}]}},
        "steady_state.probes[0].sli",
    ),
    (
        "drill-list",
        "POST",
        None,
        {**_DRILL, "abort_conditions": {"error_rate_above": 3}},
        "abort_conditions.error_rate_above",
    ),
    (
        "drill-list",
        "POST",
        None,
        {**_DRILL, "fault": "token_starvation", "parameters": {"concurrency": 0}},
        "parameters.concurrency",
    ),
    (
        "drill-list",
        "POST",
        None,
        {**_DRILL, "fault": "weight_swap_jitter", "parameters": {"reloads": 50}},
        "parameters.reloads",
    ),
    (
        "drill-list",
        "POST",
        None,
        {**_DRILL, "fault": "kv_pollution_probe", "group": "canary"},
        "group",
    ),
    (
        "drill-list",
        "POST",
        None,
        {**_DRILL, "fault": "control_plane_delay", "parameters": {"delay_ms": 60000}},
        "parameters.delay_ms",
    ),
    ("drill-detail", "PATCH", "object:incidents.ChaosDrill", {"traffic_share": 2}, "traffic_share"),
    ("drill-detail", "PATCH", "object:incidents.ChaosDrill", {"deployment": 1}, "deployment"),
]
BODYLESS |= {(f"rollout-{verb}", "POST") for verb in ("pause", "resume", "confirm", "abort")}
BODYLESS |= {
    ("incident-acknowledge", "POST"),
    ("incident-mitigate", "POST"),
    ("incident-resolve", "POST"),
}


def _resolve(body: Any, world: TenantWorld) -> Any:
    """`"served"` stands for the id of the world's deployed (ready) version, `"assistant"`
    for its deployment's."""
    if isinstance(body, dict) and body.get("deployment") == "assistant":
        deployment = world.tenant.serving_deployment_set.get(name="assistant")
        return {**body, "deployment": deployment.pk}
    if isinstance(body, dict) and body.get("version") == "served":
        from serving.registry.models import ModelVersion

        served = ModelVersion.objects.get(tenant=world.tenant, model__name="served")
        return {**body, "version": served.pk}
    return body


def _row_counts() -> dict[str, int]:
    counts = {}
    for model in apps.get_models():
        if model._meta.app_label in {"tenants", "auth", "serving", "incidents"}:
            counts[model._meta.label] = model.objects.count()
    return counts


def _client_for(name: str, world: TenantWorld) -> APIClient:
    if name == "api-signup":
        return APIClient()
    if name == "quota-detail":
        staff = make_user("sre@platform.example")
        staff.is_staff = True
        staff.save()
        Membership.objects.create(tenant=world.tenant, user=staff, role="owner")
        client = APIClient()
        client.force_login(staff)
        return client
    return world.client("owner")


def test_every_write_endpoint_is_covered() -> None:
    covered = {(name, method) for name, method, *_ in CASES} | BODYLESS
    for route in api_routes():
        for method in route.methods:
            if method in ("POST", "PUT", "PATCH") and route.name not in ("api-schema",):
                assert (route.name, method) in covered, (
                    f"add bad-input cases for {method} {route.pattern}"
                )


@pytest.mark.parametrize(("name", "method", "lookup", "body", "field"), CASES)
def test_bad_input_names_the_field_and_writes_nothing(
    name: str, method: str, lookup: str | None, body: Any, field: str, world_a: TenantWorld
) -> None:
    client = _client_for(name, world_a)
    kwargs: dict[str, Any] = {}
    if lookup == "slug":
        kwargs = {"slug": world_a.tenant.slug}
    elif lookup == "member":
        kwargs = {"pk": Membership.objects.get(tenant=world_a.tenant, user=world_a.viewer).pk}
    elif lookup == "quota":
        kwargs = {"pk": world_a.tenant.tenants_quota_set.get().pk}
    elif lookup == "model":
        kwargs = {"pk": world_a.model.pk}
    elif lookup == "versions":
        kwargs = {"model_pk": world_a.model.pk}
    elif lookup == "served-version":
        served = world_a.tenant.serving_deployment_set.get(name="assistant")
        version = served.current_revision.stable_version
        kwargs = {"model_pk": version.model_id, "pk": version.pk}
    elif lookup == "deployment":
        kwargs = {"pk": world_a.tenant.serving_deployment_set.get(name="assistant").pk}
    elif lookup is not None and lookup.startswith("object:"):  # tests.api_routes.OBJECT_FACTORIES
        kwargs = {"pk": object_of(lookup.removeprefix("object:"), world_a).pk}
    body = _resolve(body, world_a)
    before = _row_counts()
    response = getattr(client, method.lower())(reverse(name, kwargs=kwargs), body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    named = [key for key in error["fields"] if key == field or key.startswith(f"{field}[")]
    assert named, error
    assert field in error["message"]
    assert _row_counts() == before


def test_malformed_json_is_a_clear_400(world_a: TenantWorld) -> None:
    response = world_a.client("owner").generic(
        "POST", reverse("token-list"), "{not json", content_type="application/json"
    )
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]
