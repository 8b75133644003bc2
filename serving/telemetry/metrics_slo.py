"""/metrics: each deployment slot's SLI counters and its SLO state, read at scrape time from
the health tick's Redis state (so every web process exports the same numbers).

The SLI series are the slot's cumulative counts since its episode began (a new version in
the slot, or a canary that came back, starts from zero: a counter reset to Prometheus), with
the data plane's fixed latency buckets; the contract rules of serving.slo.rules read them.
The SLO state is the last tick's evaluation: burn rates per window, the error budget left,
which objectives are met, and what fires. Labels: tenant slug, deployment name, slot
(`stable`/`canary`), and the contract's objective name (a DNS label, at most 20 a contract).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from serving.dataplane.sli import BOUNDS_MS
from serving.deployments.models import Deployment
from serving.ops.health import health_keys, health_redis
from serving.slo.rules import (
    SLI_ERRORS,
    SLI_HISTOGRAMS,
    SLI_LABELS,
    SLI_REJECTED,
    SLI_REQUESTS,
    le_label,
)

BUCKETS = [le_label(bound) for bound in BOUNDS_MS] + ["+Inf"]
# Counts field -> (family, help); a family's `_total` comes from its type.
SLI_COUNTERS = (
    ("requests", SLI_REQUESTS, "Requests the slot's replicas served (health tick counts)."),
    ("errors", SLI_ERRORS, "Requests that failed by the service's fault (5xx, engine errors)."),
    ("rejected", SLI_REJECTED, "Requests refused as the client's fault (4xx): not SLO errors."),
    ("tokens_in", "portal_sli_prompt_tokens_total", "Prompt tokens the slot processed."),
    ("tokens_out", "portal_sli_generation_tokens_total", "Tokens the slot generated."),
)
SLI_HISTOGRAM_HELP = {
    "latency": "Request latency, from the data plane's fixed buckets (no sum is kept).",
    "ttft": "Time to first token, from the data plane's fixed buckets (no sum is kept).",
    "itl": "Inter-token latency, from the data plane's fixed buckets (no sum is kept).",
}
SLOT = [*SLI_LABELS]
OBJECTIVE = [*SLI_LABELS, "slo"]


def _name(family: str) -> str:
    return family.removesuffix("_total")


def _decoded(raw: Mapping[bytes, bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            out[key.decode()] = json.loads(value)
        except ValueError:
            continue
    return out


def read_health(redis_client: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(per-slot state keyed `<deployment id>:<group>`, last evaluation per deployment id)."""
    r = redis_client or health_redis()
    keys = health_keys()
    try:
        with r.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys["state"])
            pipe.hgetall(keys["deployments"])
            states, infos = pipe.execute()
    finally:
        if redis_client is None:
            r.close()
    return _decoded(states), _decoded(infos)


def deployment_names(ids: set[int]) -> dict[int, tuple[str, str]]:
    """Live deployments by id: (tenant slug, deployment name); deleted ones are left out."""
    if not ids:
        return {}
    rows = Deployment.objects.filter(pk__in=ids, deleted_at__isnull=True).values_list(
        "pk", "tenant__slug", "name"
    )
    return {pk: (slug, name) for pk, slug, name in rows}


def _id_of(field: str) -> int | None:
    head = field.partition(":")[0]
    return int(head) if head.isdigit() else None


class SloCollector(Collector):
    """SLI counters and histograms of every live slot, and each one's SLO state."""

    def __init__(self, redis_client: Any = None) -> None:
        self.redis_client = redis_client

    def collect(self) -> Iterator[Metric]:
        states, infos = read_health(self.redis_client)
        ids = {i for i in map(_id_of, [*states, *infos]) if i is not None}
        names = deployment_names(ids)
        yield from sli_families(states, names)
        yield from slo_families(infos, names)
        yield from signal_families(infos, names)


def sli_families(
    states: Mapping[str, Any], names: Mapping[int, tuple[str, str]]
) -> Iterator[Metric]:
    counters = {
        field: CounterMetricFamily(_name(family), help_text, labels=SLOT)
        for field, family, help_text in SLI_COUNTERS
    }
    histograms = {
        kind: HistogramMetricFamily(family, SLI_HISTOGRAM_HELP[kind], labels=SLOT)
        for kind, family in SLI_HISTOGRAMS.items()
    }
    for field_name, state in sorted(states.items()):
        deployment_id, _, group = field_name.partition(":")
        owner = names.get(int(deployment_id)) if deployment_id.isdigit() else None
        cumulative = state.get("cum") if isinstance(state, dict) else None
        if owner is None or not cumulative or state.get("ended"):
            continue
        labels = [*owner, group]
        for field, _, _ in SLI_COUNTERS:
            counters[field].add_metric(labels, float(cumulative.get(field, 0)))
        for kind, family in histograms.items():
            counts = [int(c) for c in cumulative.get(kind) or [0] * len(BUCKETS)]
            running, buckets = 0, []
            for bound, count in zip(BUCKETS, counts, strict=True):
                running += count
                buckets.append((bound, float(running)))
            family.add_metric(labels, buckets, sum_value=None)
    yield from counters.values()
    yield from histograms.values()


def slo_families(
    infos: Mapping[str, Any], names: Mapping[int, tuple[str, str]]
) -> Iterator[Metric]:
    burn = GaugeMetricFamily(
        "portal_slo_burn_rate",
        "Error budget burn rate of a ratio objective over a window (1 spends exactly the "
        "budget over the contract's window), at the last health tick.",
        labels=[*OBJECTIVE, "window"],
    )
    budget = GaugeMetricFamily(
        "portal_slo_error_budget_remaining_ratio",
        "Share of the error budget left over the contract's window (negative once overspent; "
        "1 without traffic), at the last health tick.",
        labels=OBJECTIVE,
    )
    met = GaugeMetricFamily(
        "portal_slo_objective_met",
        "1 when the objective is met, 0 when not, at the last health tick (absent: no data).",
        labels=OBJECTIVE,
    )
    firing = GaugeMetricFamily(
        "portal_slo_alerts_firing",
        "Alerts firing at the last health tick, by objective (or fast rule: kind `fast`), "
        "kind (burn, fast, gauge, budget, probe), severity and the action they call for.",
        labels=[*OBJECTIVE, "kind", "severity", "action"],
    )
    evaluated = GaugeMetricFamily(
        "portal_slo_evaluation_timestamp_seconds",
        "When the health tick last evaluated the deployment (Unix time).",
        labels=["tenant", "deployment"],
    )
    for deployment_id, info in sorted(infos.items()):
        owner = names.get(int(deployment_id)) if deployment_id.isdigit() else None
        if owner is None or not isinstance(info, dict):
            continue
        if info.get("checked_at") is not None:
            evaluated.add_metric([*owner], float(info["checked_at"]))
        for group, evaluation in sorted((info.get("slots") or {}).items()):
            slot = [*owner, group]
            for objective in evaluation.get("objectives") or []:
                labels = [*slot, str(objective["name"])]
                for window, rate in sorted((objective.get("burn_rates") or {}).items()):
                    if rate is not None:
                        burn.add_metric([*labels, window], float(rate))
                if objective.get("budget"):
                    budget.add_metric(labels, float(objective["budget"]["remaining"]))
                if objective.get("ok") is not None:
                    met.add_metric(labels, 1.0 if objective["ok"] else 0.0)
            counted: dict[tuple[str, ...], int] = {}
            for alert in evaluation.get("firing") or []:
                key = tuple(str(alert[k]) for k in ("name", "kind", "severity", "action"))
                counted[key] = counted.get(key, 0) + 1
            for key, n in sorted(counted.items()):
                firing.add_metric([*slot, *key], float(n))
    yield from (burn, budget, met, firing, evaluated)


def signal_families(
    infos: Mapping[str, Any], names: Mapping[int, tuple[str, str]]
) -> Iterator[Metric]:
    """The signal SLIs of every slot at the last health tick (serving.slo.signals): each
    windowed one over the summary window, errors by reason, state divergence and its parts,
    observability coverage and the critical signals a slot misses."""
    value = GaugeMetricFamily(
        "portal_slo_signal",
        "A signal SLI of the slot at the last health tick (latency_p99_jitter and ttft_jitter "
        "ms, throughput_cv, cache_hit_decay %/min, queue_wait_ms ms, saturation, kv_use, "
        "batch_occupancy ratios, breaker_trips, state_divergence, coverage, output_consistency "
        "in [0, 1]); windowed ones over the last `window_s` (5 minutes). Absent: no data.",
        labels=[*SLOT, "signal"],
    )
    reasons = GaugeMetricFamily(
        "portal_slo_errors_by_reason_ratio",
        "Share of the slot's requests that failed with a reason (kv_quota, circuit_open, "
        "upstream, out_of_memory, timeout, other) over the last 5 minutes.",
        labels=[*SLOT, "reason"],
    )
    parts = GaugeMetricFamily(
        "portal_slo_state_divergence_part",
        "The parts of the state divergence score: share of replicas off the desired weights, "
        "spread of KV use, spread of error ratios.",
        labels=[*SLOT, "part"],
    )
    missing = GaugeMetricFamily(
        "portal_slo_coverage_missing",
        "1 for each SLO-critical signal the slot does not collect (coverage below 1).",
        labels=[*SLOT, "signal"],
    )
    for deployment_id, info in sorted(infos.items()):
        owner = names.get(int(deployment_id)) if deployment_id.isdigit() else None
        if owner is None or not isinstance(info, dict):
            continue
        for group, found in sorted((info.get("signals") or {}).items()):
            slot = [*owner, group]
            for name, number in sorted((found.get("values") or {}).items()):
                if isinstance(number, int | float):
                    value.add_metric([*slot, name], float(number))
            by_reason = (found.get("values") or {}).get("errors_by_reason") or {}
            for reason, ratio in sorted(by_reason.items()):
                if ratio is not None:
                    reasons.add_metric([*slot, reason], float(ratio))
            for part in ("weights", "kv", "errors"):
                share = (found.get("divergence") or {}).get(part)
                if share is not None:
                    parts.add_metric([*slot, part], float(share))
            for signal in (found.get("coverage") or {}).get("missing") or []:
                missing.add_metric([*slot, str(signal)], 1.0)
    yield from (value, reasons, parts, missing)
