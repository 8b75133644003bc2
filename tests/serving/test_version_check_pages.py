"""The version page (golden prompts and their recorded answers, the form for the tenant's own,
the Checks panel with "Verify against contract" and "Benchmark") and the check page (verdict per
objective, the benchmark table, the drafted contract with copy and a contract-editor link), live
over htmx while the check runs. Roles, other tenants, field-named errors, a fixed query count."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from serving.deployments.models import Deployment
from serving.ops import contracts
from serving.ops.checks.models import CheckKind, CheckStatus, VersionCheck
from serving.ops.checks.services import version_check_run
from serving.registry.models import ModelVersion
from tenants.actors import Actor
from tenants.models import AuditEvent
from tests.conftest import TenantWorld
from tests.serving.test_version_checks import CONTRACT, _served

pytestmark = pytest.mark.django_db

PAGE_QUERIES = 12  # the version page, whatever the number of checks (measured: 12)
CHECK_QUERIES = 10  # the check page and its live fragment (measured: 10)


def _url(name: str, version: ModelVersion, **extra: Any) -> str:
    kwargs = {"slug": version.tenant.slug, "pk": version.model_id, "version_pk": version.pk}
    return reverse(name, kwargs={**kwargs, **extra})


def _check_url(check: VersionCheck, live: bool = False) -> str:
    name = "serving-version-check-live" if live else "serving-version-check"
    return reverse(name, kwargs={"slug": check.tenant.slug, "check_pk": check.pk})


def _contract(world: TenantWorld, deployment: Deployment) -> None:
    contracts.contract_set(
        tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment, source=CONTRACT
    )


def _verified(world: TenantWorld, version: ModelVersion, deployment: Deployment) -> VersionCheck:
    """A finished verification as the worker leaves it (the page only shows it)."""
    rows = [
        {
            "objective": "p95-latency",
            "sli": "latency_p95",
            "action": "block",
            "ok": True,
            "measured": 1.0,
            "limit": 0.95,
            "detail": "100.0% of 4 under 10000 ms",
        },
        {
            "objective": "throughput",
            "sli": "tokens_per_s",
            "action": "review",
            "ok": False,
            "measured": 812.5,
            "limit": 1000000,
            "detail": "812.5 tokens/s at concurrency 2",
        },
        {
            "objective": "prompt-length",
            "sli": "drift_psi",
            "action": "block",
            "ok": None,
            "detail": "not checked: no reference sample for feature 'prompt_length'",
        },
    ]
    return VersionCheck.objects.create(
        tenant=world.tenant,
        version=version,
        deployment=deployment,
        kind=CheckKind.VERIFY,
        status=CheckStatus.DONE,
        params={"concurrency": 2, "requests": 4, "max_tokens": 4, "duration_s": 30},
        result={"objectives": rows, "levels": []},
        verdict="review",
        created_by=world.operator,
        finished_at=timezone.now(),
    )


def test_the_version_page_shows_golden_answers_and_checks_within_a_fixed_query_count(
    client: Any, world_a: TenantWorld
) -> None:
    deployment, version = _served(world_a)
    _contract(world_a, deployment)
    client.force_login(world_a.operator)
    model_page = client.get(reverse("serving-model", args=[world_a.tenant.slug, version.model_id]))
    assert f'href="{_url("serving-version", version)}"'.encode() in model_page.content

    def count() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as queries:
            page = client.get(_url("serving-version", version))
        assert page.status_code == 200
        return len(queries), page.content.decode()

    _verified(world_a, version, deployment)
    few, html = count()
    # Golden prompts recorded at validation: the defaults and their greedy answers.
    assert (
        html.count('data-testid="golden-row" data-source="default"')
        == len(version.golden["prompts"])
        == 4
    )
    assert version.golden["prompts"][0]["answer"] in html or "<code></code>" in html
    assert 'data-testid="golden-form"' in html
    assert 'data-testid="verify-form"' in html and 'data-testid="benchmark-form"' in html
    assert f'<option value="{deployment.pk}">assistant</option>' in html
    assert 'data-objective="throughput"' in html and 'data-verdict="review"' in html
    assert 'hx-trigger="every 2s"' not in html  # nothing running: no polling

    for _ in range(14):
        _verified(world_a, version, deployment)
    many, html = count()
    assert many == few <= PAGE_QUERIES, (few, many)
    rows = html.split('data-testid="check-row" data-check="')[1:]
    ids = [int(r.split('"')[0]) for r in rows]
    newest = list(
        VersionCheck.objects.filter(version=version).order_by("-id").values_list("pk", flat=True)
    )
    assert ids == newest[:10]  # newest first, bounded
    print(f"version page: {few} queries with 1 check, {many} with 15")


def test_a_viewer_sees_the_panels_but_cannot_act(client: Any, world_a: TenantWorld) -> None:
    deployment, version = _served(world_a)
    _contract(world_a, deployment)
    check = _verified(world_a, version, deployment)
    client.force_login(world_a.viewer)
    page = client.get(_url("serving-version", version)).content.decode()
    assert 'data-testid="golden-table"' in page and 'data-testid="checks-table"' in page
    for form in ("golden-form", "verify-form", "benchmark-form"):
        assert f'data-testid="{form}"' not in page
    assert client.get(_check_url(check)).status_code == 200
    posts = {
        "serving-version-golden": {"prompts": "Hello"},
        "serving-version-verify": {"deployment_id": deployment.pk},
        "serving-version-benchmark": {"concurrencies": "1"},
    }
    audits = AuditEvent.objects.count()
    for name, data in posts.items():
        assert client.post(_url(name, version), data).status_code == 403
    assert VersionCheck.objects.count() == 1 and AuditEvent.objects.count() == audits


def test_another_tenants_version_and_check_are_404(
    client: Any, world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment, version = _served(world_a)
    check = _verified(world_a, version, deployment)
    client.force_login(world_b.owner)
    # Through Globex's own slug: the ids are Acme's.
    foreign = {"slug": world_b.tenant.slug, "pk": version.model_id, "version_pk": version.pk}
    for name in ("serving-version", "serving-version-checks"):
        assert client.get(reverse(name, kwargs=foreign)).status_code == 404
    for name in ("serving-version-golden", "serving-version-verify", "serving-version-benchmark"):
        assert client.post(reverse(name, kwargs=foreign), {"prompts": "x"}).status_code == 404
    for name in ("serving-version-check", "serving-version-check-live"):
        url = reverse(name, kwargs={"slug": world_b.tenant.slug, "check_pk": check.pk})
        assert client.get(url).status_code == 404
    # Through Acme's slug: not a member.
    assert client.get(_url("serving-version", version)).status_code == 404
    assert client.get(_check_url(check)).status_code == 404
    # Globex's own model with Acme's version id under it.
    own_model = {**foreign, "pk": world_b.model.pk}
    assert client.get(reverse("serving-version", kwargs=own_model)).status_code == 404
    assert VersionCheck.objects.count() == 1


@pytest.mark.parametrize(
    ("name", "data", "form", "field", "message"),
    [
        (
            "serving-version-golden",
            {"prompts": "a\nb\nc\nd\ne"},
            "golden_form",
            "prompts",
            "At most 4 prompts",
        ),
        (
            "serving-version-golden",
            {"prompts": "fine\n" + "x" * 201},
            "golden_form",
            "prompts",
            "Line 2: At most 200 characters.",
        ),
        (
            "serving-version-golden",
            {"prompts": "same\nsame"},
            "golden_form",
            "prompts",
            "must differ",
        ),
        (
            "serving-version-benchmark",
            {"concurrencies": "1, 9"},
            "benchmark_form",
            "concurrencies",
            "from 1 to 8",
        ),
        (
            "serving-version-benchmark",
            {"concurrencies": "one"},
            "benchmark_form",
            "concurrencies",
            "whole numbers",
        ),
        (
            "serving-version-benchmark",
            {"concurrencies": "1", "requests": "65"},
            "benchmark_form",
            "requests",
            "from 1 to 64",
        ),
        (
            "serving-version-benchmark",
            {"concurrencies": "1", "max_tokens": "x"},
            "benchmark_form",
            "max_tokens",
            "whole number",
        ),
        (
            "serving-version-verify",
            {"concurrency": "2"},
            "verify_form",
            "deployment_id",
            "required",
        ),
        (
            "serving-version-verify",
            {"deployment_id": "D", "concurrency": "9"},
            "verify_form",
            "concurrency",
            "from 1 to 8",
        ),
        (
            "serving-version-verify",
            {"deployment_id": "D", "duration_s": "61"},
            "verify_form",
            "duration_s",
            "from 1 to 60",
        ),
        (
            "serving-version-verify",
            {"deployment_id": "D", "gates": "p95-latency: explode"},
            "verify_form",
            "gates",
            "p95-latency: Give block or review.",
        ),
        (
            "serving-version-verify",
            {"deployment_id": "D", "gates": "no colon"},
            "verify_form",
            "gates",
            "Line 1",
        ),
    ],
)
def test_bad_input_is_refused_on_the_field_it_concerns(
    client: Any,
    world_a: TenantWorld,
    name: str,
    data: dict[str, str],
    form: str,
    field: str,
    message: str,
) -> None:
    deployment, version = _served(world_a)
    _contract(world_a, deployment)
    data = {k: str(deployment.pk) if v == "D" else v for k, v in data.items()}
    client.force_login(world_a.operator)
    page = client.post(_url(name, version), data)
    assert page.status_code == 400
    errors = page.context[form].errors
    assert field in errors and message in " ".join(errors[field]), errors
    assert message.replace("'", "&#x27;") in page.content.decode()
    assert not VersionCheck.objects.exists()


def test_a_benchmark_from_the_page_is_live_until_it_ends_then_shows_table_and_draft(
    client: Any,
    world_a: TenantWorld,
    django_capture_on_commit_callbacks: Any,
    django_assert_max_num_queries: Any,
) -> None:
    deployment, version = _served(world_a)
    client.force_login(world_a.operator)
    data = {"concurrencies": "2, 1", "requests": "4", "max_tokens": "4", "duration_s": ""}
    with django_capture_on_commit_callbacks(execute=False):  # queued, the worker not yet run
        response = client.post(_url("serving-version-benchmark", version), data)
    check = VersionCheck.objects.get(version=version)
    assert response.status_code == 302 and response["Location"] == _check_url(check)
    assert check.params["concurrencies"] == [1, 2] and check.params["duration_s"] == 30

    queued = client.get(_check_url(check)).content.decode()
    live_url = _check_url(check, live=True)
    assert f'hx-get="{live_url}" hx-trigger="every 2s"' in queued  # polls while queued
    panel = client.get(_url("serving-version-checks", version)).content.decode()
    assert panel.startswith('<section id="version-checks"') and 'hx-trigger="every 2s"' in panel

    version_check_run(check_id=check.pk)  # what the worker runs
    fragment = client.get(live_url).content.decode()
    assert fragment.startswith('<div id="check-live"') and 'data-status="done"' in fragment
    assert "hx-trigger" not in fragment  # finished: the polling stops
    with django_assert_max_num_queries(CHECK_QUERIES):
        page = client.get(_check_url(check)).content.decode()
    with django_assert_max_num_queries(CHECK_QUERIES):
        client.get(live_url)
    check.refresh_from_db()
    assert page.count('data-testid="level-row"') == 2
    for level in check.result["levels"]:
        assert f'data-concurrency="{level["concurrency"]}"' in page
        assert f"{level['tokens_per_s']:.1f}" in page
    assert (
        'data-testid="draft-yaml"' in page and "p95-ttft" in page and "navigator.clipboard" in page
    )
    editor = reverse("serving-deployment-contract", args=[world_a.tenant.slug, deployment.pk])
    assert f'href="{editor}" data-testid="contract-editor-link"' in page
    # The draft on the page is the one the contract editor accepts.
    contracts.contract_parse(check.draft)
    panel = client.get(_url("serving-version-checks", version)).content.decode()
    assert "hx-trigger" not in panel and "2 levels · contract drafted" in panel


def test_verify_from_the_page_shows_each_objective_with_its_gate_action(
    client: Any, world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    deployment, version = _served(world_a)
    _contract(world_a, deployment)
    client.force_login(world_a.operator)
    data = {
        "deployment_id": deployment.pk,
        "concurrency": "2",
        "requests": "4",
        "max_tokens": "4",
        "gates": "throughput: block\np95-latency: review",
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(_url("serving-version-verify", version), data)
    assert response.status_code == 302
    check = VersionCheck.objects.get(version=version)
    assert check.status == CheckStatus.DONE, check.error
    assert check.verdict == "block"  # a million tokens/s is never met; its action is block
    page = client.get(_check_url(check)).content.decode()
    assert 'data-verdict="block"' in page
    assert 'data-objective="throughput" data-action="block"' in page
    assert 'data-objective="p95-latency" data-action="review"' in page
    assert 'data-objective="prompt-length" data-action="review"' in page  # the contract's default
    assert 'data-ok="false"' in page and 'data-ok="true"' in page and 'data-ok="none"' in page
    assert "1000000" in page  # the threshold beside the measured value
    assert AuditEvent.objects.filter(tenant=world_a.tenant, action="version.verify_requested")


def test_golden_prompts_of_the_tenant_are_recorded_and_shown(
    client: Any, world_a: TenantWorld, django_capture_on_commit_callbacks: Any
) -> None:
    _, version = _served(world_a)
    client.force_login(world_a.operator)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            _url("serving-version-golden", version), {"prompts": "GPUs are\n\n  Tell me  \n"}
        )
    assert response.status_code == 302 and response["Location"] == _url("serving-version", version)
    version.refresh_from_db()
    assert version.golden["tenant_prompts"] == ["GPUs are", "Tell me"]
    page = client.get(_url("serving-version", version)).content.decode()
    assert page.count('data-testid="golden-row" data-source="tenant"') == 2
    assert page.count('data-testid="golden-row" data-source="default"') == 4
    assert (
        'id="id_prompts">\nGPUs are\nTell me</textarea>' in page
    )  # the form starts from the tenant's own
    assert AuditEvent.objects.filter(tenant=world_a.tenant, action="version.golden_requested")


def test_a_version_not_ready_offers_no_checks(client: Any, world_a: TenantWorld) -> None:
    client.force_login(world_a.operator)
    version = world_a.version  # registered only
    page = client.get(_url("serving-version", version)).content.decode()
    assert 'data-testid="checks-not-ready"' in page and 'data-testid="golden-none"' in page
    assert 'data-testid="benchmark-form"' not in page
    refused = client.post(_url("serving-version-benchmark", version), {"concurrencies": "1"})
    assert refused.status_code == 400 and "only a ready version" in refused.content.decode()
    assert not VersionCheck.objects.exists()
