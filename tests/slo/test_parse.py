"""Parsing SLA contracts: a full document, and bad ones whose errors name the exact line and field."""

from __future__ import annotations

import json

import jsonschema
import pytest

from serving.slo.errors import ContractError, FieldError
from serving.slo.model import DEFAULT_ALERTS, AlertRule, Contract, format_duration, parse_duration
from serving.slo.parse import parse_contract, schema, validate_document
from serving.slo.source import compose
from tests.slo.contracts import FULL, MINIMAL


def errors_of(text: str) -> list[FieldError]:
    with pytest.raises(ContractError) as caught:
        parse_contract(text)
    return caught.value.errors


def edit(old: str, new: str, text: str = FULL) -> str:
    assert text.count(old) == 1, f"edit target {old!r} must occur once"
    return text.replace(old, new)


def test_full_contract_parses() -> None:
    contract = parse_contract(FULL)

    assert contract.name == "chat-sla"
    assert contract.description == "chat completions for the support bot"
    assert contract.window == 30 * 86400
    names = ["availability", "errors", "p95", "throughput", "prompt-drift", "profile-fresh"]
    assert [o.name for o in contract.objectives] == names
    errors = contract.objective("errors")
    assert (errors.max, errors.target) == (0.01, 0.99)  # error_rate max 0.01 == target 0.99
    p95 = contract.objective("p95")
    assert (p95.threshold_ms, p95.target, p95.kind) == (500, 0.95, "ratio")
    throughput = contract.objective("throughput")
    assert (throughput.min, throughput.window, throughput.kind) == (20, 300, "gauge")
    drift = contract.objective("prompt-drift")
    assert drift.reference is not None and drift.reference.counts == (10, 40, 40, 10)
    assert contract.objective("profile-fresh").max_age == 900
    (rule,) = contract.fast
    assert (rule.for_seconds, rule.above, rule.action, rule.min_requests) == (
        15,
        0.1,
        "rollback",
        10,
    )
    assert contract.alerts[0] == AlertRule("page", 14.4, 3600, 300, "rollback")
    assert contract.gate.mode == "block"
    assert [o.name for o in contract.gated_objectives] == ["availability", "p95"]
    assert contract.window_lengths() == [15, 300, 1800, 3600, 7200, 21600, 86400, 259200, 2592000]


def test_to_dict_round_trips_and_is_a_valid_json_document() -> None:
    contract = parse_contract(FULL)
    stored = json.loads(json.dumps(contract.to_dict()))

    assert Contract.from_dict(stored) == contract
    assert validate_document(stored) == []


def test_defaults() -> None:
    text = edit("      target: 0.95\n", "", FULL)  # p95 target defaults to the quantile
    text = edit("      window: 5m\n", "", text)  # gauge window defaults to 5m
    text = edit("    mode: block\n", "", text)
    contract = parse_contract(text)

    assert contract.objective("p95").target == 0.95
    assert contract.objective("throughput").window == 300
    assert contract.gate.mode == "off"
    assert parse_contract(MINIMAL.format(window="30d")).alerts == DEFAULT_ALERTS
    # A 1-day budget keeps only the default alerts whose long window fits in it.
    one_day = parse_contract(MINIMAL.format(window="1d"))
    assert [a.long for a in one_day.alerts] == [3600, 21600, 86400]


def test_yaml_1_1_words_stay_strings() -> None:
    # `off` is a boolean in YAML 1.1; the gate must still read it as the mode "off".
    contract = parse_contract(edit("mode: block", "mode: off"))
    assert contract.gate.mode == "off"


# (document, [(line, field, a part of the message)]), one case a line.
# fmt: off
BAD_CONTRACTS = [
    pytest.param(edit("      sli: error_rate\n      max", "      sli: error_rate: oops\n      max"), [(13, "", "invalid YAML: mapping values are not allowed here")], id="yaml-syntax"),
    pytest.param(edit("sli: latency_p95", "sli: latency_p42"), [(16, "spec.objectives[2].sli", "unknown SLI 'latency_p42'; expected one of availability, error_rate")], id="unknown-sli"),
    pytest.param(edit("target: 0.999", "target: -0.5"), [(11, "spec.objectives[0].target", "must be > 0")], id="negative-target"),
    pytest.param(edit("target: 0.999", "target: 1.5"), [(11, "spec.objectives[0].target", "must be < 1")], id="target-above-one"),
    pytest.param(edit("window: 30d", "window: 10m"), [(7, "spec.window", "must be between 1h and 90d (got 10m)")], id="window-too-short"),
    pytest.param(edit("window: 30d", "window: 2d"), [(44, "spec.alerts[3].long", "must not be longer than the budget window (2d)")], id="alert-longer-than-window"),
    pytest.param(edit("long: 1h, short: 5m", "long: 1h, short: 2h"), [(41, "spec.alerts[0].short", "must be shorter than long (1h)")], id="short-not-shorter"),
    pytest.param(edit("window: 30d", "window: 30"), [(7, "spec.window", "must be a duration")], id="window-not-a-duration"),
    pytest.param(edit("      target: 0.999\n", "      target: 0.999\n      targte: 0.9\n"), [(12, "spec.objectives[0].targte", "unknown field 'targte'; did you mean 'target'?")], id="unknown-field"),
    pytest.param(edit("  window: 30d\n", ""), [(6, "spec.window", "'window' is required")], id="missing-window"),
    pytest.param(edit("      sli: availability\n", ""), [(9, "spec.objectives[0].sli", "'sli' is required")], id="missing-sli"),
    pytest.param(edit("max: 0.01", "target: 0.99"), [(12, "spec.objectives[1].max", "'max' is required for sli 'error_rate'"), (14, "spec.objectives[1].target", "'target' does not apply to sli 'error_rate'")], id="field-of-another-sli"),
    pytest.param(edit("- name: errors", "- name: availability"), [(12, "spec.objectives[1].name", "duplicate name 'availability' (also objectives[0])")], id="duplicate-objective"),
    pytest.param(edit("      target: 0.999\n", "      target: 0.999\n      target: 0.99\n"), [(12, "spec.objectives[0].target", "duplicate key 'target' (first at line 11)")], id="duplicate-key"),
    pytest.param(edit("threshold_ms: 500", "threshold_ms: 400"), [(17, "spec.objectives[2].threshold_ms", "400 ms is not a histogram bound; use one of 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000")], id="threshold-not-a-bound"),
    pytest.param(edit("[availability, p95]", "[availability, p99]"), [(47, "spec.gate.objectives[1]", "no objective named 'p99'")], id="gate-missing-objective"),
    pytest.param(edit("[availability, p95]", "[availability, throughput]"), [(47, "spec.gate.objectives[1]", "'throughput' is a gauge objective")], id="gate-gauge-objective"),
    pytest.param(edit("counts: [10, 40, 40, 10]", "counts: [10, 40, 40]"), [(27, "spec.objectives[4].reference.counts", "has 3 counts for 5 edges; needs one count per bin (4)")], id="reference-shape"),
    pytest.param(edit("edges: [0, 16, 64,", "edges: [0, 64, 16,"), [(27, "spec.objectives[4].reference.edges", "must be strictly increasing")], id="reference-edges"),
    pytest.param(edit("for: 15s", "for: 1h"), [(36, "spec.fast[0].for", "must be between 5s and 10m (got 1h)")], id="fast-for-range"),
    pytest.param(edit("above: 0.1", "above: 1.5"), [(35, "spec.fast[0].above", "must be < 1")], id="fast-above-ratio"),
    pytest.param(edit("      sli: error_rate\n      above", "      sli: latency_p95\n      above"), [(33, "spec.fast[0].above_ms", "'above_ms' is required for sli 'latency_p95'"), (35, "spec.fast[0].above", "'above' does not apply to sli 'latency_p95'")], id="fast-latency-needs-above-ms"),
    pytest.param(edit("      sli: error_rate\n      above", "      sli: availability\n      above"), [(34, "spec.fast[0].sli", "SLI 'availability' cannot be used here")], id="fast-sli"),
    pytest.param(edit("short: 5m,  action: rollback}", "short: 5m,  action: explode}"), [(41, "spec.alerts[0].action", "must be one of rollback, pause, notify, scale_out, restart_replicas, shed_load, switch_to_fallback (got 'explode')")], id="alert-action"),
    pytest.param(edit("name: chat-sla", "name: Chat_SLA"), [(4, "metadata.name", "must be a DNS label")], id="name-not-dns"),
    pytest.param(edit("apiVersion: aiops.portal/v1", "apiVersion: v2"), [(1, "apiVersion", "must be 'aiops.portal/v1'")], id="api-version"),
    pytest.param(edit("burn_rate: 14.4", "burn_rate: .inf"), [(41, "spec.alerts[0].burn_rate", "must be a finite number")], id="infinite-number"),
    pytest.param("- just\n- a list\n", [(1, "", "the document must be a mapping")], id="not-a-mapping"),
    pytest.param("", [(None, "", "the document is empty")], id="empty"),
    pytest.param(FULL + "#" * 70_000, [(None, "", "the limit is 65536 (64 KiB)")], id="too-large"),
]
# fmt: on


@pytest.mark.parametrize(("text", "expected"), BAD_CONTRACTS)
def test_bad_contract_names_line_and_field(
    text: str, expected: list[tuple[int | None, str, str]]
) -> None:
    errors = errors_of(text)

    assert [(e.line, e.field) for e in errors] == [(line, field) for line, field, _ in expected]
    for error, (_, _, message) in zip(errors, expected, strict=True):
        assert message in error.message


def test_all_schema_errors_are_reported_at_once_sorted_by_line() -> None:
    text = edit("target: 0.999", "target: 2")
    text = edit("sli: latency_p95", "sli: latency_p42", text)
    text = edit("  window: 30d\n", "  windw: 30d\n", text)

    errors = errors_of(text)

    assert [(e.line, e.field) for e in errors] == [
        (6, "spec.window"),
        (7, "spec.windw"),
        (11, "spec.objectives[0].target"),
        (16, "spec.objectives[2].sli"),
    ]


def test_contract_error_message_joins_line_field_message() -> None:
    with pytest.raises(ContractError) as caught:
        parse_contract(edit("target: 0.999", "target: 1.5"))
    assert str(caught.value) == "line 11: spec.objectives[0].target: must be < 1"


def test_alias_bomb_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    (error,) = errors_of("\n".join(lines) + "\n")
    assert "too large or too deeply nested" in error.message


@pytest.mark.parametrize("many", [False, True])  # a contract; an OpenSLO import
def test_control_characters_are_a_contract_error(many: bool) -> None:
    """Found by the schema fuzzer: YAML's reader refuses them before parsing starts, and that
    ReaderError escaped as a 500 from PUT .../contract/ and POST .../contract/openslo/."""
    with pytest.raises(ContractError) as caught:
        compose("apiVersion: v1\nkind: \x11", many=many)
    (error,) = caught.value.errors
    assert error.line == 2
    assert error.message == "invalid YAML: character #x0011: special characters are not allowed"


def test_schema_is_valid_and_closed() -> None:
    document = schema()
    jsonschema.Draft202012Validator.check_schema(document)

    def objects(node: object) -> list[dict[str, object]]:
        if isinstance(node, dict):
            found = [node] if "properties" in node and node.get("type") == "object" else []
            return found + [o for value in node.values() for o in objects(value)]
        if isinstance(node, list):
            return [o for value in node for o in objects(value)]
        return []

    closed = objects(document)
    assert len(closed) >= 8
    assert all(o.get("additionalProperties") is False for o in closed)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15), ("5m", 300), ("1h", 3600), ("36h", 129600), ("30d", 2592000), ("90s", 90)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["5", "5 m", "-5m", "1.5h", "5w", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)
