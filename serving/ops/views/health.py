"""Pages of the ops loop on one deployment: the SLA contract editor (errors inline, versions,
OpenSLO) and live health (objectives, budgets, burn rates, probe, KV) with an SLI chart; the
rollout and rollback pages are in serving.rollout_views."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from redis.exceptions import RedisError

from portal.exceptions import PortalError
from serving.dataplane.sli import quantile
from serving.deployments import selectors as deployment_selectors
from serving.deployments.models import Deployment
from serving.ops import contracts, health
from serving.ops import forms as ops_forms
from serving.ops import selectors as ops_selectors
from serving.ops.health.kv_integrity import kv_integrity_item
from serving.ops.health.targets import check_interval_s
from serving.ops.models import Resolution
from serving.ops.series import bucket_sums
from serving.ops.views.health_signals import signals_view
from serving.slo.counts import pct
from serving.slo.errors import FieldError
from tenants.models import Scope, Tenant
from tenants.pages import can_deploy, page_actor, tenant_page

# name -> (seconds back, stored resolution); longer ranges are summed into at most MAX_POINTS.
RANGES = {
    "15m": (900, Resolution.RAW),
    "1h": (3600, Resolution.MINUTE),
    "24h": (86400, Resolution.MINUTE),
    "7d": (7 * 86400, Resolution.MINUTE),
}
MAX_POINTS = 720


def require_deploy(request: HttpRequest) -> None:
    if not can_deploy(request):
        raise PermissionDenied("Your role cannot change this deployment.")


# --- Contract --------------------------------------------------------------------------------


def _contract_page(
    request: HttpRequest,
    tenant: Tenant,
    deployment: Deployment,
    *,
    form: ops_forms.ContractForm | None = None,
    errors: list[FieldError] | None = None,
    import_form: ops_forms.OpenSloImportForm | None = None,
    import_errors: list[FieldError] | None = None,
) -> HttpResponse:
    current = contracts.contract_current(tenant=tenant, deployment=deployment)
    if form is None:
        restore = request.GET.get("from", "")
        restored = (
            contracts.contract_list(tenant=tenant, deployment=deployment)
            .filter(version=int(restore))
            .first()
            if restore.isdigit()
            else None
        )
        shown = restored or current
        source = shown.source if shown is not None else None
        form = ops_forms.ContractForm(
            initial={"source": source or ops_forms.STARTER.format(name=deployment.name)}
        )
    # The editor checks as you type against this URL (static/js/contract-editor.js).
    form.fields["source"].widget.attrs.update(
        {
            "data-contract-editor": "",
            "data-check-url": reverse(
                "serving-deployment-contract-check", args=[tenant.slug, deployment.pk]
            ),
        }
    )
    context = {
        "d": deployment,
        "current": current,
        "versions": contracts.contract_list(tenant=tenant, deployment=deployment).select_related(
            "created_by"
        )[:50],
        "form": form,
        "errors": errors or [],
        "lines": ops_forms.numbered(form["source"].value() or "", errors or []) if errors else None,
        "import_form": import_form or ops_forms.OpenSloImportForm(),
        "import_errors": import_errors or [],
        "import_lines": ops_forms.numbered(import_form["text"].value() or "", import_errors)
        if import_form is not None and import_errors
        else None,
        "current_lines": ops_forms.numbered(current.source) if current else None,
        "can_deploy": can_deploy(request),
    }
    return render(request, "serving/ops/contract.html", context)


@require_http_methods(["GET", "POST"])
@tenant_page()
def contract_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    if request.method == "GET":
        return _contract_page(request, tenant, deployment)
    require_deploy(request)
    form = ops_forms.ContractForm(request.POST)
    if not form.is_valid():
        return _contract_page(request, tenant, deployment, form=form)
    before = contracts.contract_current(tenant=tenant, deployment=deployment)
    try:
        row = contracts.contract_set(
            tenant=tenant,
            actor=page_actor(request),
            deployment=deployment,
            source=form.cleaned_data["source"],
        )
    except contracts.ContractInvalid as exc:
        return _contract_page(request, tenant, deployment, form=form, errors=exc.errors)
    except PortalError as exc:
        form.add_error("source", exc.message)
        return _contract_page(request, tenant, deployment, form=form)
    if before is not None and row.pk == before.pk:
        messages.info(request, "No change: the contract in force is the same.")
    else:
        messages.success(request, f"Saved {row}: in force from the next health check.")
    return redirect("serving-deployment-contract", slug=tenant.slug, pk=deployment.pk)


@require_POST
@tenant_page(Scope.DEPLOY)
def contract_check(request: HttpRequest, tenant: Tenant, pk: int) -> JsonResponse:
    """The editor's check as you type: every problem of the source (line, field path,
    message), nothing saved. The same parser and limits as saving (64 KiB, node budget)."""
    deployment_selectors.deployment_get(tenant=tenant, pk=pk)  # a foreign one is a 404
    form = ops_forms.ContractForm(request.POST)

    def refused(errors: list[dict[str, Any]]) -> JsonResponse:
        return JsonResponse({"ok": False, "errors": errors})

    if not form.is_valid():
        message = " ".join(str(e) for e in form.errors.get("source", [])) or "send the source."
        return refused([{"line": None, "field": "source", "message": message}])
    try:
        contracts.contract_parse(form.cleaned_data["source"])
    except contracts.ContractInvalid as exc:
        return refused(
            [{"line": e.line, "field": e.field, "message": e.message} for e in exc.errors]
        )
    except PortalError as exc:
        return refused([{"line": None, "field": exc.field or "", "message": exc.message}])
    return JsonResponse({"ok": True, "errors": []})


@require_GET
@tenant_page()
def contract_version_page(
    request: HttpRequest, tenant: Tenant, pk: int, version: int
) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    row = contracts.contract_list(tenant=tenant, deployment=deployment).filter(version=version)
    contract = row.select_related("created_by").first()
    if contract is None:
        raise Http404("No such contract version.")
    current = contracts.contract_current(tenant=tenant, deployment=deployment)
    context = {
        "d": deployment,
        "contract": contract,
        "is_current": current is not None and current.pk == contract.pk,
        "lines": ops_forms.numbered(contract.source),
        "can_deploy": can_deploy(request),
    }
    return render(request, "serving/ops/contract_version.html", context)


@require_POST
@tenant_page(Scope.DEPLOY)
def contract_import(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    form = ops_forms.OpenSloImportForm(request.POST, request.FILES)
    if not form.is_valid():
        return _contract_page(request, tenant, deployment, import_form=form)
    try:
        row, warnings = contracts.contract_import_openslo(
            tenant=tenant,
            actor=page_actor(request),
            deployment=deployment,
            text=form.cleaned_data["text"],
        )
    except contracts.ContractInvalid as exc:
        return _contract_page(
            request, tenant, deployment, import_form=form, import_errors=exc.errors
        )
    except PortalError as exc:
        form.add_error("text", exc.message)
        return _contract_page(request, tenant, deployment, import_form=form)
    messages.success(request, f"Imported OpenSLO as {row}.")
    for warning in warnings:
        messages.warning(request, f"Not imported: {warning}")
    return redirect("serving-deployment-contract", slug=tenant.slug, pk=deployment.pk)


# --- Health ----------------------------------------------------------------------------------


def _number(value: Any, ratio: bool) -> str:
    if value is None:
        return "–"
    return pct(float(value)) if ratio else f"{float(value):.4g}"


def _objective_view(objective: dict[str, Any], windows: list[str]) -> dict[str, Any]:
    ok, ratio = objective.get("ok"), objective.get("kind") == "ratio"
    budget, bar = objective.get("budget"), None
    if ratio and budget and budget.get("total"):
        remaining = float(budget["remaining"])
        width = round(min(1.0, max(0.0, remaining)) * 100, 1)
        bar = {"remaining": remaining, "width": width, "text": pct(remaining)}
    burns = objective.get("burn_rates") or {}
    return {
        **objective,
        "state": "nodata" if ok is None else ("ok" if ok else "breach"),
        "target_text": _number(objective.get("target") if ratio else objective.get("limit"), ratio),
        "value_text": _number(objective.get("value"), ratio),
        "bar": bar,
        "burns": [
            {"window": w, "value": burns.get(w), "hot": (burns.get(w) or 0) >= 1} for w in windows
        ],
    }


def health_view(deployment: Deployment) -> dict[str, Any]:
    """What the last health tick found for the deployment, shaped for the template."""
    try:
        raw = health.deployment_health(deployment.pk)
    except RedisError:
        return {"unavailable": True, "slots": []}
    slots = []
    for group in ("stable", "canary"):
        evaluation = (raw.get("slots") or {}).get(group)
        kv = (raw.get("kv") or {}).get(group)
        if evaluation is None and kv is None:
            continue
        objectives = (evaluation or {}).get("objectives", [])
        windows = list(dict.fromkeys(w for o in objectives for w in o.get("burn_rates") or {}))
        if kv and kv.get("blocks_total"):
            kv = {**kv, "usage": f"{kv['blocks_used'] / kv['blocks_total']:.0%}"}
        slots.append(
            {
                "group": group,
                "windows": windows,
                "objectives": [_objective_view(o, windows) for o in objectives],
                "firing": (evaluation or {}).get("firing", []),
                "worst_action": (evaluation or {}).get("worst_action"),
                "kv": kv,
                "signals": signals_view((raw.get("signals") or {}).get(group)),
            }
        )
    checked = raw.get("checked_at")
    age = time.time() - float(checked) if checked else None
    return {
        "checked_at": datetime.fromtimestamp(float(checked), tz=UTC) if checked else None,
        "age_s": age,
        "stale": age is not None and age > 3 * deployment.health_interval_s + 5,
        "probe": raw.get("probe"),
        "probe_failures": raw.get("probe_failures", 0),
        "contract_version": raw.get("contract_version"),
        "revision": raw.get("revision"),
        "slots": slots,
        "kv_integrity": kv_integrity_item(deployment),  # live from the replicas
    }


@require_GET
@tenant_page()
def health_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    context = {
        "d": deployment,
        "h": health_view(deployment),
        "interval_s": check_interval_s(deployment, deployment.current_revision),
        "contract": contracts.contract_current(tenant=tenant, deployment=deployment),
        "ranges": ["15m", *[r for r in RANGES if r != "15m"]],
    }
    return render(request, "serving/ops/health.html", context)


@require_GET
@tenant_page()
def health_live(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """The live health panel; htmx polls it every 2 s."""
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    context = {"d": deployment, "h": health_view(deployment)}
    return render(request, "serving/ops/_health_live.html", context)


def sli_series(tenant: Tenant, deployment: Deployment, range_name: str) -> dict[str, Any]:
    """Requests/s, error ratio and p95 latency per slot, on one time axis (uPlot's shape),
    summed into buckets so a range never has more than MAX_POINTS points."""
    seconds, resolution = RANGES[range_name]
    bucket = max(int(resolution), math.ceil(seconds / MAX_POINTS))
    rows = ops_selectors.sli_window(
        tenant=tenant, deployment=deployment, resolution=resolution, seconds=seconds
    )
    found = bucket_sums(
        tenant_id=tenant.pk,
        deployment_id=deployment.pk,
        resolution=int(resolution),
        since=timezone.now() - timedelta(seconds=seconds),
        bucket=bucket,
    )
    sums: dict[str, dict[int, list[Any]]] = found if found is not None else {}
    values = ("group", "start", "end", "requests", "errors", "rejected", "latency")
    for group, start, end, requests, errors, rejected, latency in (
        rows.values_list(*values).iterator() if found is None else ()
    ):
        key = int(end.timestamp()) // bucket * bucket
        acc = sums.setdefault(group, {}).setdefault(key, [0.0, 0, 0, 0, []])
        acc[0] += (end - start).total_seconds()
        acc[1], acc[2], acc[3] = acc[1] + requests, acc[2] + errors, acc[3] + rejected
        if latency and len(latency) == len(acc[4]):
            acc[4] = [a + b for a, b in zip(acc[4], latency, strict=True)]
        elif latency and not acc[4]:
            acc[4] = list(latency)
    x = sorted({key for by_key in sums.values() for key in by_key})
    series: dict[str, dict[str, list[float | None]]] = {}
    for group in ("stable", "canary"):
        if group not in sums:
            continue
        out: dict[str, list[float | None]] = {"rps": [], "error_ratio": [], "p95_ms": []}
        for key in x:
            cell = sums[group].get(key)
            served = cell[1] - cell[3] if cell else 0
            p95 = quantile(cell[4], 0.95) if cell and cell[4] else None
            out["rps"].append(round(cell[1] / cell[0], 3) if cell and cell[0] > 0 else None)
            out["error_ratio"].append(round(cell[2] / served, 5) if cell and served > 0 else None)
            out["p95_ms"].append(p95 if p95 is not None and math.isfinite(p95) else None)
        series[group] = out
    return {"range": range_name, "bucket_s": bucket, "x": x, "series": series}


@require_GET
@tenant_page()
def health_series(request: HttpRequest, tenant: Tenant, pk: int) -> JsonResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    range_name = request.GET.get("range", "15m")
    if range_name not in RANGES:
        return JsonResponse({"error": f"range must be one of {', '.join(RANGES)}"}, status=400)
    return JsonResponse(sli_series(tenant, deployment, range_name))
