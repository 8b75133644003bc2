"""OpenSLO v1 import: a contract from OpenSLO documents, with a warning for what does not map.

`import_openslo` reads a multi-document stream (one node budget for all of it), maps every SLO
with a ratioMetric indicator to an objective, follows alertPolicyRef/conditionRef to burnrate
AlertConditions, and validates the contract it builds like any other contract document; errors
are paths into the OpenSLO documents.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from serving.dataplane.sli import BOUNDS_MS
from serving.slo import source
from serving.slo.errors import ContractError, FieldError, PathItem, format_path
from serving.slo.model import (
    API_VERSION,
    KIND,
    QUANTILES,
    RATIO_SLIS,
    AlertRule,
    Contract,
    format_duration,
    parse_duration,
)
from serving.slo.openslo.export import OPENSLO_VERSION, PREFIX, SOURCE_TYPE, dns, unique
from serving.slo.parse import validate_document
from serving.slo.source import compose, line_of

_OPENSLO_UNITS = {"w": 7 * 86400}


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass
class _Import:
    warnings: list[str] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)
    objectives: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[AlertRule] = field(default_factory=list)
    alert_sets: set[tuple[AlertRule, ...]] = field(default_factory=set)
    window: int | None = None
    name: str | None = None
    description: str = ""


def import_openslo(text: str) -> tuple[Contract, list[str]]:
    """A contract from OpenSLO v1 YAML, and a warning for every part that does not map.

    Raises ContractError (fields are paths into the OpenSLO documents, e.g.
    "doc[2].spec.indicator") when no objective maps.
    """
    _check_stream_budget(text)
    state = _Import()
    slos: list[tuple[int, yaml.Node, dict[str, Any]]] = []
    by_kind: dict[str, dict[str, dict[str, Any]]] = {
        "AlertPolicy": {},
        "AlertCondition": {},
        "SLI": {},
    }
    for index, (root, data) in enumerate(compose(text, many=True)):
        if data is None:
            continue
        where = f"doc[{index}]"
        if not isinstance(data, dict) or data.get("apiVersion") != OPENSLO_VERSION:
            state.warnings.append(f"{where}: not an {OPENSLO_VERSION} document; skipped")
            continue
        kind, name = data.get("kind"), _d(data.get("metadata")).get("name")
        if kind == "SLO":
            slos.append((index, root, data))
        elif kind in by_kind and isinstance(name, str):
            by_kind[str(kind)][name] = data
        else:
            state.warnings.append(f"{where}: {kind} '{name}' has no SLA contract equivalent")
    for index, root, slo in slos:
        try:
            _import_slo(state, index, root, slo, by_kind)
        except (AttributeError, TypeError, ValueError, KeyError) as exc:  # malformed foreign parts
            message = f"cannot be read: {exc}"
            state.errors.append(FieldError(line_of(root, ()), f"doc[{index}]", message))
            state.warnings.append(f"doc[{index}]: {message}; skipped")
    if not state.objectives:
        if not state.errors:
            state.errors.append(FieldError(None, "", "no SLO document (kind: SLO, openslo/v1)"))
        raise ContractError(state.errors)
    return _build(state), state.warnings


def _check_stream_budget(text: str) -> None:
    """One node budget (source.MAX_NODES, aliases expanded) for the whole stream: documents
    that each stay under it must not add up to a YAML bomb. Text that does not compose is
    left to `compose`, which says what is wrong with it."""
    if len(text.encode("utf-8")) > source.MAX_BYTES:
        return  # compose refuses it before reading
    budget = source.MAX_NODES
    try:
        loader = source.ContractLoader(text)
    except yaml.YAMLError:
        return
    try:
        index = 0
        while loader.check_node():
            root = loader.get_node()
            if root is None:
                continue
            stack: list[yaml.Node] = [root]
            while stack:
                node = stack.pop()
                budget -= 1
                if budget < 0:
                    message = (
                        f"the YAML stream is too large: its documents together pass "
                        f"{source.MAX_NODES} nodes (aliases expanded), here in document "
                        f"{index + 1}"
                    )
                    line = node.start_mark.line + 1
                    raise ContractError([FieldError(line, f"doc[{index}]", message)])
                if isinstance(node, yaml.SequenceNode):
                    stack.extend(node.value)
                elif isinstance(node, yaml.MappingNode):
                    for key, value in node.value:
                        stack.extend((key, value))
            index += 1
    except (yaml.YAMLError, RecursionError):
        return
    finally:
        loader.dispose()


def _import_slo(
    state: _Import,
    index: int,
    root: yaml.Node,
    slo: dict[str, Any],
    by_kind: Mapping[str, Mapping[str, dict[str, Any]]],
) -> None:
    metadata = _d(slo.get("metadata"))
    annotations = _d(metadata.get("annotations"))
    spec = _d(slo.get("spec"))
    where = f"doc[{index}] SLO '{metadata.get('name')}'"

    def fail(path: tuple[PathItem, ...], message: str) -> None:
        field_path = f"doc[{index}]" + (f".{format_path(path)}" if path else "")
        state.errors.append(FieldError(line_of(root, path), field_path, message))
        state.warnings.append(f"{where}: {message}; skipped")

    indicator = spec.get("indicator")
    if indicator is None and "indicatorRef" in spec:
        indicator = by_kind["SLI"].get(spec["indicatorRef"])
        if indicator is None:
            fail(("spec", "indicatorRef"), f"no SLI named '{spec['indicatorRef']}'")
            return
    indicator_spec = _d(_d(indicator).get("spec"))
    ratio = indicator_spec.get("ratioMetric")
    if ratio is None:
        kinds = ", ".join(indicator_spec) or "no indicator"
        fail(("spec", "indicator"), f"only ratioMetric indicators map (found {kinds})")
        return
    ratio = _d(ratio)
    source = _d(_d(ratio.get("good") or ratio.get("bad")).get("metricSource"))
    source_spec = _d(source.get("spec"))
    sli = source_spec.get("sli") if source.get("type") == SOURCE_TYPE else None
    if sli is None:
        hints = [annotations.get(f"{PREFIX}sli"), metadata.get("displayName"), metadata.get("name")]
        sli = next((h for h in hints if h in RATIO_SLIS), None)
        if sli is None:
            message = f"metric source type '{source.get('type')}' does not map to an SLI"
            fail(("spec", "indicator", "spec", "ratioMetric"), message)
            return
        state.warnings.append(f"{where}: metric source '{source.get('type')}' read as {sli}")
    if sli not in RATIO_SLIS:
        fail(("spec", "indicator", "spec", "ratioMetric"), f"unknown SLI '{sli}'")
        return
    threshold = source_spec.get("threshold_ms", annotations.get(f"{PREFIX}threshold-ms"))
    if sli in QUANTILES and (threshold is None or float(threshold) not in BOUNDS_MS):
        message = f"{sli} needs threshold_ms, one of {', '.join(map(str, BOUNDS_MS))}"
        fail(("spec", "indicator", "spec", "ratioMetric"), message)
        return
    window = _import_window(state, where, _l(spec.get("timeWindow")))
    if spec.get("budgetingMethod", "Occurrences") != "Occurrences":
        state.warnings.append(f"{where}: {spec['budgetingMethod']} budgeting read as Occurrences")
    objectives = _l(spec.get("objectives"))
    mapped_before = len(state.objectives)
    for number, raw in enumerate(objectives):
        entry = _d(raw)
        target = entry.get("target")
        if target is None and entry.get("targetPercent") is not None:
            target = float(entry["targetPercent"]) / 100
        if not isinstance(target, int | float) or not 0 < target < 1:
            fail(("spec", "objectives", number), "needs a target between 0 and 1")
            continue
        if any(k in entry for k in ("op", "value", "timeSliceTarget", "indicator")):
            state.warnings.append(f"{where}: objectives[{number}] op/value/timeslices ignored")
        name = annotations.get(f"{PREFIX}objective") if len(objectives) == 1 else None
        name = dns(str(name or entry.get("displayName") or metadata.get("name") or sli))
        item: dict[str, Any] = {"name": unique(name, [o["name"] for o in state.objectives])}
        item["sli"] = sli
        if sli == "error_rate":
            item["max"] = source_spec.get("max") or round(1.0 - float(target), 12)
        else:
            item["target"] = target
        if sli in QUANTILES:
            item["threshold_ms"] = int(float(str(threshold)))
        state.objectives.append(item)
    if len(state.objectives) == mapped_before:
        return
    if state.window is None:
        state.window = window
        state.name = annotations.get(f"{PREFIX}contract") or dns(str(spec.get("service", "")))
        state.description = str(annotations.get(f"{PREFIX}description", ""))
    elif window != state.window:
        state.warnings.append(f"{where}: window {format_duration(window)} differs; first one used")
    alerts = tuple(_import_alerts(state, where, _l(spec.get("alertPolicies")), by_kind))
    state.alert_sets.add(alerts)
    state.alerts += [a for a in alerts if a not in state.alerts]


def _duration(text: Any) -> int | None:
    match = re.fullmatch(r"([0-9]{1,7})([smhdw])", str(text))
    if match is None:
        return None
    if match.group(2) in _OPENSLO_UNITS:
        return int(match.group(1)) * _OPENSLO_UNITS[match.group(2)]
    return parse_duration(match.group(0))


def _import_window(state: _Import, where: str, windows: list[Any]) -> int:
    if not windows:
        state.warnings.append(f"{where}: no timeWindow; 30d assumed")
        return 30 * 86400
    first = _d(windows[0])
    seconds = _duration(first.get("duration"))
    if seconds is None:
        state.warnings.append(f"{where}: window {first.get('duration')!r} not understood; 30d used")
        return 30 * 86400
    if first.get("calendar") is not None or not first.get("isRolling", False):
        state.warnings.append(f"{where}: calendar window read as a rolling {first['duration']}")
    return seconds


def _import_alerts(
    state: _Import,
    where: str,
    policies: list[Any],
    by_kind: Mapping[str, Mapping[str, dict[str, Any]]],
) -> list[AlertRule]:
    rules: list[AlertRule] = []
    for entry in policies:
        ref = entry.get("alertPolicyRef") if isinstance(entry, dict) else None
        policy = by_kind["AlertPolicy"].get(ref) if ref else entry
        if not isinstance(policy, dict) or policy.get("kind", "AlertPolicy") != "AlertPolicy":
            state.warnings.append(f"{where}: alert policy {ref or entry!r} not found; skipped")
            continue
        policy_action = _d(_d(policy.get("metadata")).get("annotations")).get(f"{PREFIX}action")
        for item in _l(_d(policy.get("spec")).get("conditions")):
            cref = item.get("conditionRef") if isinstance(item, dict) else None
            condition = by_kind["AlertCondition"].get(cref) if cref else item
            if not isinstance(condition, dict):
                state.warnings.append(f"{where}: alert condition {cref!r} not found; skipped")
                continue
            rule = _import_condition(state, where, condition, policy_action)
            if rule is not None:
                rules.append(rule)
    return rules


def _import_condition(
    state: _Import, where: str, document: dict[str, Any], policy_action: Any
) -> AlertRule | None:
    metadata = _d(document.get("metadata"))
    annotations = _d(metadata.get("annotations"))
    spec = _d(document.get("spec"))
    condition = _d(spec.get("condition"))
    label = f"{where}: alert condition '{metadata.get('name')}'"
    if condition.get("kind") != "burnrate" or condition.get("op") not in ("gte", "gt"):
        state.warnings.append(f"{label}: only 'burnrate' with op gte/gt maps; skipped")
        return None
    long = _duration(condition.get("lookbackWindow"))
    short = _duration(condition.get("alertAfter") or annotations.get(f"{PREFIX}short-window"))
    threshold = condition.get("threshold")
    if long is None or not isinstance(threshold, int | float) or threshold <= 0:
        state.warnings.append(f"{label}: needs lookbackWindow and a positive threshold; skipped")
        return None
    if short is None:
        short = max(long // 12, 60)
        state.warnings.append(f"{label}: no alertAfter; short window {format_duration(short)}")
    severity = str(spec.get("severity", "")).lower()
    if severity not in ("page", "ticket"):
        state.warnings.append(f"{label}: severity {spec.get('severity')!r} read as ticket")
        severity = "ticket"
    action = annotations.get(f"{PREFIX}action") or policy_action or "notify"
    if action not in ("rollback", "pause", "notify"):
        state.warnings.append(f"{label}: action {action!r} read as notify")
        action = "notify"
    return AlertRule(severity, float(threshold), long, short, str(action))


def _build(state: _Import) -> Contract:
    window = state.window or 30 * 86400
    alerts: list[AlertRule] = []
    for alert in state.alerts:
        if alert.long > window or alert.short >= alert.long or alert.long < 300 or alert.short < 60:
            state.warnings.append(
                f"burn-rate alert {alert.burn_rate:g}x over {format_duration(alert.long)}/"
                f"{format_duration(alert.short)} does not fit the {format_duration(window)} "
                "window (short >= 1m, long >= 5m, short < long <= window); skipped"
            )
        else:
            alerts.append(alert)
    if len(state.alert_sets) > 1:
        state.warnings.append("SLOs have different alert policies; all apply to every objective")
    spec: dict[str, Any] = {"window": format_duration(window), "objectives": state.objectives}
    if alerts:
        spec["alerts"] = [a.to_dict() for a in alerts]
    else:
        state.warnings.append("no burnrate alert conditions map; the default alerts apply")
    metadata = {"name": dns(state.name or "imported-slo")}
    if state.description:
        metadata["description"] = state.description
    document = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
    errors = validate_document(document)
    if errors:
        raise ContractError(errors)
    return Contract.from_dict(document)
