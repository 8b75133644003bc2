"""Version comparison of one deployment: the stable and the canary slot's SLIs over one window
of stored rows (the rows the health chart reads, one query for both slots), canary − stable
with a better / worse marker, and the canary analysis of a running rollout (serving.ops.analysis
applied to the same window, beside the rollout's last recorded analysis)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from serving.dataplane.sli import BOUNDS_MS, quantile
from serving.deployments import selectors as deployment_selectors
from serving.deployments.models import Deployment
from serving.ops import contracts
from serving.ops import selectors as ops_selectors
from serving.ops.analysis import analyze
from serving.ops.models import SliSample
from serving.ops.rollouts import ACTIVE
from serving.ops.views.health import RANGES
from serving.slo.counts import HISTOGRAM_SIZE, Counts, pct
from serving.slo.model import Contract
from tenants.models import Tenant
from tenants.pages import tenant_page

GROUPS = ("stable", "canary")
DEFAULT_RANGE = "15m"
# Rollouts record the analysis' minimum when they start (serving.ops.rollouts); the same default.
DEFAULT_MIN_REQUESTS = 20
_SCALARS = ("requests", "errors", "rejected", "tokens_in", "tokens_out")
_HISTOGRAMS = ("latency", "ttft", "itl")


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str  # count, rate, ratio, ms
    lower_is_better: bool | None  # None: neither (traffic, set by the split)


METRICS = (
    Metric("requests", "Requests", "count", None),
    Metric("rate", "Request rate", "rate", None),
    Metric("error_ratio", "Error ratio (errors / served)", "ratio", True),
    Metric("rejected", "Rejected (client errors, 4xx)", "count", None),
    Metric("p50_ms", "Latency p50", "ms", True),
    Metric("p95_ms", "Latency p95", "ms", True),
    Metric("p99_ms", "Latency p99", "ms", True),
    Metric("ttft_p50_ms", "Time to first token p50", "ms", True),
    Metric("ttft_p95_ms", "Time to first token p95", "ms", True),
)


@dataclass
class Arm:
    """One slot's rows in the window, summed."""

    group: str
    version: str
    current: bool  # the version is the current revision's for this slot
    counts: Counts = field(default_factory=Counts)
    rows: int = 0
    other_versions: set[str] = field(default_factory=set)

    def values(self) -> dict[str, float | None]:
        c = self.counts
        served = c.requests - c.rejected
        has_ttft = any(c.ttft)
        return {
            "requests": c.requests,
            "rate": c.requests / c.seconds if c.seconds > 0 else None,
            "error_ratio": c.errors / served if served > 0 else None,
            "rejected": c.rejected,
            "p50_ms": quantile(c.latency, 0.50),
            "p95_ms": quantile(c.latency, 0.95),
            "p99_ms": quantile(c.latency, 0.99),
            "ttft_p50_ms": quantile(c.ttft, 0.50) if has_ttft else None,
            "ttft_p95_ms": quantile(c.ttft, 0.95) if has_ttft else None,
        }


def row_counts(row: SliSample) -> Counts:
    """A stored row's own counts; a row stored without a histogram (an empty list) counts as
    zeros there."""
    data: dict[str, Any] = {name: getattr(row, name) for name in _SCALARS}
    for name in _HISTOGRAMS:
        histogram = getattr(row, name)
        if histogram and len(histogram) == HISTOGRAM_SIZE:
            data[name] = histogram
    data["seconds"] = max(0.0, (row.end - row.start).total_seconds())
    return Counts.from_dict(data)


def arms_of(rows: Iterable[SliSample], versions: dict[str, str | None]) -> dict[str, Arm]:
    """Each slot's arm from the rows of the window. A slot with a current version counts only
    that version's rows (and those stored without a label); rows of another version are named,
    not counted. A canary slot without a current canary counts every row it finds."""
    arms: dict[str, Arm] = {}
    for row in rows:
        _add(arms, versions, row.group, row.version, lambda row=row: row_counts(row), 1)
    return {group: arm for group, arm in arms.items() if arm.rows}


def arms_of_sums(
    sums: Iterable[ops_selectors.WindowSum], versions: dict[str, str | None]
) -> dict[str, Arm]:
    """`arms_of` from the window's rows summed per (group, version) in the database
    (ops_selectors.sli_window_sums): the same arms without reading every row."""
    arms: dict[str, Arm] = {}
    for item in sums:
        _add(arms, versions, item.group, item.version, lambda item=item: item.counts, item.rows)
    return {group: arm for group, arm in arms.items() if arm.rows}


def _add(
    arms: dict[str, Arm],
    versions: dict[str, str | None],
    group: str,
    version: str,
    counts: Callable[[], Counts],
    rows: int,
) -> None:
    if group not in GROUPS:
        return
    current = versions.get(group)
    arm = arms.setdefault(
        group, Arm(group=group, version=current or "", current=current is not None)
    )
    if current is not None and version not in ("", current):
        arm.other_versions.add(version)
        return
    if current is None and version:
        labels = {v for v in arm.version.split(", ") if v} | {version}
        arm.version = ", ".join(sorted(labels))
    arm.counts = arm.counts + counts()
    arm.rows += rows


def _text(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "ms":
        return f"> {BOUNDS_MS[-1]} ms" if math.isinf(value) else f"≤ {value:g} ms"
    if unit == "ratio":
        return pct(value)
    if unit == "rate":
        return f"{value:.3g}/s"
    return f"{int(value):,}"


def _delta_text(delta: float, unit: str) -> str:
    sign = "+" if delta > 0 else ("−" if delta < 0 else "±")
    size = abs(delta)
    if unit == "ms":
        return f"{sign}{size:g} ms"
    if unit == "ratio":
        return f"{sign}{size * 100:.2f} pp"
    if unit == "rate":
        return f"{sign}{size:.3g}/s"
    return f"{sign}{int(size):,}"


def difference(metric: Metric, stable: float | None, canary: float | None) -> dict[str, str] | None:
    """canary − stable, and whether that is better, worse or the same for the canary (None:
    one side has no value)."""
    if stable is None or canary is None:
        return None
    if math.isinf(stable) or math.isinf(canary):  # beyond the last bucket: no size, an order
        text = "beyond the last bucket" if stable == canary else "differs past the last bucket"
        delta = 0.0 if stable == canary else (1.0 if canary > stable else -1.0)
    else:
        delta = canary - stable
        text = _delta_text(delta, metric.unit)
    if metric.lower_is_better is None:
        verdict = ""
    elif delta == 0:
        verdict = "same"
    else:
        verdict = "better" if (delta < 0) == metric.lower_is_better else "worse"
    return {"text": text, "verdict": verdict}


def comparison_table(arms: dict[str, Arm]) -> list[dict[str, Any]]:
    values = {group: arm.values() for group, arm in arms.items()}
    table = []
    for metric in METRICS:
        shown = {group: values[group][metric.key] for group in values}
        if metric.key.startswith("ttft") and all(v is None for v in shown.values()):
            continue  # no time-to-first-token stored for either slot
        table.append(
            {
                "metric": metric,
                "cells": [
                    {"group": g, "text": _text(shown.get(g), metric.unit)}
                    for g in GROUPS
                    if g in arms
                ],
                "difference": difference(metric, shown.get("stable"), shown.get("canary")),
            }
        )
    return table


def analysis_view(
    tenant: Tenant, deployment: Deployment, arms: dict[str, Arm]
) -> dict[str, Any] | None:
    """The running rollout's last recorded analysis, and serving.ops.analysis.analyze over this
    window's counts with the rollout's minimum and the contract in force (None: no rollout)."""
    rollout = (
        ops_selectors.rollout_list(tenant=tenant, deployment=deployment)
        .filter(status__in=ACTIVE)
        .prefetch_related(None)  # one analysis shown, not the rollout's every run
        .first()
    )
    if rollout is None:
        return None
    last = rollout.analyses.order_by("-at").first()
    min_requests = int(rollout.policy.get("min_requests", DEFAULT_MIN_REQUESTS))
    row = contracts.contract_current(tenant=tenant, deployment=deployment)
    contract = Contract.from_dict(row.document) if row is not None else None
    empty = Counts()
    result, summary, measurements = analyze(
        arms["canary"].counts if "canary" in arms else empty,
        arms["stable"].counts if "stable" in arms else empty,
        contract,
        min_requests,
    )
    return {
        "rollout": rollout,
        "last": last,
        "window": {"result": result, "summary": summary, "measurements": measurements},
        "min_requests": min_requests,
        "contract": row,
    }


@require_GET
@tenant_page()
def compare_page(request: HttpRequest, tenant: Tenant, pk: int) -> HttpResponse:
    deployment = deployment_selectors.deployment_get(tenant=tenant, pk=pk)
    range_name = request.GET.get("range", DEFAULT_RANGE)
    context: dict[str, Any] = {"d": deployment, "ranges": list(RANGES), "range": range_name}
    if range_name not in RANGES:
        context["range_error"] = f"range must be one of {', '.join(RANGES)}."
        return render(request, "serving/compare.html", context, status=400)
    seconds, resolution = RANGES[range_name]
    revision = deployment.current_revision
    versions = {
        "stable": str(revision.stable_version) if revision else None,
        "canary": str(revision.canary_version) if revision and revision.canary_version else None,
    }
    # Both arms cover exactly [since, until]: the rows ending there, summed in the database
    # per slot and version (one query for both slots; arms_of over the rows gives the same).
    until = timezone.now()
    since = until - timedelta(seconds=seconds)
    sums = ops_selectors.sli_window_sums(
        tenant=tenant, deployment=deployment, resolution=int(resolution), since=since, until=until
    )
    arms = arms_of_sums(sums, versions)
    context.update(
        {
            "since": since,
            "until": until,
            "resolution": resolution,
            "arms": [arms[g] for g in GROUPS if g in arms],
            "both": len(arms) == len(GROUPS),
            "table": comparison_table(arms),
            "versions": versions,
            "analysis": analysis_view(tenant, deployment, arms),
        }
    )
    return render(request, "serving/compare.html", context)
