"""OpenSLO v1: the export is well-formed, export -> import round-trips, foreign parts warn."""

from __future__ import annotations

import re

import pytest
import yaml

from serving.slo.errors import ContractError
from serving.slo.openslo import export_openslo, import_openslo
from serving.slo.parse import parse_contract
from tests.slo.contracts import FULL, MINIMAL

DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def test_export_is_openslo_v1_yaml() -> None:
    contract = parse_contract(FULL)
    text = export_openslo(contract, service="support-bot")
    documents = list(yaml.safe_load_all(text))

    assert {d["apiVersion"] for d in documents} == {"openslo/v1"}
    assert [d["kind"] for d in documents].count("AlertCondition") == 4
    assert [d["kind"] for d in documents].count("AlertPolicy") == 4
    slos = [d for d in documents if d["kind"] == "SLO"]
    assert [s["metadata"]["displayName"] for s in slos] == ["availability", "errors", "p95"]
    assert all(DNS_LABEL.match(d["metadata"]["name"]) for d in documents)

    availability = slos[0]["spec"]
    assert availability["service"] == "support-bot"
    assert availability["timeWindow"] == [{"duration": "30d", "isRolling": True}]
    assert availability["budgetingMethod"] == "Occurrences"
    assert availability["objectives"] == [{"displayName": "availability", "target": 0.999}]
    ratio = availability["indicator"]["spec"]["ratioMetric"]
    assert ratio["counter"] is True
    assert ratio["good"]["metricSource"] == {
        "type": "aiops-portal",
        "spec": {"sli": "availability", "events": "good"},
    }
    p95_source = slos[2]["spec"]["indicator"]["spec"]["ratioMetric"]["total"]["metricSource"]
    assert p95_source["spec"] == {"sli": "latency_p95", "events": "total", "threshold_ms": 500}

    policies = {d["metadata"]["name"]: d for d in documents if d["kind"] == "AlertPolicy"}
    conditions = {d["metadata"]["name"]: d for d in documents if d["kind"] == "AlertCondition"}
    refs = [p["alertPolicyRef"] for p in availability["alertPolicies"]]
    assert set(refs) == set(policies)
    first = conditions[policies[refs[0]]["spec"]["conditions"][0]["conditionRef"]]
    assert first["spec"]["severity"] == "page"
    assert first["spec"]["condition"] == {
        "kind": "burnrate",
        "op": "gte",
        "threshold": 14.4,
        "lookbackWindow": "1h",
        "alertAfter": "5m",
    }
    assert "both" in first["metadata"]["annotations"]["aiops.portal/note"]
    assert first["metadata"]["annotations"]["aiops.portal/action"] == "rollback"
    # What OpenSLO cannot say is named in the header, not silently lost.
    assert "gauge objective 'throughput'" in text.splitlines()[1]
    assert "fast rule 'error-spike'" in text.splitlines()[1]


def test_round_trip_keeps_ratio_objectives_and_alerts() -> None:
    contract = parse_contract(FULL)

    imported, warnings = import_openslo(export_openslo(contract, service="support-bot"))

    assert warnings == []
    assert imported.name == contract.name
    assert imported.description == contract.description
    assert imported.window == contract.window
    assert imported.objectives == contract.ratio_objectives
    assert imported.alerts == contract.alerts


def test_round_trip_with_default_alerts_and_a_long_name() -> None:
    text = MINIMAL.format(window="7d").replace("name: mini", "name: " + "a" * 60)
    contract = parse_contract(text)

    exported = export_openslo(contract, service="svc")
    imported, warnings = import_openslo(exported)

    assert all(DNS_LABEL.match(d["metadata"]["name"]) for d in yaml.safe_load_all(exported))
    assert (imported.name, imported.window, warnings) == (contract.name, 7 * 86400, [])
    assert imported.alerts == contract.alerts
    assert imported.objectives == contract.objectives


FOREIGN = """\
apiVersion: openslo/v1
kind: Service
metadata: {name: checkout}
spec: {description: the shop}
---
apiVersion: openslo/v1
kind: SLO
metadata:
  name: checkout-availability
  displayName: availability
spec:
  service: checkout
  indicator:
    metadata: {name: checkout-ok}
    spec:
      ratioMetric:
        counter: true
        good: {metricSource: {type: prometheus, spec: {query: 'sum(rate(ok[1m]))'}}}
        total: {metricSource: {type: prometheus, spec: {query: 'sum(rate(all[1m]))'}}}
  timeWindow:
    - duration: 28d
      isRolling: false
      calendar: {startTime: "2024-01-01 00:00:00", timeZone: UTC}
  budgetingMethod: Timeslices
  objectives:
    - displayName: availability
      targetPercent: 99.5
  alertPolicies:
    - kind: AlertPolicy
      metadata: {name: page-fast}
      spec:
        conditions:
          - kind: AlertCondition
            metadata: {name: fast-burn}
            spec:
              severity: page
              condition: {kind: burnrate, op: gte, threshold: 14.4, lookbackWindow: 1h, alertAfter: 5m}
          - kind: AlertCondition
            metadata: {name: weird}
            spec:
              severity: page
              condition: {kind: threshold, op: lt, threshold: 0.5}
---
apiVersion: openslo/v1
kind: SLO
metadata: {name: checkout-latency}
spec:
  service: checkout
  indicator:
    metadata: {name: latency}
    spec:
      thresholdMetric:
        metricSource: {type: prometheus, spec: {query: 'p95'}}
  timeWindow: [{duration: 28d, isRolling: true}]
  objectives: [{op: lte, value: 300, target: 0.95}]
"""


def test_import_maps_what_maps_and_warns_about_the_rest() -> None:
    contract, warnings = import_openslo(FOREIGN)

    assert contract.name == "checkout"
    assert contract.window == 28 * 86400
    (objective,) = contract.objectives
    assert (objective.name, objective.sli, objective.target) == (
        "availability",
        "availability",
        0.995,
    )
    (alert,) = contract.alerts
    assert (alert.severity, alert.burn_rate, alert.long, alert.short) == ("page", 14.4, 3600, 300)
    assert alert.action == "notify"  # no portal annotation: never roll back on a foreign rule

    text = "\n".join(warnings)
    for expected in (
        "Service 'checkout' has no SLA contract equivalent",
        "metric source 'prometheus' read as availability",
        "calendar window read as a rolling 28d",
        "Timeslices budgeting read as Occurrences",
        "alert condition 'weird': only 'burnrate'",
        "SLO 'checkout-latency': only ratioMetric indicators map (found thresholdMetric)",
    ):
        assert expected in text


def test_import_with_nothing_that_maps_names_the_documents() -> None:
    only_threshold = FOREIGN.split("---\n")[2]
    broken = "apiVersion: openslo/v1\nkind: SLO\nmetadata: {name: x}\nspec: {}\n---\n"

    with pytest.raises(ContractError) as caught:
        import_openslo(broken + only_threshold)

    assert [(e.line, e.field) for e in caught.value.errors] == [
        (4, "doc[0].spec.indicator"),
        (11, "doc[1].spec.indicator"),
    ]
    assert "thresholdMetric" in caught.value.errors[1].message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: [\n", "invalid YAML"),
        ("apiVersion: openslo/v1alpha\nkind: SLO\n", "no SLO document"),
        ("", "no SLO document"),
    ],
)
def test_import_refuses_unusable_input(text: str, message: str) -> None:
    with pytest.raises(ContractError, match=re.escape(message)):
        import_openslo(text)


def test_round_trip_of_custom_alerts_and_error_rate() -> None:
    text = MINIMAL.format(window="14d") + (
        "    - {name: errors, sli: error_rate, max: 0.02}\n"
        "    - {name: ttft, sli: ttft_p95, threshold_ms: 250, target: 0.9}\n"
        "  alerts:\n"
        "    - {severity: ticket, burn_rate: 2.5, long: 12h, short: 10m, action: pause}\n"
        "    - {severity: page, burn_rate: 10, long: 2h, short: 1m, action: rollback}\n"
    )
    contract = parse_contract(text)

    imported, warnings = import_openslo(export_openslo(contract, service="svc"))

    assert warnings == []
    assert imported.objectives == contract.objectives
    assert imported.objective("errors").max == 0.02
    assert imported.alerts == contract.alerts


def _bulky_service(n: int) -> str:
    """A Service document of about 12 000 nodes once its aliases expand (each under the
    per-document budget of 50 000)."""
    lines = [f"apiVersion: openslo/v1\nkind: Service\nmetadata:\n  name: s{n}\n  labels:"]
    lines.append(f"    a0: &a0 [{', '.join(['x'] * 10)}]")
    lines += [f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 4)]
    return "\n".join(lines) + "\n"


def test_the_node_budget_covers_the_whole_stream() -> None:
    slo = export_openslo(parse_contract(MINIMAL.format(window="30d")), service="svc")
    few = slo + "---\n" + "---\n".join(_bulky_service(n) for n in range(3))
    contract, warnings = import_openslo(few)  # ~37 000 nodes in all: fine
    assert contract.objectives and "Service 's2' has no SLA contract equivalent" in warnings[-1]

    many = slo + "---\n" + "---\n".join(_bulky_service(n) for n in range(8))  # ~99 000
    with pytest.raises(ContractError) as caught:
        import_openslo(many)
    (error,) = caught.value.errors
    assert "the YAML stream is too large" in error.message and "50000 nodes" in error.message
    starts = [i + 1 for i, line in enumerate(many.splitlines()) if line == "kind: Service"]
    index = int(error.field.removeprefix("doc[").removesuffix("]"))
    service = index - (len(list(yaml.safe_load_all(slo))))  # which bulky document
    assert 3 <= service < 8 and error.line is not None
    assert starts[service] <= error.line < (starts + [10**9])[service + 1]
