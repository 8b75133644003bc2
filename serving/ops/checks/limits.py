"""The bounds of a version check request, and its checking: every field a tenant sends is
bounded here (ValidationFailed names the field), before a row exists or a worker is asked."""

from __future__ import annotations

import math
from typing import Any

from portal.exceptions import ValidationFailed
from serving.registry.golden import DEFAULT_PROMPTS

MAX_CONCURRENCY = 8
MAX_LEVELS = 4
MAX_REQUESTS = 64  # per concurrency level
MAX_TOKENS = 32
MAX_DURATION_S = 60  # per concurrency level
MAX_PROMPTS = 16
MAX_PROMPT_CHARS = 500
MAX_DRIFT_VALUES = 5000
MAX_ACTIVE_PER_TENANT = 2
CHECKS_PER_HOUR = 20  # per tenant (a token bucket: burst of this many, refilled over an hour)
DEFAULT_BENCHMARK_LEVELS = [1, 4, 8]
GATE_ACTIONS = ("block", "review")

_INTS = {
    "concurrency": (1, MAX_CONCURRENCY, 4),
    "requests": (1, MAX_REQUESTS, 32),
    "max_tokens": (1, MAX_TOKENS, 16),
    "duration_s": (1, MAX_DURATION_S, 30),
}
_KNOWN = {"verify": {*_INTS, "prompts", "gates", "drift_sample", "deployment_id"}}
_KNOWN["benchmark"] = {"concurrencies", "requests", "max_tokens", "duration_s", "prompts"}


def _int(raw: dict[str, Any], name: str) -> int:
    low, high, default = _INTS[name]
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationFailed(f"Give a whole number from {low} to {high}.", field=name)
    return value


def _prompts(raw: Any) -> list[str]:
    if raw is None:
        return list(DEFAULT_PROMPTS)
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_PROMPTS:
        raise ValidationFailed(f"Give a list of 1 to {MAX_PROMPTS} prompts.", field="prompts")
    for index, prompt in enumerate(raw):
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
            raise ValidationFailed(
                f"Give a non-empty string of at most {MAX_PROMPT_CHARS} characters.",
                field=f"prompts[{index}]",
            )
    return list(raw)


def _gates(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > 50:
        raise ValidationFailed("Give an object: objective name -> block or review.", field="gates")
    for name, action in raw.items():
        if not isinstance(name, str) or len(name) > 100 or action not in GATE_ACTIONS:
            raise ValidationFailed("Give block or review.", field=f"gates.{str(name)[:100]}")
    return dict(raw)


def _drift(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"feature", "values"}:
        raise ValidationFailed("Give {feature, values}.", field="drift_sample")
    feature, values = raw["feature"], raw["values"]
    if not isinstance(feature, str) or not 1 <= len(feature) <= 100:
        raise ValidationFailed("Give the feature's name.", field="drift_sample.feature")
    if not isinstance(values, list) or not 1 <= len(values) <= MAX_DRIFT_VALUES:
        raise ValidationFailed(
            f"Give 1 to {MAX_DRIFT_VALUES} numbers.", field="drift_sample.values"
        )
    for value in values:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValidationFailed(
                "Every value must be a finite number.", field="drift_sample.values"
            )
    return {"feature": feature, "values": [float(v) for v in values]}


def clean_params(kind: str, raw: Any) -> dict[str, Any]:
    """The request of a `verify` or `benchmark` check with defaults filled in, or
    ValidationFailed naming the first bad field."""
    if not isinstance(raw, dict):
        raise ValidationFailed("Send a JSON object.", field="body")
    unknown = sorted(str(k) for k in raw if k not in _KNOWN[kind])
    if unknown:
        raise ValidationFailed(f"Unknown field {unknown[0]!r}.", field=unknown[0])
    params: dict[str, Any] = {
        "requests": _int(raw, "requests"),
        "max_tokens": _int(raw, "max_tokens"),
        "duration_s": _int(raw, "duration_s"),
        "prompts": _prompts(raw.get("prompts")),
    }
    if kind == "verify":
        params["concurrency"] = _int(raw, "concurrency")
        params["gates"] = _gates(raw.get("gates"))
        params["drift_sample"] = _drift(raw.get("drift_sample"))
        return params
    levels = raw.get("concurrencies", DEFAULT_BENCHMARK_LEVELS)
    if (
        not isinstance(levels, list)
        or not 1 <= len(levels) <= MAX_LEVELS
        or any(
            isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_CONCURRENCY
            for c in levels
        )
        or len(set(levels)) != len(levels)
    ):
        raise ValidationFailed(
            f"Give 1 to {MAX_LEVELS} different whole numbers from 1 to {MAX_CONCURRENCY}.",
            field="concurrencies",
        )
    params["concurrencies"] = sorted(levels)
    return params
