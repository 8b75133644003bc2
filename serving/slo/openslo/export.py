"""OpenSLO v1 export: a contract's ratio objectives and burn-rate alerts as OpenSLO documents.

The OpenSLO vocabulary of the portal (API version, metric source type, annotation prefix), the
DNS-label naming rules that both directions share (`dns`, `unique`), and `export_openslo`, which
writes AlertCondition + AlertPolicy documents for every burn-rate alert and one SLO document per
ratio objective, under a header comment naming what does not map.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from serving.slo.model import AlertRule, Contract, Objective, format_duration

OPENSLO_VERSION = "openslo/v1"
SOURCE_TYPE = "aiops-portal"
PREFIX = "aiops.portal/"
BOTH_WINDOWS_NOTE = (
    "fires only when the burn rate over lookbackWindow (the long window) and over alertAfter "
    "(the short window) are both at or above threshold"
)


def dns(text: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    slug = re.sub(r"-{2,}", "-", slug)[:63].strip("-")
    return slug or "objective"


def _alert_name(contract: Contract, alert: AlertRule) -> str:
    rate = f"{alert.burn_rate:g}".replace(".", "-")
    tail = f"-{alert.severity}-{rate}x-{format_duration(alert.long)}-{format_duration(alert.short)}"
    return dns(contract.name[: 63 - len(tail)] + tail)


def _metric(objective: Objective, events: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"sli": objective.sli, "events": events}
    if objective.threshold_ms is not None:
        spec["threshold_ms"] = objective.threshold_ms
    if objective.sli == "error_rate":
        spec["max"] = objective.max
    return {"metricSource": {"type": SOURCE_TYPE, "spec": spec}}


def _doc(kind: str, metadata: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": OPENSLO_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def unique(name: str, taken: list[str]) -> str:
    base, number = name, 2
    while name in taken:
        name, number = dns(f"{base[:58]}-{number}"), number + 1
    taken.append(name)
    return name


def export_openslo(contract: Contract, *, service: str) -> str:
    """Multi-document OpenSLO v1 YAML: alert conditions and policies, then one SLO per objective."""
    documents: list[dict[str, Any]] = []
    policies: list[str] = []
    for alert in contract.alerts:
        name = unique(_alert_name(contract, alert), policies)
        annotations = {
            f"{PREFIX}action": alert.action,
            f"{PREFIX}short-window": format_duration(alert.short),
            f"{PREFIX}note": BOTH_WINDOWS_NOTE,
        }
        condition = {
            "kind": "burnrate",
            "op": "gte",
            "threshold": alert.burn_rate,
            "lookbackWindow": format_duration(alert.long),
            "alertAfter": format_duration(alert.short),
        }
        description = f"error budget burning {alert.burn_rate:g}x: {alert.action}"
        documents.append(
            _doc(
                "AlertCondition",
                {"name": name, "annotations": annotations},
                {"description": description, "severity": alert.severity, "condition": condition},
            )
        )
        policy = {
            "description": description,
            "alertWhenBreaching": True,
            "alertWhenResolved": False,
            "alertWhenNoData": False,
            "conditions": [{"conditionRef": name}],
        }
        action = {f"{PREFIX}action": alert.action}
        documents.append(_doc("AlertPolicy", {"name": name, "annotations": action}, policy))
    slo_names: list[str] = []
    for objective in contract.ratio_objectives:
        name = unique(dns(f"{contract.name[:31]}-{objective.name}"), slo_names)
        annotations = {
            f"{PREFIX}contract": contract.name,
            f"{PREFIX}objective": objective.name,
            f"{PREFIX}sli": objective.sli,
        }
        if contract.description:
            annotations[f"{PREFIX}description"] = contract.description
        ratio = {
            "counter": True,
            "good": _metric(objective, "good"),
            "total": _metric(objective, "total"),
        }
        indicator = {"name": dns(name[:59] + "-sli"), "displayName": objective.name}
        spec: dict[str, Any] = {
            "description": f"{objective.sli} objective of SLA contract {contract.name}",
            "service": service,
            "indicator": {"metadata": indicator, "spec": {"ratioMetric": ratio}},
            "timeWindow": [{"duration": format_duration(contract.window), "isRolling": True}],
            "budgetingMethod": "Occurrences",
            "objectives": [{"displayName": objective.name, "target": objective.target}],
        }
        if policies:
            spec["alertPolicies"] = [{"alertPolicyRef": p} for p in policies]
        metadata = {"name": name, "displayName": objective.name, "annotations": annotations}
        documents.append(_doc("SLO", metadata, spec))
    return _header(contract) + yaml.safe_dump_all(documents, sort_keys=False)


def _header(contract: Contract) -> str:
    lines = [f"# OpenSLO v1 export of SLA contract '{contract.name}' by the AI ops portal."]
    left_out = [f"gauge objective '{o.name}'" for o in contract.gauge_objectives]
    left_out += [f"fast rule '{r.name}'" for r in contract.fast]
    if contract.gate.mode != "off":
        left_out.append(f"the promotion gate ({contract.gate.mode})")
    if left_out:
        lines.append("# Not exported (no OpenSLO equivalent): " + ", ".join(left_out) + ".")
    return "\n".join(lines) + "\n"
