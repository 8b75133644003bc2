"""The Grafana dashboard in docs/grafana matches what /metrics exports: every metric and label
its queries use is one `serving.metrics_views` emits, and every GPU and vLLM metric it emits
has a panel, so the dashboard and the exporter cannot drift apart. No database needed."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.telemetry import agent as gpu_agent
from serving.telemetry import metrics as metrics_views

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "grafana" / "portal-gpu.json"
DS_UID = "${datasource}"

METRIC = re.compile(r"DCGM_FI_[A-Z_]+|portal_[a-z_]+|vllm:[a-z_]+")
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>.*)\} \S+$")
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# metric{matchers}: the label names of each matcher
SELECTOR = re.compile(r"(DCGM_FI_[A-Z_]+|portal_[a-z_]+|vllm:[a-z_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(
    r"label_values\(\s*(?:(?P<metric>[^,{)]+)(?:\{[^}]*\})?\s*,)?\s*(?P<label>\w+)\s*\)"
)
VARIABLE = re.compile(r"\$\{?(\w+)")
# Grafana unit ids the panels may use (packages/grafana-data/src/valueFormats/categories.ts),
# plus custom "suffix:<text>" units.
UNITS = {"none", "short", "percent", "percentunit", "mbytes", "celsius", "watt", "hertz"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Each metric `/metrics` emits, with its label names, parsed from a rendered sample."""
    snapshot = {
        "node": "gpu-node-1",
        "simulated": True,
        "devices": [
            {
                "index": 0,
                "uuid": "GPU-0000",
                "name": "NVIDIA H200",
                "gpu_util": 50.0,
                "mem_util": 20.0,
                "mem_used": 8 << 30,
                "mem_free": 8 << 30,
                "mem_total": 16 << 30,
                "temperature_c": 60.0,
                "power_w": 300.0,
                "sm_clock_mhz": 1980.0,
                "xid_errors": None,
            }
        ],
        "processes": [
            {
                "pid": 4242,
                "device_index": 0,
                "device_uuid": "GPU-0000",
                "used_memory": 4 << 30,
                "tenant_id": 1,
                "tenant": "acme",
                "deployment_id": 2,
                "deployment": "chat",
                "group": "blue",
                "replica": "chat#abc",
            }
        ],
    }
    replica = {
        "app": "app-2",
        "version": "llama-tiny@1",
        "group": "blue",
        "replica": "chat#abc",
        "kv": {
            "num_blocks": 100,
            "free_blocks": 40,
            "running": 2,
            "waiting": 1,
            "tenants": {"1": {"prefix_queries": 10, "prefix_hits": 7, "preemptions": 1}},
        },
        "totals": {"tokens_in": 100, "tokens_out": 50},
    }
    owners = {
        "app-2": gpu_agent.Owner(tenant_id=1, tenant="acme", deployment_id=2, deployment="chat")
    }
    lines = metrics_views.gpu_lines([snapshot]) + metrics_views.engine_lines([replica], owners)
    out: dict[str, set[str]] = {}
    for line in lines:
        if line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, line
        names = {k for k, _ in LABEL_PAIR.findall(match["labels"])}
        out.setdefault(match["name"], set()).update(names)
    return out


def _declared() -> dict[str, str]:
    """The metric names the module's constants declare, as exposed (counters get `_total`)."""
    names = {name: "gauge" for name, *_ in metrics_views.DCGM}
    for name, kind, _ in metrics_views.VLLM:
        names[name + ("_total" if kind == "counter" else "")] = kind
    names["portal_gpu_process_fb_used_mib"] = "gauge"
    return names


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for _, target in _targets(dashboard)]


def _variable_queries(dashboard: dict[str, Any]) -> list[str]:
    out = []
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]
        out.append(query if isinstance(query, str) else query["query"])
        if var.get("definition"):
            out.append(var["definition"])
    return out


def test_identity_and_schema(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "aiops-portal-gpu"
    assert dashboard["title"] == "AI Ops Portal: GPUs and KV cache"
    assert dashboard["schemaVersion"] == 39
    assert dashboard["refresh"] == "5s"
    assert dashboard["time"] == {"from": "now-1h", "to": "now"}
    assert "/metrics" in dashboard["description"]
    assert "METRICS_TOKEN" in dashboard["description"]


def test_template_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "Hostname", "tenant", "deployment"}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("Hostname", "tenant", "deployment"):
        var = variables[name]
        assert var["type"] == "query", name
        assert var["multi"] and var["includeAll"], name
        assert var["datasource"]["uid"] == DS_UID, name
    # every $variable an expression or variable query uses is defined (or a Grafana built-in)
    for text in _exprs(dashboard) + _variable_queries(dashboard):
        for used in VARIABLE.findall(text):
            assert used in variables or used.startswith("__"), f"${used} in {text}"


def test_panels_are_well_formed(dashboard: dict[str, Any]) -> None:
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        title = panel["title"]
        assert panel["type"] in {"timeseries", "stat"}, title
        assert panel["datasource"] == {"type": "prometheus", "uid": DS_UID}, title
        unit = panel["fieldConfig"]["defaults"]["unit"]
        assert unit in UNITS or unit.startswith("suffix:"), f"{title}: unit {unit}"
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, title
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{title} overlaps another panel"
        cells |= mine
        assert panel["targets"], title
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), title
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DS_UID, title
            expr = target["expr"]
            assert expr.count("(") == expr.count(")"), expr
            assert expr.count("{") == expr.count("}"), expr
            assert expr.count("[") == expr.count("]"), expr
            assert expr.count('"') % 2 == 0, expr
    assert any(p["type"] == "stat" and "simulated" in p["targets"][0]["expr"] for p in panels)


def test_the_rendered_sample_covers_the_declared_metrics(exported: dict[str, set[str]]) -> None:
    assert set(exported) == set(_declared())


def test_every_metric_the_dashboard_names_is_exported(dashboard: dict[str, Any]) -> None:
    # panels (queries, titles, descriptions) and template variables alike
    text = json.dumps(dashboard["panels"]) + json.dumps(dashboard["templating"])
    unknown = set(METRIC.findall(text)) - set(_declared())
    assert not unknown, f"not exported by serving.metrics_views: {sorted(unknown)}"


def test_every_exported_metric_has_a_panel(dashboard: dict[str, Any]) -> None:
    used = {m for expr in _exprs(dashboard) for m in METRIC.findall(expr)}
    missing = set(_declared()) - used
    assert not missing, f"exported but on no panel: {sorted(missing)}"


def test_counters_are_rated_and_gauges_are_not(dashboard: dict[str, Any]) -> None:
    kinds = _declared()
    for expr in _exprs(dashboard):
        for match in METRIC.finditer(expr):
            rated = re.search(r"\b(?:rate|irate|increase)\(\s*$", expr[: match.start()])
            if kinds[match.group()] == "counter":
                assert rated, f"counter {match.group()} read without rate(): {expr}"
            else:
                assert not rated, f"gauge {match.group()} inside rate(): {expr}"


def test_labels_are_ones_the_exporter_emits(
    dashboard: dict[str, Any], exported: dict[str, set[str]]
) -> None:
    for expr in _exprs(dashboard) + _variable_queries(dashboard):
        metrics = set(METRIC.findall(expr))
        assert metrics, expr
        for metric, matchers in SELECTOR.findall(expr):
            for label in MATCHER.findall(matchers):
                assert label in exported[metric], f"{metric} has no label {label}: {expr}"
        # a grouping label must exist on every metric the expression combines
        common = set.intersection(*(exported[m] for m in metrics))
        for group in GROUPING.findall(expr):
            for label in filter(None, (s.strip() for s in group.split(","))):
                assert label in common, f"{label} is not on all of {sorted(metrics)}: {expr}"
        for match in LABEL_VALUES.finditer(expr):
            metric = (match["metric"] or "").strip()
            assert metric in exported, expr
            assert match["label"] in exported[metric], expr


def test_device_panels_fold_the_per_owner_repeats(dashboard: dict[str, Any]) -> None:
    """A device's DCGM series repeat per tenant/deployment on it: panels must aggregate them
    by device labels rather than plot (or sum) the raw series."""
    for _, target in _targets(dashboard):
        expr = target["expr"]
        if "DCGM_FI_" in expr:
            assert re.search(r"\b(?:max|count) by \(", expr), expr
