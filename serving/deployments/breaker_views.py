"""The guard and circuit-breaker page of one deployment: each router replica's live breaker per
slot (its Redis snapshot, serving.dataplane.breaker; the panel is polled every 5 s), the input
limits and breaker settings in force beside the data plane's defaults and the service's bounds,
and a form that changes them through `deployment_change`, the API's PATCH path (the same
checks, the same audit row, a new revision)."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from portal.exceptions import PortalError
from serving.dataplane.breaker import CLOSED, HALF_OPEN, OPEN
from serving.deployments import selectors as deployment_selectors
from serving.deployments import services as deployments
from serving.deployments.breaker_forms import SECTIONS, GuardBreakerForm, defaults
from serving.deployments.forms import plain
from serving.deployments.models import Deployment
from serving.deployments.recovery import hash_values, published_app, redis_client
from serving.slo.counts import pct
from tenants.models import Tenant
from tenants.pages import can_deploy, form_error, page_actor, tenant_page

# Routers publish every second (serving.dataplane.publisher); a snapshot older than this is a
# stopped replica's, whose field outlives it in the hash until the hash expires.
FRESH_S = 5.0
# Worst first: the state an arm shows when its routers disagree.
SEVERITY = (OPEN, HALF_OPEN, CLOSED)
BADGE = {CLOSED: "ok", HALF_OPEN: "warn", OPEN: "bad"}
LABEL = {CLOSED: "closed", HALF_OPEN: "half open", OPEN: "open"}
GROUP_ORDER = ("stable", "canary")
COUNTERS = ("failures", "trips", "turned_away", "mirrored")


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def _breaker_row(replica: str, age: float, snapshot: dict[str, Any]) -> dict[str, Any]:
    state = str(snapshot.get("state"))
    known = state in BADGE
    rate = _number(snapshot.get("failure_rate"))
    return {
        "replica": replica,
        "age_s": age,
        "stale": age > FRESH_S,
        "state": state if known else "unknown",
        "label": LABEL.get(state, "unknown"),
        "badge": BADGE.get(state, "nodata"),
        "failure_rate": rate,
        "failure_rate_text": "–" if rate is None else pct(rate),
        "window_requests": _number(snapshot.get("window_requests")),
        **{name: _number(snapshot.get(name)) for name in COUNTERS},
    }


def breaker_arms(routers: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """Per slot: each router replica's breaker, the worst state among the fresh ones, and the
    counters summed over them (each replica counts since it started)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for router in routers:
        breakers = router.get("breakers")
        if not isinstance(breakers, dict):
            continue
        age = max(0.0, now - (_number(router.get("at")) or 0.0))
        replica = str(router.get("replica") or "?")
        for group, snapshot in breakers.items():
            if isinstance(snapshot, dict):
                rows.setdefault(str(group), []).append(_breaker_row(replica, age, snapshot))
    arms = []
    ordered = [g for g in GROUP_ORDER if g in rows] + sorted(set(rows) - set(GROUP_ORDER))
    for group in ordered:
        replicas = sorted(rows[group], key=lambda r: r["replica"])
        fresh = [r for r in replicas if not r["stale"]]
        states = {r["state"] for r in fresh}
        worst = next((s for s in SEVERITY if s in states), None)
        arms.append(
            {
                "group": group,
                "state": worst or "unknown",
                "label": LABEL.get(worst or "", "no fresh snapshot"),
                "badge": BADGE.get(worst or "", "nodata"),
                "replicas": replicas,
                "fresh": len(fresh),
                **{name: sum(r[name] or 0 for r in fresh) for name in COUNTERS},
            }
        )
    return arms


def breaker_live(deployment: Deployment) -> dict[str, Any]:
    """The routers' breakers of the deployment as they published them last."""
    import redis

    published = published_app(deployment)
    if published is None:
        return {"published": False, "arms": []}
    _, app = published
    try:
        routers = hash_values(redis_client(), f"{settings.SLI_KEY_PREFIX}:router:{app}")
    except redis.RedisError:
        return {"published": True, "unavailable": True, "arms": []}
    return {"published": True, "arms": breaker_arms(routers, time.time()), "app": app}


def settings_view(deployment: Deployment) -> list[dict[str, Any]]:
    """Each guard and breaker setting: the value set on the current revision (None: the
    default applies), the default, the one in force and the allowed bounds."""
    revision = deployment.current_revision
    sections = []
    for section, (title, config, limits) in SECTIONS.items():
        given = (getattr(revision, section) or {}) if revision else {}
        default = defaults(config)
        rows = [
            {
                "key": key,
                "set": plain(given.get(key)),
                "default": plain(default[key]),
                "in_force": plain(given.get(key, default[key])),
                "low": low,
                "high": high,
            }
            for key, (low, high) in limits.items()
        ]
        sections.append({"name": section, "title": title, "rows": rows})
    return sections


def _page(
    request: HttpRequest, deployment: Deployment, form: GuardBreakerForm | None = None
) -> HttpResponse:
    revision = deployment.current_revision
    writer = can_deploy(request)
    if writer and form is None:
        form = GuardBreakerForm(initial=GuardBreakerForm.initial_from(revision) if revision else {})
    context = {
        "d": deployment,
        "rev": revision,
        "live": breaker_live(deployment),
        "sections": settings_view(deployment),
        "form": form if writer else None,
        "fresh_s": FRESH_S,
    }
    status = 400 if form is not None and form.is_bound and form.errors else 200
    return render(request, "serving/breaker.html", context, status=status)


@require_http_methods(["GET", "POST"])
@tenant_page()
def breaker_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    if request.method == "GET":
        return _page(request, deployment)
    if not can_deploy(request):
        raise PermissionDenied("Your role cannot change this deployment.")
    form = GuardBreakerForm(request.POST)
    if not form.is_valid():
        return _page(request, deployment, form)
    before = deployment.current_revision_id
    changes = form.settings()
    reason = deployments.change_reason(
        deployment=deployment, changes=changes, unchanged="guard and breaker saved"
    )
    try:
        revision = deployments.deployment_change(
            tenant=tenant,
            actor=page_actor(request),
            deployment=deployment,
            changes=changes,
            reason=reason,
        )
    except PortalError as exc:
        form_error(form, exc)
        return _page(request, deployment, form)
    if revision.pk == before:
        messages.info(request, "Nothing changed.")
    else:
        messages.success(request, f"Revision {revision.number}: {revision.reason}.")
    return redirect("serving-deployment-breaker", slug=tenant.slug, pk=deployment.pk)


@require_GET
@tenant_page()
def breaker_live_panel(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    """The live breaker panel; htmx polls it every 5 s."""
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    context = {"d": deployment, "live": breaker_live(deployment), "fresh_s": FRESH_S}
    return render(request, "serving/_breaker_live.html", context)
