"""A contract as Prometheus rules, Sloth-style: per ratio objective, recording rules of the
error ratio over 5m, 30m, 1h, 2h, 6h, 1d and 3d (and the contract's window), the SLO's meta
series (objective, budget, burn rates, budget left), and the contract's multiwindow
multi-burn-rate alerts; its fast rules and budget exhaustion as alerts too.

The expressions read the series the portal's /metrics exports per deployment slot (the
`SLI_*` names below: the health tick's cumulative counts, labelled tenant, deployment, slot),
so the rules work against the portal itself. Gauge objectives (tokens/s, drift, freshness) are
judged by the health tick only and are named in the header as not exported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from serving.dataplane.sli import BOUNDS_MS
from serving.slo.model import HISTOGRAMS, QUANTILES, Contract, FastRule, Objective, format_duration

# The SLI series of /metrics (serving/telemetry/metrics_slo.py), per (tenant, deployment, slot).
SLI_REQUESTS = "portal_sli_requests_total"
SLI_ERRORS = "portal_sli_errors_total"  # the service's fault
SLI_REJECTED = "portal_sli_rejected_total"  # the client's fault: not counted against the SLO
SLI_HISTOGRAMS = {
    "latency": "portal_sli_latency_seconds",
    "ttft": "portal_sli_ttft_seconds",
    "itl": "portal_sli_itl_seconds",
}
SLI_LABELS = ("tenant", "deployment", "slot")
# Sloth's windows: the SRE workbook's four alert pairs, each window recorded once.
WINDOWS = (300, 1800, 3600, 2 * 3600, 6 * 3600, 86400, 3 * 86400)
MIN_RATE_WINDOW = 60  # a rate needs two scrapes: a fast rule's shorter `for` is read over 1m
ERROR_RATIO = "slo:sli_error:ratio_rate{window}"

# What may stand in a label matcher unescaped: the shapes of tenant slugs (a component of
# serving.control.names) and of deployment names (DNS labels).
_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,79}$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_BY = f"sum by ({', '.join(SLI_LABELS)})"


class RulesError(ValueError):
    """A target the rules cannot name safely; `field` says which."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class RuleTarget:
    """One deployment's contract, with the names its series carry."""

    tenant: str
    deployment: str
    contract: Contract

    def __post_init__(self) -> None:
        if not isinstance(self.tenant, str) or not _SLUG.match(self.tenant):
            raise RulesError("tenant", f"not a tenant slug: {self.tenant!r}")
        if not isinstance(self.deployment, str) or not _NAME.match(self.deployment):
            raise RulesError("deployment", f"not a deployment name: {self.deployment!r}")


def le_label(bound_ms: float) -> str:
    """The `le` of a histogram bucket bounded at `bound_ms` milliseconds, as /metrics writes it
    (seconds, Go float formatting: Prometheus 3 normalises `le` to the same text)."""
    return repr(bound_ms / 1000.0)


def _matchers(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _window(seconds: int) -> str:
    return format_duration(seconds)


def _rate(metric: str, selector: str, window: str) -> str:
    return f"{_BY} (rate({metric}{selector}[{window}]))"


def _eligible(selector: str, window: str, fn: str = "rate") -> str:
    """Requests that count toward the SLO: all of them but the client's errors."""
    requests = f"{_BY} ({fn}({SLI_REQUESTS}{selector}[{window}]))"
    rejected = f"{_BY} ({fn}({SLI_REJECTED}{selector}[{window}]))"
    return f"({requests} - {rejected})"


def error_ratio_expr(target: RuleTarget, objective: Objective, window: str) -> str:
    """Bad events / all events of a ratio objective over `window`, per slot."""
    selector = _matchers(tenant=target.tenant, deployment=target.deployment)
    if objective.sli in ("availability", "error_rate"):
        return f"{_rate(SLI_ERRORS, selector, window)} / {_eligible(selector, window)}"
    if objective.sli in HISTOGRAMS and objective.threshold_ms in BOUNDS_MS:
        bucket = SLI_HISTOGRAMS[HISTOGRAMS[objective.sli]] + "_bucket"
        good = _matchers(
            tenant=target.tenant,
            deployment=target.deployment,
            le=le_label(float(objective.threshold_ms)),
        )
        total = _matchers(tenant=target.tenant, deployment=target.deployment, le="+Inf")
        return f"1 - ({_rate(bucket, good, window)} / {_rate(bucket, total, window)})"
    raise RulesError(f"objective.{objective.name}", "not a ratio objective")


def _slo_selector(target: RuleTarget, objective: Objective) -> str:
    return _matchers(tenant=target.tenant, deployment=target.deployment, slo=objective.name)


def _budget(objective: Objective) -> float:
    if objective.target is None:
        raise RulesError(f"objective.{objective.name}", "has no target")
    return round(1.0 - objective.target, 12)


def _sli_group(target: RuleTarget, objective: Objective, windows: list[int]) -> dict[str, Any]:
    labels = {"slo": objective.name, "sli": objective.sli}
    rules: list[dict[str, Any]] = []
    for seconds in windows:
        window = _window(seconds)
        rules.append(
            {
                "record": ERROR_RATIO.format(window=window),
                "expr": error_ratio_expr(target, objective, window),
                "labels": {**labels, "slo_window": window},
            }
        )
    period = _window(target.contract.window)
    if target.contract.window not in windows:
        # The period's ratio from the 5m one (Sloth): a 30d rate over raw counters is costly.
        five = ERROR_RATIO.format(window="5m") + _slo_selector(target, objective)
        rules.append(
            {
                "record": ERROR_RATIO.format(window=period),
                "expr": f"sum_over_time({five}[{period}]) / ignoring (slo_window) "
                f"count_over_time({five}[{period}])",
                "labels": {**labels, "slo_window": period},
            }
        )
    return {"name": _group_name(target, objective.name, "sli"), "rules": rules}


def _meta_group(target: RuleTarget, objective: Objective) -> dict[str, Any]:
    labels = {
        "tenant": target.tenant,
        "deployment": target.deployment,
        "slo": objective.name,
        "sli": objective.sli,
    }
    selector = _slo_selector(target, objective)
    period = _window(target.contract.window)
    per_budget = f" / on (tenant, deployment, slo) group_left slo:error_budget:ratio{selector}"
    rules: list[dict[str, Any]] = [
        {"record": "slo:objective:ratio", "expr": f"vector({objective.target!r})"},
        {"record": "slo:error_budget:ratio", "expr": f"vector({_budget(objective)!r})"},
        {"record": "slo:time_period:days", "expr": f"vector({target.contract.window / 86400:g})"},
        {
            "record": "slo:current_burn_rate:ratio",
            "expr": ERROR_RATIO.format(window="5m") + selector + per_budget,
        },
        {
            "record": "slo:period_burn_rate:ratio",
            "expr": ERROR_RATIO.format(window=period) + selector + per_budget,
        },
        {
            "record": "slo:period_error_budget_remaining:ratio",
            "expr": f"1 - slo:period_burn_rate:ratio{selector}",
        },
    ]
    for rule in rules:
        rule["labels"] = dict(labels)
    return {"name": _group_name(target, objective.name, "meta"), "rules": rules}


def _alert_group(target: RuleTarget, objective: Objective) -> dict[str, Any]:
    """One alert per (severity, action) of the contract's burn-rate alerts: any of its window
    pairs burning at its rate in both windows fires it, as the health tick judges."""
    selector = _slo_selector(target, objective)
    budget = _budget(objective)
    by_kind: dict[tuple[str, str], list[str]] = {}
    for alert in target.contract.alerts:
        pair = [
            f"max without (slo_window) ({ERROR_RATIO.format(window=_window(w))}{selector} "
            f"> ({alert.burn_rate:g} * {budget!r}))"
            for w in (alert.long, alert.short)
        ]
        by_kind.setdefault((alert.severity, alert.action), []).append(f"({' and '.join(pair)})")
    severities = [severity for severity, _ in by_kind]
    where = "{{ $labels.tenant }}/{{ $labels.deployment }} ({{ $labels.slot }})"
    rules: list[dict[str, Any]] = []
    for (severity, action), pairs in by_kind.items():
        name = f"PortalSloBurnRate{severity.title()}"
        if severities.count(severity) > 1:
            name += action.title()
        rules.append(
            {
                "alert": name,
                "expr": " or ".join(pairs),
                "labels": {"severity": severity, "action": action, "sli": objective.sli},
                "annotations": {
                    "summary": f"{where}: the error budget of '{objective.name}' is burning",
                    "description": f"'{objective.name}' of contract '{target.contract.name}' "
                    f"burns its {_window(target.contract.window)} error budget fast enough to "
                    f"{action} (severity {severity}).",
                },
            }
        )
    rules.append(
        {
            "alert": "PortalSloErrorBudgetExhausted",
            "expr": f"slo:period_error_budget_remaining:ratio{selector} < 0",
            "labels": {"severity": "ticket", "action": "notify", "sli": objective.sli},
            "annotations": {
                "summary": f"{where}: the error budget of '{objective.name}' is spent",
                "description": f"More bad events than '{objective.name}' allows over "
                f"{_window(target.contract.window)}.",
            },
        }
    )
    return {"name": _group_name(target, objective.name, "alerts"), "rules": rules}


def fast_rule_expr(target: RuleTarget, rule: FastRule) -> str:
    """The fast rule's SLI over max(`for`, 1m), above its threshold with enough events."""
    selector = _matchers(tenant=target.tenant, deployment=target.deployment)
    window = _window(max(rule.for_seconds, MIN_RATE_WINDOW))
    if rule.sli == "error_rate" and rule.above is not None:
        ratio = f"{_rate(SLI_ERRORS, selector, window)} / {_eligible(selector, window)}"
        enough = f"{_eligible(selector, window, 'increase')} >= {rule.min_requests}"
        return f"({ratio} > {rule.above!r}) and {enough}"
    if rule.sli in HISTOGRAMS and rule.above_ms is not None:
        bucket = SLI_HISTOGRAMS[HISTOGRAMS[rule.sli]] + "_bucket"
        by_le = f"sum by ({', '.join(SLI_LABELS)}, le) (rate({bucket}{selector}[{window}]))"
        quantile = f"histogram_quantile({QUANTILES[rule.sli]!r}, {by_le})"
        total = _matchers(tenant=target.tenant, deployment=target.deployment, le="+Inf")
        events = (  # as the health tick counts them: requests for itl, observations otherwise
            f"{_BY} (increase({SLI_REQUESTS}{selector}[{window}]))"
            if rule.sli == "itl_p95"
            else f"{_BY} (increase({bucket}{total}[{window}]))"
        )
        return f"({quantile} * 1000 > {rule.above_ms!r}) and {events} >= {rule.min_requests}"
    raise RulesError(f"fast.{rule.name}", "has no threshold for its SLI")


def _fast_group(target: RuleTarget) -> dict[str, Any]:
    rules = [
        {
            "alert": "PortalSloFastRule",
            "expr": fast_rule_expr(target, rule),
            "labels": {
                "severity": rule.severity,
                "action": rule.action,
                "rule": rule.name,
                "sli": rule.sli,
            },
            "annotations": {
                "summary": "{{ $labels.tenant }}/{{ $labels.deployment }} "
                f"({{{{ $labels.slot }}}}): fast rule '{rule.name}' fires",
                "description": f"{rule.sli} over {_window(rule.for_seconds)} is past the "
                f"threshold of fast rule '{rule.name}' of contract '{target.contract.name}'.",
            },
        }
        for rule in target.contract.fast
    ]
    return {"name": _group_name(target, None, "fast"), "rules": rules}


def _group_name(target: RuleTarget, objective: str | None, kind: str) -> str:
    # `.` is in no slug, deployment or objective name: group names cannot collide.
    parts = [target.tenant, target.deployment] + ([objective] if objective else [])
    return f"portal-slo:{'.'.join(parts)}:{kind}"


def rule_windows(contract: Contract) -> list[int]:
    """Every window an error ratio is recorded over: Sloth's, plus any alert of the contract."""
    windows = set(WINDOWS)
    for alert in contract.alerts:
        windows.update((alert.long, alert.short))
    return sorted(windows)


def contract_rule_groups(target: RuleTarget) -> list[dict[str, Any]]:
    """The rule groups of one deployment's contract."""
    windows = rule_windows(target.contract)
    groups: list[dict[str, Any]] = []
    for objective in target.contract.ratio_objectives:
        groups += [
            _sli_group(target, objective, windows),
            _meta_group(target, objective),
            _alert_group(target, objective),
        ]
    if target.contract.fast:
        groups.append(_fast_group(target))
    return groups


def _left_out(target: RuleTarget) -> list[str]:
    return [
        f"{target.tenant}/{target.deployment}: gauge objective '{o.name}' ({o.sli}), "
        "judged by the health tick only"
        for o in target.contract.gauge_objectives
    ]


def _widened(target: RuleTarget) -> list[str]:
    return [
        f"{target.tenant}/{target.deployment}: fast rule '{r.name}' is read over 1m, not its "
        f"`for` of {_window(r.for_seconds)} (a rate needs two scrapes)"
        for r in target.contract.fast
        if r.for_seconds < MIN_RATE_WINDOW
    ]


def rules_document(targets: Iterable[RuleTarget]) -> dict[str, Any]:
    """`{"groups": [...]}` for every target: a Prometheus rule file's content."""
    groups: list[dict[str, Any]] = []
    for target in targets:
        groups += contract_rule_groups(target)
    return {"groups": groups}


def rules_yaml(targets: Iterable[RuleTarget]) -> str:
    """A Prometheus rule file (YAML) for every target, headed by what it leaves out."""
    targets = list(targets)
    lines = ["# Prometheus rules of the AI ops portal's SLA contracts (Sloth-style burn rates)."]
    lines += [f"# Not exported: {note}." for target in targets for note in _left_out(target)]
    lines += [f"# Note: {note}." for target in targets for note in _widened(target)]
    body = yaml.safe_dump(rules_document(targets), sort_keys=False, width=1000)
    return "\n".join(lines) + "\n" + body
