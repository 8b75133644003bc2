"""A contract as Prometheus rules (serving.slo.rules): every group and rule is well-formed the
way Prometheus' rule loader (rulefmt) checks it, every expression parses with a real PromQL
parser (promql-parser; promtool is not installable from PyPI), the windows and burn-rate pairs
are Sloth's, and every series an expression reads is one /metrics exports or a rule records.
The API routes serve them per deployment (tenant-scoped) and for the whole platform."""

from __future__ import annotations

import re
from typing import Any

import promql_parser
import pytest
import yaml
from django.test import Client, override_settings

from serving.dataplane.sli import BOUNDS_MS
from serving.deployments.models import Deployment
from serving.ops.contracts import contract_set
from serving.slo.model import parse_duration
from serving.slo.parse import parse_contract
from serving.slo.rules import (
    SLI_ERRORS,
    SLI_HISTOGRAMS,
    SLI_REJECTED,
    SLI_REQUESTS,
    RulesError,
    RuleTarget,
    le_label,
    rules_document,
    rules_yaml,
)
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.slo.contracts import FULL, MINIMAL

METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
# What /metrics exports for the rules to read (serving/telemetry/metrics_slo.py).
EXPORTED = {SLI_REQUESTS, SLI_ERRORS, SLI_REJECTED} | {
    f"{family}_bucket" for family in SLI_HISTOGRAMS.values()
}
SLOTH_WINDOWS = ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]


def _target(source: str = FULL) -> RuleTarget:
    return RuleTarget(tenant="acme", deployment="assistant", contract=parse_contract(source))


def selectors(expr: str) -> list[Any]:
    """Every vector selector of a PromQL expression (the parser's own AST)."""
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def check_rule_file(document: Any) -> list[dict[str, Any]]:
    """What Prometheus' rule loader checks of a rule file, plus a real parse of every `expr`;
    returns the rules."""
    assert set(document) == {"groups"}, "a rule file has `groups:` only"
    names = [group["name"] for group in document["groups"]]
    assert len(names) == len(set(names)), "group names must be unique"
    rules: list[dict[str, Any]] = []
    for group in document["groups"]:
        assert set(group) <= {"name", "interval", "rules"}, group["name"]
        assert isinstance(group["name"], str) and group["name"], group
        assert group["rules"], f"group {group['name']} has no rules"
        for rule in group["rules"]:
            assert ("record" in rule) != ("alert" in rule), rule
            allowed = {"record", "expr", "labels"} if "record" in rule else {
                "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}  # fmt: skip
            assert set(rule) <= allowed, rule
            if "record" in rule:
                assert METRIC_NAME.match(rule["record"]), rule["record"]
            else:
                assert isinstance(rule["alert"], str) and rule["alert"], rule
                assert "for" not in rule or DURATION.match(rule["for"]), rule
            for key in ("labels", "annotations"):
                for name, value in (rule.get(key) or {}).items():
                    assert LABEL_NAME.match(name) and not name.startswith("__"), name
                    assert isinstance(value, str), (name, value)
            try:
                promql_parser.parse(rule["expr"])
            except ValueError as exc:
                pytest.fail(f"{rule.get('record') or rule.get('alert')}: {exc}: {rule['expr']}")
            rules.append(rule)
    return rules


def test_every_rule_is_well_formed_and_every_expression_parses() -> None:
    text = rules_yaml([_target()])
    rules = check_rule_file(yaml.safe_load(text))
    assert len(rules) >= 3 * 15  # three ratio objectives, each 8 recordings, 6 meta, 3 alerts
    # the header names what is not exported, and the fast rule read over 1m
    assert "gauge objective 'throughput' (tokens_per_s)" in text
    assert "gauge objective 'prompt-drift'" in text and "'profile-fresh'" in text
    assert "fast rule 'error-spike' is read over 1m" in text


def test_every_series_read_is_exported_by_metrics_or_recorded() -> None:
    document = rules_document([_target()])
    rules = check_rule_file(document)
    recorded = {rule["record"] for rule in rules if "record" in rule}
    for rule in rules:
        for selector in selectors(rule["expr"]):
            name = selector.name
            assert name in EXPORTED | recorded, f"{name} is neither exported nor recorded"
            matchers = {m.name: m.value for m in selector.matchers.matchers}
            # Always one deployment's series: never a query across tenants.
            assert matchers["tenant"] == "acme" and matchers["deployment"] == "assistant"
            if name.endswith("_bucket"):
                assert matchers["le"] in {le_label(b) for b in BOUNDS_MS} | {"+Inf"}


def test_error_ratios_are_recorded_over_sloths_windows_and_the_contracts() -> None:
    rules = check_rule_file(rules_document([_target()]))
    for objective in ("availability", "errors", "p95"):
        windows = [
            rule["labels"]["slo_window"]
            for rule in rules
            if rule.get("record", "").startswith("slo:sli_error:ratio_rate")
            and rule["labels"]["slo"] == objective
        ]
        assert windows == [*SLOTH_WINDOWS, "30d"], objective
        for rule in rules:
            if rule.get("record") == f"slo:sli_error:ratio_rate{windows[0]}":
                assert rule["record"].endswith(rule["labels"]["slo_window"])
    p95 = next(r for r in rules if r.get("record") == "slo:sli_error:ratio_rate1h"
               and r["labels"]["slo"] == "p95")  # fmt: skip
    [good, total] = selectors(p95["expr"])
    assert {m.name: m.value for m in good.matchers.matchers}["le"] == "0.5"  # 500 ms
    assert {m.name: m.value for m in total.matchers.matchers}["le"] == "+Inf"
    budget = next(r for r in rules if r.get("record") == "slo:error_budget:ratio"
                  and r["labels"]["slo"] == "errors")  # fmt: skip
    assert budget["expr"] == "vector(0.01)"  # error_rate max 0.01


def _pairs(expr: str) -> list[tuple[str, str, float]]:
    """(long window, short window, burn rate) of each `A and B` of a burn-rate alert."""
    out = []
    for part in expr.split(" or "):
        found = re.findall(r"slo:sli_error:ratio_rate(\w+)\{[^}]*\} > \(([0-9.]+) \* ", part)
        assert len(found) == 2 and found[0][1] == found[1][1], part
        out.append((found[0][0], found[1][0], float(found[0][1])))
    return out


def test_burn_rate_alerts_are_the_multiwindow_pairs() -> None:
    rules = check_rule_file(rules_document([_target()]))
    alerts = {
        (r["alert"], r["labels"]["severity"]): r
        for r in rules
        if "alert" in r and r["alert"].startswith("PortalSloBurnRate")
        and "availability" in r["expr"]
    }  # fmt: skip
    page = alerts[("PortalSloBurnRatePage", "page")]
    ticket = alerts[("PortalSloBurnRateTicket", "ticket")]
    assert _pairs(page["expr"]) == [("1h", "5m", 14.4), ("6h", "30m", 6.0)]
    assert _pairs(ticket["expr"]) == [("1d", "2h", 3.0), ("3d", "6h", 1.0)]
    assert page["labels"]["action"] == "rollback" and ticket["labels"]["action"] == "notify"
    assert "(14.4 * 0.001)" in page["expr"]  # availability target 0.999
    exhausted = [r for r in rules if r.get("alert") == "PortalSloErrorBudgetExhausted"]
    assert len(exhausted) == 3  # one per ratio objective
    [fast] = [r for r in rules if r.get("alert") == "PortalSloFastRule"]
    assert fast["labels"]["rule"] == "error-spike" and "[1m]" in fast["expr"]
    assert "> 0.1" in fast["expr"] and ">= 10" in fast["expr"]


def test_a_short_contract_window_keeps_the_alerts_that_fit() -> None:
    contract = parse_contract(MINIMAL.format(window="1d"))
    rules = check_rule_file(rules_document([RuleTarget("acme", "assistant", contract)]))
    [page] = [r for r in rules if r.get("alert") == "PortalSloBurnRatePage"]
    assert [p[:2] for p in _pairs(page["expr"])] == [("1h", "5m"), ("6h", "30m")]
    [ticket] = [r for r in rules if r.get("alert") == "PortalSloBurnRateTicket"]
    assert [p[:2] for p in _pairs(ticket["expr"])] == [("1d", "2h")]
    # the period (1d) is one of the recorded windows: no sum_over_time rule for it
    assert not any("sum_over_time" in r["expr"] for r in rules)
    assert {parse_duration(r["labels"]["slo_window"]) for r in rules if "slo_window"
            in r.get("labels", {})} == {300, 1800, 3600, 7200, 21600, 86400, 259200}  # fmt: skip


def test_several_deployments_make_one_file_with_distinct_groups() -> None:
    contract = parse_contract(FULL)
    targets = [
        RuleTarget("acme", "assistant", contract),
        RuleTarget("globex", "assistant", contract),
    ]
    rules = check_rule_file(rules_document(targets))
    tenants = {m.value for r in rules for s in selectors(r["expr"]) for m in s.matchers.matchers
               if m.name == "tenant"}  # fmt: skip
    assert tenants == {"acme", "globex"}


@pytest.mark.parametrize(
    ("tenant", "deployment", "field"),
    [
        ('ac"me', "assistant", "tenant"),
        ("acme", 'x"} or vector(1) #', "deployment"),
        ("acme", "Bad_Name", "deployment"),
        ("", "assistant", "tenant"),
    ],
)
def test_names_that_could_break_a_matcher_are_refused_naming_the_field(
    tenant: str, deployment: str, field: str
) -> None:
    with pytest.raises(RulesError) as caught:
        RuleTarget(tenant=tenant, deployment=deployment, contract=parse_contract(FULL))
    assert caught.value.field == field and field in str(caught.value)


# --- the routes -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_deployments_rules_route_is_tenant_scoped(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = Deployment.objects.get(tenant=world_a.tenant, name="assistant")
    url = f"/api/v1/deployments/{deployment.pk}/contract/rules/"
    assert world_a.client().get(url).status_code == 404  # no contract yet
    contract_set(tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
                 source=FULL)  # fmt: skip
    response = world_a.client("viewer").get(url)  # reading needs `read` only
    assert response.status_code == 200 and response["Content-Type"] == "application/yaml"
    rules = check_rule_file(yaml.safe_load(response.content))
    assert {g["name"].split(":")[1] for g in yaml.safe_load(response.content)["groups"]} >= {
        "acme.assistant.availability", "acme.assistant"}  # fmt: skip
    assert all('tenant="acme"' in r["expr"] for r in rules if "tenant=" in r["expr"])
    assert world_b.client().get(url).status_code == 404  # someone else's: as missing
    assert Client().get(url).status_code in (401, 403)


@pytest.mark.django_db
def test_the_platform_rules_cover_every_live_contract(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    for world in (world_a, world_b):
        deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
        contract_set(tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment,
                     source=MINIMAL.format(window="30d"))  # fmt: skip
    client = Client()
    with override_settings(METRICS_TOKEN=""):
        assert client.get("/metrics/rules").status_code == 404
    with override_settings(METRICS_TOKEN="s3cret-token"):
        assert client.get("/metrics/rules").status_code == 401
        response = client.get("/metrics/rules", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert response.status_code == 200
    groups = yaml.safe_load(response.content)["groups"]
    check_rule_file({"groups": groups})
    assert {g["name"] for g in groups} >= {
        f"portal-slo:{w.tenant.slug}.assistant.availability:{kind}"
        for w in (world_a, world_b)
        for kind in ("sli", "meta", "alerts")
    }
