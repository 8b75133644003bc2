"""The remediation DSL of a contract (spec.remediation): what parses, how it reads back, and
the errors that name the line and the field."""

from __future__ import annotations

import pytest
import yaml

from serving.slo.parse import ContractError, parse_contract
from serving.slo.remediation import chains_of, step_from_dict

BASE = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: chat-sla
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
  fast:
    - name: error-spike
      sli: error_rate
      above: 0.1
      for: 15s
      action: notify
  remediation:
"""
GOOD = """\
    - name: heal
      when: {fast: error-spike, group: canary}
      steps:
        - {action: scale_out, replicas: 2, max_replicas: 6}
        - {wait: 30s, if: still_breaching, then: {action: rollback}}
        - {action: restart_replicas, timeout: 2m}
        - {action: shed_load, canary_percent: 5, max_tokens: 128}
        - {action: switch_to_fallback, tier: distilled}
    - name: budget
      when: {objective: availability}
      steps:
        - {wait: 1m}
        - {action: switch_to_fallback, version: 7}
"""


def test_a_chain_parses_to_typed_steps_and_reads_back_the_same() -> None:
    contract = parse_contract(BASE + GOOD)
    heal, budget = chains_of(contract.remediation)
    assert (heal.when_kind, heal.when_name, heal.group) == ("fast", "error-spike", "canary")
    kinds = [s.action.action if s.action else "wait" for s in heal.steps]
    assert kinds == ["scale_out", "wait", "restart_replicas", "shed_load", "switch_to_fallback"]
    assert heal.steps[0].action.params == {"replicas": 2, "max_replicas": 6}
    wait = heal.steps[1]
    assert (wait.wait, wait.condition, wait.then.action) == (30, "still_breaching", "rollback")
    assert heal.steps[2].action.params == {"timeout": 120}
    assert budget.steps[0].condition == "still_breaching"  # the default condition
    assert heal.matches(alert_kind="fast", alert_name="error-spike", group="canary")
    assert not heal.matches(alert_kind="fast", alert_name="error-spike", group="stable")
    assert budget.matches(alert_kind="burn", alert_name="availability", group="stable")
    assert not budget.matches(alert_kind="fast", alert_name="availability", group="stable")
    again = parse_contract(yaml.safe_dump(contract.to_dict()))
    assert again == contract
    # A run stores its steps as written back by the typed chain: they read back the same.
    for step in heal.steps + budget.steps:
        assert step_from_dict(step.to_dict()) == step


def test_a_fast_rule_or_alert_may_name_a_remediation_action() -> None:
    source = BASE.replace("action: notify", "action: restart_replicas").replace(
        "  remediation:\n", "  alerts:\n    - {severity: page, burn_rate: 14.4, long: 1h, "
        "short: 5m, action: scale_out}\n",
    )  # fmt: skip
    contract = parse_contract(source)
    assert contract.fast[0].action == "restart_replicas"
    assert contract.alerts[0].action == "scale_out"


def _errors(steps: str) -> list[str]:
    with pytest.raises(ContractError) as caught:
        parse_contract(BASE + steps)
    return [str(e) for e in caught.value.errors]


@pytest.mark.parametrize(
    ("chain", "expected"),
    [
        (
            "    - {name: a, when: {fast: error-spik}, steps: [{action: notify}]}\n",
            "line 18: spec.remediation[0].when.fast: no fast rule named 'error-spik'; "
            "did you mean 'error-spike'?",
        ),
        (
            "    - {name: a, when: {}, steps: [{action: notify}]}\n",
            "line 18: spec.remediation[0].when: must name exactly one alert",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{wait: 2s}]}\n",
            "line 18: spec.remediation[0].steps[0].wait: must be between 10s and 30m (got 2s)",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{action: rollback, "
            "replicas: 2}]}\n",
            "line 18: spec.remediation[0].steps[0].replicas: 'replicas' does not apply to "
            "action 'rollback'; it takes no parameters",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{action: scale_out, "
            "replicas: 9}]}\n",
            "line 18: spec.remediation[0].steps[0].replicas: must be <= 4",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{action: explode}]}\n",
            "line 18: spec.remediation[0].steps[0].action: must be one of rollback, pause, "
            "notify, scale_out, restart_replicas, shed_load, switch_to_fallback",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{action: notify, "
            "wait: 30s}]}\n",
            "line 18: spec.remediation[0].steps[0]: a step is either an action",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{action: shed_load}]}\n",
            "line 18: spec.remediation[0].steps[0]: shed_load needs at least one of",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{action: "
            "switch_to_fallback, tier: proxy, version: 3}]}\n",
            "line 18: spec.remediation[0].steps[0].version: give a tier or a version",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{wait: 30s, then: "
            "{wait: 30s, action: rollback}}]}\n",
            "line 18: spec.remediation[0].steps[0].then.wait: 'wait' does not belong in 'then'",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{action: "
            "restart_replicas, timeout: 1h}]}\n",
            "line 18: spec.remediation[0].steps[0].timeout: must be between 10s and 10m",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{wait: 30s, then: "
            "{action: restart_replicas}}]}\n",
            "line 18: spec.remediation[0].steps[0].then.action: 'restart_replicas' cannot be "
            "a wait's 'then'",
        ),
        (
            "    - {name: a, when: {objective: availability}, steps: [{action: notify}]}\n"
            "    - {name: a, when: {objective: availability}, steps: [{action: notify}]}\n",
            "line 19: spec.remediation[1].name: duplicate name 'a' (also remediation[0])",
        ),
    ],
)
def test_bad_chains_name_the_line_and_field(chain: str, expected: str) -> None:
    errors = _errors(chain)
    assert any(e.startswith(expected) for e in errors), errors


def test_a_tenant_cannot_write_more_than_the_bounds() -> None:
    step = "{action: notify}"
    many_steps = (
        f"    - {{name: a, when: {{objective: availability}}, steps: [{', '.join([step] * 9)}]}}\n"
    )
    assert any(
        "spec.remediation[0].steps: must have at most 8 items" in e for e in _errors(many_steps)
    )
    chains = "".join(
        f"    - {{name: c{i}, when: {{objective: availability}}, steps: [{step}]}}\n"
        for i in range(6)
    )
    assert any("spec.remediation: must have at most 5 items" in e for e in _errors(chains))
