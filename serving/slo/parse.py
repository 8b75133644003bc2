"""Parse and validate an SLA contract document, with errors that name the line and the field.

Three passes: YAML (syntax, size, duplicate keys), the JSON Schema in schema.json (every error
at once, reworded for people), then the rules the schema cannot state (ranges of durations,
window ordering, histogram bounds, names that must exist or be unique).
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from serving.dataplane.sli import BOUNDS_MS
from serving.slo.errors import ContractError, FieldError, PathItem, format_path, sort_errors
from serving.slo.model import (
    ALL_SLIS,
    QUANTILES,
    RATIO_SLIS,
    Contract,
    format_duration,
    parse_duration,
)
from serving.slo.remediation import remediation_problems
from serving.slo.signals import FRACTION_SLIS, SERIES_WINDOW, SIGNAL_SLIS
from serving.slo.source import compose, line_of

__all__ = ["ContractError", "FieldError", "parse_contract", "schema", "validate_document"]

SCHEMA_PATH = Path(__file__).with_name("schema.json")

MINUTE, HOUR, DAY = 60, 3600, 86400
BUDGET_WINDOW = (HOUR, 90 * DAY)
GAUGE_WINDOW = (15, DAY)
FAST_FOR = (5, 10 * MINUTE)
ALERT_MIN_LONG, ALERT_MIN_SHORT = 5 * MINUTE, MINUTE

_TAKES = {
    "availability": "target",
    "error_rate": "max (the highest error ratio)",
    **{sli: "threshold_ms and an optional target" for sli in QUANTILES},
    "tokens_per_s": "min and an optional window",
    "drift_psi": "feature, max and reference",
    "feature_freshness": "feature and max_age",
    **{
        sli: f"{d}{' and reason' if sli == 'errors_by_reason' else ''}"
        + (" and an optional window" if windowed else "")
        for sli, (d, _, windowed) in SIGNAL_SLIS.items()
    },
}
_TYPE_NAMES = {
    "number": "a number",
    "integer": "a whole number",
    "string": "a string",
    "array": "a list",
    "object": "a mapping",
}
_BOUND_WORDS = {
    "exclusiveMinimum": ">",
    "minimum": ">=",
    "exclusiveMaximum": "<",
    "maximum": "<=",
}

Problem = tuple[tuple[PathItem, ...], str]


@cache
def schema() -> dict[str, Any]:
    """The contract's JSON Schema (draft 2020-12), as shipped in schema.json."""
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return loaded


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def parse_contract(text: str) -> Contract:
    """A Contract from YAML text; raises ContractError listing every problem found."""
    documents = compose(text)
    if not documents:
        raise ContractError([FieldError(None, "", "the document is empty")])
    root, data = documents[0]
    if not isinstance(data, dict):
        message = "the document must be a mapping with apiVersion, kind, metadata and spec"
        raise ContractError([FieldError(line_of(root, ()), "", message)])
    errors = validate_document(data, root)
    if errors:
        raise ContractError(errors)
    return Contract.from_dict(data)


def validate_document(data: Any, root: yaml.Node | None = None) -> list[FieldError]:
    """Every problem of a contract document (parsed data), sorted by line; [] when valid.

    `root` is the composed YAML node of the document, used to find lines; without it lines
    are None.
    """
    problems = [p for e in _validator().iter_errors(data) for p in _reword(e, data)]
    if not problems:
        problems = _semantics(data)
    errors = (FieldError(line_of(root, path), format_path(path), msg) for path, msg in problems)
    return sort_errors(errors)


def _at(data: Any, path: Sequence[PathItem]) -> Any:
    for item in path:
        data = data[item]
    return data


def _reword(error: jsonschema.ValidationError, data: Any) -> Iterator[Problem]:
    path = tuple(error.absolute_path)
    keyword, value, instance = error.validator, error.validator_value, error.instance
    sub = error.schema if isinstance(error.schema, dict) else {}
    if keyword == "additionalProperties":
        known = list(sub.get("properties", {}))
        for name in instance:
            if name not in known:
                close = difflib.get_close_matches(str(name), known, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                yield (*path, str(name)), f"unknown field '{name}'{hint}"
    elif keyword == "required":
        sli = instance.get("sli") if "then" in error.schema_path else None
        for name in value:
            if name not in instance:
                extra = f" for sli '{sli}'" if isinstance(sli, str) else ""
                yield (*path, name), f"'{name}' is required{extra}"
    elif keyword == "not":
        parent = _at(data, path[:-1])
        sli = parent.get("sli") if isinstance(parent, dict) else None
        takes = _TAKES.get(str(sli))
        hint = f"; sli '{sli}' takes {takes}" if takes else ""
        yield path, f"'{path[-1]}' does not apply to sli '{sli}'{hint}"
    elif keyword == "enum" and path and path[-1] == "sli":
        expected = ", ".join(value)
        if instance in ALL_SLIS:
            yield path, f"SLI '{instance}' cannot be used here; expected one of {expected}"
        else:
            yield path, f"unknown SLI '{instance}'; expected one of {expected}"
    elif keyword == "enum":
        yield path, f"must be one of {', '.join(map(str, value))} (got {instance!r})"
    elif keyword == "const":
        yield path, f"must be '{value}' (got {instance!r})"
    elif keyword == "pattern" or (keyword == "type" and "x-pattern-message" in sub):
        yield path, str(sub.get("x-pattern-message", f"must match {value}"))
    elif keyword == "type":
        yield path, f"must be {_TYPE_NAMES.get(str(value), value)} (got {instance!r})"
    elif keyword in _BOUND_WORDS:
        yield path, f"must be {_BOUND_WORDS[str(keyword)]} {value}"
    elif keyword == "minItems":
        yield path, f"must have at least {value} item{'s' if value != 1 else ''}"
    elif keyword == "maxItems":
        yield path, f"must have at most {value} items"
    elif keyword == "minLength":
        yield path, "must not be empty"
    elif keyword == "maxLength":
        yield path, f"must be at most {value} characters"
    elif keyword == "uniqueItems":
        yield path, "must not repeat items"
    else:
        yield path, error.message


def _semantics(data: Mapping[str, Any]) -> list[Problem]:
    """The rules the schema cannot state; `data` already passed the schema."""
    problems = list(_non_finite(data, ()))
    spec = data["spec"]
    window = parse_duration(spec["window"])
    if not BUDGET_WINDOW[0] <= window <= BUDGET_WINDOW[1]:
        problems.append((("spec", "window"), _range_message(spec["window"], *BUDGET_WINDOW)))
        window = 0  # don't blame every alert for a window that is itself wrong
    problems += _objective_problems(spec["objectives"])
    problems += _fast_problems(spec.get("fast", []))
    problems += _alert_problems(spec.get("alerts"), window, spec["window"])
    problems += _gate_problems(spec.get("gate"), spec["objectives"])
    problems += remediation_problems(spec)
    return problems


def _non_finite(data: Any, path: tuple[PathItem, ...]) -> Iterator[Problem]:
    if isinstance(data, float) and not math.isfinite(data):
        yield path, "must be a finite number"
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from _non_finite(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _non_finite(value, (*path, index))


def _range_message(text: str, low: int, high: int) -> str:
    return f"must be between {format_duration(low)} and {format_duration(high)} (got {text})"


def _duplicates(items: list[dict[str, Any]], where: str) -> Iterator[Problem]:
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        name = item["name"]
        if name in first:
            message = f"duplicate name '{name}' (also {where}[{first[name]}])"
            yield ("spec", where, index, "name"), message
        else:
            first[name] = index


def _objective_problems(objectives: list[dict[str, Any]]) -> list[Problem]:
    problems = list(_duplicates(objectives, "objectives"))
    bounds = ", ".join(map(str, BOUNDS_MS))
    for index, objective in enumerate(objectives):
        at = ("spec", "objectives", index)
        threshold = objective.get("threshold_ms")
        if threshold is not None and threshold not in BOUNDS_MS:
            message = f"{threshold} ms is not a histogram bound; use one of {bounds}"
            problems.append(((*at, "threshold_ms"), message))
        if "window" in objective:
            seconds = parse_duration(objective["window"])
            span = SERIES_WINDOW if objective["sli"] in SIGNAL_SLIS else GAUGE_WINDOW
            if not span[0] <= seconds <= span[1]:
                message = _range_message(objective["window"], *span)
                problems.append(((*at, "window"), message))
        for bound in ("max", "min"):
            if objective["sli"] in FRACTION_SLIS and objective.get(bound, 0) > 1:
                message = f"must be at most 1 for sli '{objective['sli']}' (a fraction)"
                problems.append(((*at, bound), message))
        if "max_age" in objective and parse_duration(objective["max_age"]) < 1:
            problems.append(((*at, "max_age"), "must be at least 1s"))
        reference = objective.get("reference")
        if reference is not None:
            problems += _reference_problems(reference, (*at, "reference"))
    return problems


def _reference_problems(reference: dict[str, Any], at: tuple[PathItem, ...]) -> list[Problem]:
    edges, counts = reference["edges"], reference["counts"]
    problems: list[Problem] = []
    if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        problems.append(((*at, "edges"), "must be strictly increasing"))
    if len(counts) != len(edges) - 1:
        message = (
            f"has {len(counts)} counts for {len(edges)} edges; "
            f"needs one count per bin ({len(edges) - 1})"
        )
        problems.append(((*at, "counts"), message))
    elif sum(counts) <= 0:
        problems.append(((*at, "counts"), "must not all be zero"))
    return problems


def _fast_problems(rules: list[dict[str, Any]]) -> list[Problem]:
    problems = list(_duplicates(rules, "fast"))
    for index, rule in enumerate(rules):
        seconds = parse_duration(rule["for"])
        if not FAST_FOR[0] <= seconds <= FAST_FOR[1]:
            problems.append(
                (("spec", "fast", index, "for"), _range_message(rule["for"], *FAST_FOR))
            )
    return problems


def _alert_problems(
    alerts: list[dict[str, Any]] | None, window: int, window_text: str
) -> list[Problem]:
    problems: list[Problem] = []
    for index, alert in enumerate(alerts or []):
        at = ("spec", "alerts", index)
        long, short = parse_duration(alert["long"]), parse_duration(alert["short"])
        if long < ALERT_MIN_LONG:
            problems.append(((*at, "long"), f"must be at least {format_duration(ALERT_MIN_LONG)}"))
        elif window and long > window:
            message = f"must not be longer than the budget window ({window_text})"
            problems.append(((*at, "long"), message))
        if short < ALERT_MIN_SHORT:
            message = f"must be at least {format_duration(ALERT_MIN_SHORT)}"
            problems.append(((*at, "short"), message))
        elif short >= long:
            problems.append(((*at, "short"), f"must be shorter than long ({alert['long']})"))
    return problems


def _gate_problems(gate: dict[str, Any] | None, objectives: list[dict[str, Any]]) -> list[Problem]:
    if gate is None:
        return []
    kinds = {o["name"]: o["sli"] in RATIO_SLIS for o in objectives}
    problems: list[Problem] = []
    for index, name in enumerate(gate.get("objectives", [])):
        at = ("spec", "gate", "objectives", index)
        if name not in kinds:
            close = difflib.get_close_matches(name, list(kinds), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            problems.append((at, f"no objective named '{name}'{hint}"))
        elif not kinds[name]:
            message = f"'{name}' is a gauge objective; only ratio objectives can gate a canary"
            problems.append((at, message))
    if gate.get("mode", "off") != "off" and "objectives" not in gate and not any(kinds.values()):
        problems.append((("spec", "gate", "mode"), "needs at least one ratio objective to gate"))
    return problems
