"""Pages of one model version before a canary: its golden prompts and recorded answers (with
the form for the tenant's own prompts), its checks (verify against a contract, benchmark) and
one check's result, live while it runs. They live in `ops`, above the registry, because a
check reads a deployment's contract; the URLs keep the registry's shape."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import messages
from django.db.models import Exists, OuterRef, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.exceptions import PortalError
from serving.deployments import selectors as deployment_selectors
from serving.ops.checks import selectors, services
from serving.ops.checks.forms import BenchmarkForm, GoldenPromptsForm, VerifyForm, put_error
from serving.ops.checks.models import ACTIVE_STATUSES, CheckKind, VersionCheck
from serving.ops.models import SlaContract
from serving.registry import selectors as registry
from serving.registry.models import ModelVersion, VersionStatus
from serving.registry.services.golden import version_golden_request, version_golden_throttle
from tenants.models import Scope, Tenant
from tenants.pages import can_write, page_actor, tenant_page
from tenants.scoping import get_for_tenant

CHECKS_SHOWN = 10  # the version page lists the newest checks only
MODEL_DEPLOYMENTS_SHOWN = 5  # contract-editor links on a check page
CONTRACT_DEPLOYMENTS_SHOWN = 50  # choices of "verify against the contract of"


def _version(tenant: Tenant, pk: int, version_pk: int) -> ModelVersion:
    model = registry.model_get(tenant=tenant, pk=pk)
    return registry.version_get(tenant=tenant, pk=version_pk, model=model)


def _contract_deployments(tenant: Tenant) -> list[tuple[int, str]]:
    """The tenant's deployments that have a contract (a verification needs one)."""
    has_contract = Exists(SlaContract.objects.filter(tenant=tenant, deployment=OuterRef("pk")))
    rows = (
        deployment_selectors.deployment_list(tenant=tenant)
        .filter(has_contract)
        .order_by("name")
        .values_list("pk", "name")[:CONTRACT_DEPLOYMENTS_SHOWN]
    )
    return list(rows)


def _checks(tenant: Tenant, version: ModelVersion) -> list[VersionCheck]:
    return list(
        selectors.version_check_list(tenant=tenant)
        .filter(version=version)
        .select_related("deployment", "created_by")
        .order_by("-id")[:CHECKS_SHOWN]
    )


def _checks_context(request: HttpRequest, version: ModelVersion, checks: list[VersionCheck]) -> Any:
    return {
        "v": version,
        "checks": checks,
        "checks_live": any(c.status in ACTIVE_STATUSES for c in checks),
        "can_write": can_write(request),
    }


def _version_page(
    request: HttpRequest,
    tenant: Tenant,
    version: ModelVersion,
    *,
    golden_form: GoldenPromptsForm | None = None,
    verify_form: VerifyForm | None = None,
    benchmark_form: BenchmarkForm | None = None,
    status: int = 200,
) -> HttpResponse:
    document = version.golden or {}
    recorded = document.get("recorded_at")
    own = document.get("tenant_prompts", [])
    context = {
        **_checks_context(request, version, _checks(tenant, version)),
        "model": version.model,
        "golden_rows": document.get("prompts", []),
        "golden_at": datetime.fromtimestamp(recorded, tz=UTC) if recorded else None,
        "golden_max_tokens": document.get("max_tokens"),
        "golden_form": golden_form or GoldenPromptsForm(initial={"prompts": "\n".join(own)}),
        "ready": version.status == VersionStatus.READY,
    }
    if context["can_write"]:
        context["verify_form"] = verify_form or VerifyForm(
            deployments=_contract_deployments(tenant)
        )
        context["benchmark_form"] = benchmark_form or BenchmarkForm()
    return render(request, "serving/registry/version.html", context, status=status)


@require_GET
@tenant_page()
def version_page(request: HttpRequest, tenant: Tenant, pk: int, version_pk: int) -> HttpResponse:
    return _version_page(request, tenant, _version(tenant, pk, version_pk))


@require_POST
@tenant_page(Scope.WRITE)
def version_golden(request: HttpRequest, tenant: Tenant, pk: int, version_pk: int) -> HttpResponse:
    version = _version(tenant, pk, version_pk)
    form = GoldenPromptsForm(request.POST)
    if not form.is_valid():
        return _version_page(request, tenant, version, golden_form=form, status=400)
    if (wait := version_golden_throttle(tenant=tenant)) > 0:
        form.add_error(None, f"Too many golden-prompt changes; try again in {wait:.0f} s.")
        return _version_page(request, tenant, version, golden_form=form, status=429)
    try:
        version_golden_request(
            tenant=tenant,
            actor=page_actor(request),
            version=version,
            prompts=form.cleaned_data["prompts"],
        )
    except PortalError as exc:
        put_error(form, exc)
        return _version_page(request, tenant, version, golden_form=form, status=400)
    messages.success(request, "Recording the version's answers to the golden prompts.")
    return redirect("serving-version", slug=tenant.slug, pk=pk, version_pk=version.pk)


@require_POST
@tenant_page(Scope.WRITE)
def version_check_start(
    request: HttpRequest, tenant: Tenant, pk: int, version_pk: int, kind: str
) -> HttpResponse:
    """Start a `verify` or `benchmark` of the version (the same service as the API)."""
    version = _version(tenant, pk, version_pk)
    verify_form = benchmark_form = None
    form: VerifyForm | BenchmarkForm
    if kind == CheckKind.VERIFY:
        form = verify_form = VerifyForm(request.POST, deployments=_contract_deployments(tenant))
    elif kind == CheckKind.BENCHMARK:
        form = benchmark_form = BenchmarkForm(request.POST)
    else:
        raise Http404("No such check.")

    def again(status: int) -> HttpResponse:
        return _version_page(
            request,
            tenant,
            version,
            verify_form=verify_form,
            benchmark_form=benchmark_form,
            status=status,
        )

    if not form.is_valid():
        return again(400)
    if (wait := services.version_check_throttle(tenant=tenant)) > 0:
        form.add_error(None, f"Too many checks; try again in {wait:.0f} s.")
        return again(429)
    try:
        check = services.version_check_start(
            tenant=tenant,
            actor=page_actor(request),
            version=version,
            kind=kind,
            params=form.params(),
        )
    except PortalError as exc:
        put_error(form, exc)
        return again(400)
    messages.success(request, f"{check.get_kind_display()} of {version.label} queued.")
    return redirect("serving-version-check", slug=tenant.slug, check_pk=check.pk)


@require_GET
@tenant_page()
def version_checks(request: HttpRequest, tenant: Tenant, pk: int, version_pk: int) -> HttpResponse:
    """The version page's checks panel; htmx polls it while a check is queued or running."""
    version = _version(tenant, pk, version_pk)
    context = _checks_context(request, version, _checks(tenant, version))
    return render(request, "serving/registry/_version_checks.html", context)


def _check_context(request: HttpRequest, tenant: Tenant, check_pk: int) -> dict[str, Any]:
    checks = selectors.version_check_list(tenant=tenant).select_related("deployment", "created_by")
    check = get_for_tenant(checks, tenant=tenant, pk=check_pk)
    model = check.version.model
    result = check.result or {}
    return {
        "check": check,
        "model": model,
        "live": check.status in ACTIVE_STATUSES,
        "levels": result.get("levels", []),
        "objectives": result.get("objectives", []),
        "result": result,
    }


def _model_deployments(tenant: Tenant, check: VersionCheck) -> list[Any]:
    """Deployments serving the check's model (stable or canary), for the contract editor."""
    model_id = check.version.model_id
    serves = Q(current_revision__stable_version__model_id=model_id) | Q(
        current_revision__canary_version__model_id=model_id
    )
    rows = deployment_selectors.deployment_list(tenant=tenant).filter(serves)
    return list(rows.order_by("name")[:MODEL_DEPLOYMENTS_SHOWN])


@require_GET
@tenant_page()
def check_page(request: HttpRequest, tenant: Tenant, check_pk: int) -> HttpResponse:
    context = _check_context(request, tenant, check_pk)
    context["model_deployments"] = _model_deployments(tenant, context["check"])
    return render(request, "serving/registry/check.html", context)


@require_GET
@tenant_page()
def check_live(request: HttpRequest, tenant: Tenant, check_pk: int) -> HttpResponse:
    """The check page's result part; htmx polls it until the check is done or failed."""
    context = _check_context(request, tenant, check_pk)
    context["model_deployments"] = _model_deployments(tenant, context["check"])
    return render(request, "serving/registry/_check_live.html", context)
