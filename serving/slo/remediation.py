"""Remediation chains of a contract (`spec.remediation`): the policy DSL of the self-healing
engine. A chain starts when a named alert of its deployment fires (a fast rule or an
objective), then runs its steps in order: actions (`scale_out`, `restart_replicas`, `shed_load`,
`switch_to_fallback`, `rollback`, `pause`, `notify`) and waits with a condition ("after 30 s, if
still breaching, roll back"; a condition that does not hold ends the chain).

Pure: the typed chains and the checks the JSON Schema cannot state. Bounded, because a tenant
writes them: at most MAX_CHAINS chains of MAX_STEPS steps, waits of MIN_WAIT to MAX_WAIT.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from serving.slo.errors import PathItem
from serving.slo.model import format_duration, parse_duration

MAX_CHAINS = 5
MAX_STEPS = 8
MIN_WAIT, MAX_WAIT = 10, 1800
RESTART_TIMEOUT = (10, 600)
DEFAULT_RESTART_TIMEOUT = 120
CONDITIONS: tuple[str, ...] = ("still_breaching", "recovered", "always")
# The parameters each action takes (anything else on its step is an error naming the field).
PARAMS: dict[str, tuple[str, ...]] = {
    "rollback": (),
    "pause": (),
    "notify": (),
    "scale_out": ("replicas", "max_replicas"),
    "restart_replicas": ("timeout",),
    "shed_load": ("canary_percent", "max_ongoing_requests", "max_tokens"),
    "switch_to_fallback": ("tier", "version"),
}
REMEDIATION_ACTIONS: tuple[str, ...] = tuple(PARAMS)
# Actions that act on live replicas over minutes: only ever a step of their own, never `then`.
LONG_ACTIONS: tuple[str, ...] = ("restart_replicas",)
_ALL_PARAMS = {p for params in PARAMS.values() for p in params}

Problem = tuple[tuple[PathItem, ...], str]


@dataclass(frozen=True)
class Action:
    action: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {"action": self.action, **self.params}
        if "timeout" in out:
            out["timeout"] = format_duration(int(out["timeout"]))
        return out


@dataclass(frozen=True)
class Step:
    """An action, or a wait: `wait` seconds, then `condition`; when it holds, `then` runs (if
    any) and the chain goes on, else the chain ends."""

    action: Action | None = None
    wait: int | None = None
    condition: str = "still_breaching"
    then: Action | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.action is not None:
            return self.action.to_dict()
        out: dict[str, Any] = {"wait": format_duration(self.wait or 0), "if": self.condition}
        if self.then is not None:
            out["then"] = self.then.to_dict()
        return out


@dataclass(frozen=True)
class Chain:
    name: str
    when_kind: str  # "fast" | "objective"
    when_name: str
    group: str | None  # None: either slot
    steps: tuple[Step, ...]

    def matches(self, *, alert_kind: str, alert_name: str, group: str) -> bool:
        kind_ok = (alert_kind == "fast") == (self.when_kind == "fast")
        return kind_ok and alert_name == self.when_name and self.group in (None, group)


def _action(data: Mapping[str, Any]) -> Action:
    params = {k: v for k, v in data.items() if k in _ALL_PARAMS}
    if "timeout" in params:
        params["timeout"] = parse_duration(str(params["timeout"]))
    return Action(action=str(data["action"]), params=params)


def step_from_dict(data: Mapping[str, Any]) -> Step:
    if "action" in data:
        return Step(action=_action(data))
    then = data.get("then")
    return Step(
        wait=parse_duration(str(data["wait"])),
        condition=str(data.get("if", "still_breaching")),
        then=None if then is None else _action(then),
    )


def chains_of(spec_remediation: Any) -> tuple[Chain, ...]:
    """The typed chains of a validated `spec.remediation` (a Contract's `remediation`)."""
    out = []
    for chain in spec_remediation or ():
        when = chain["when"]
        kind = "fast" if "fast" in when else "objective"
        out.append(
            Chain(
                name=str(chain["name"]),
                when_kind=kind,
                when_name=str(when[kind]),
                group=when.get("group"),
                steps=tuple(step_from_dict(s) for s in chain["steps"]),
            )
        )
    return tuple(out)


def single_action_chain(*, action: str, alert_kind: str, alert_name: str) -> Chain:
    """A contract alert that names a remediation action directly: a chain of that one step."""
    return Chain(
        name=f"{alert_name}-{action}"[:63],
        when_kind="fast" if alert_kind == "fast" else "objective",
        when_name=alert_name,
        group=None,
        steps=(Step(action=Action(action=action)),),
    )


# Validation (the document passed the schema: types, enums, sizes are known good).


def remediation_problems(spec: Mapping[str, Any]) -> list[Problem]:
    """What the schema cannot say about `spec.remediation`."""
    problems: list[Problem] = []
    chains = spec.get("remediation") or []
    fast = [str(r["name"]) for r in spec.get("fast") or []]
    objectives = [str(o["name"]) for o in spec.get("objectives") or []]
    seen: dict[str, int] = {}
    for index, chain in enumerate(chains):
        at: tuple[PathItem, ...] = ("spec", "remediation", index)
        name = chain["name"]
        if name in seen:
            message = f"duplicate name '{name}' (also remediation[{seen[name]}])"
            problems.append(((*at, "name"), message))
        seen.setdefault(name, index)
        problems += _when_problems(chain["when"], (*at, "when"), fast, objectives)
        for number, step in enumerate(chain["steps"]):
            problems += _step_problems(step, (*at, "steps", number))
    return problems


def _when_problems(
    when: Mapping[str, Any], at: tuple[PathItem, ...], fast: list[str], objectives: list[str]
) -> Iterator[Problem]:
    kinds = [k for k in ("fast", "objective") if k in when]
    if len(kinds) != 1:
        yield at, "must name exactly one alert: 'fast: <fast rule>' or 'objective: <objective>'"
        return
    kind = kinds[0]
    known = fast if kind == "fast" else objectives
    name = str(when[kind])
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        what = "fast rule" if kind == "fast" else "objective"
        yield (*at, kind), f"no {what} named '{name}'{hint}"


def _step_problems(step: Mapping[str, Any], at: tuple[PathItem, ...]) -> Iterator[Problem]:
    if ("action" in step) == ("wait" in step):
        yield at, "a step is either an action ('action: ...') or a wait ('wait: 30s')"
        return
    if "action" in step:
        for name in ("if", "then"):
            if name in step:
                yield (*at, name), f"'{name}' belongs to a wait step, not an action"
        yield from _action_problems(step, at)
        return
    for name in sorted(_ALL_PARAMS & set(step)):
        yield (*at, name), f"'{name}' belongs to an action, not a wait step"
    seconds = parse_duration(step["wait"])
    if not MIN_WAIT <= seconds <= MAX_WAIT:
        message = f"must be between {MIN_WAIT}s and {MAX_WAIT // 60}m (got {step['wait']})"
        yield (*at, "wait"), message
    then = step.get("then")
    if then is not None:
        for name in ("wait", "if", "then"):
            if name in then:
                yield (*at, "then", name), f"'{name}' does not belong in 'then' (one action)"
        if "action" not in then:
            yield (*at, "then", "action"), "'action' is required"
        elif then["action"] in LONG_ACTIONS:
            # It outlives the step's transaction (serving.ops.remediation runs it as a step of
            # its own): a wait that holds goes on to the next step, so put it there.
            message = f"'{then['action']}' cannot be a wait's 'then': make it the next step"
            yield (*at, "then", "action"), message
        else:
            yield from _action_problems(then, (*at, "then"))


def _action_problems(step: Mapping[str, Any], at: tuple[PathItem, ...]) -> Iterator[Problem]:
    action = str(step["action"])
    takes = PARAMS[action]
    for name in sorted((_ALL_PARAMS & set(step)) - set(takes)):
        hint = f"; it takes {', '.join(takes)}" if takes else "; it takes no parameters"
        yield (*at, name), f"'{name}' does not apply to action '{action}'{hint}"
    if action == "shed_load" and not set(takes) & set(step):
        yield at, f"shed_load needs at least one of {', '.join(takes)}"
    if action == "switch_to_fallback" and {"tier", "version"} <= set(step):
        yield (*at, "version"), "give a tier or a version, not both"
    if "timeout" in step:
        seconds = parse_duration(step["timeout"])
        low, high = RESTART_TIMEOUT
        if not low <= seconds <= high:
            message = f"must be between {low}s and {high // 60}m (got {step['timeout']})"
            yield (*at, "timeout"), message
    if "max_replicas" in step and "replicas" in step and step["max_replicas"] < step["replicas"]:
        yield (*at, "max_replicas"), "must be >= replicas"
