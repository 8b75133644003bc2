"""Pure checks of a deployment's settings: a number within its bounds, an object of known
settings (refusing unknown keys), and a map of known settings (guard, breaker) each within its
own bounds. ValidationFailed names the bad field.

They read and write nothing; the spec cleaning of serving.deployments.services and the API's
serializers read the one table of setting bounds here (SETTING_LIMITS).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from portal.exceptions import ValidationFailed

# setting -> (lowest, highest, whole number): what a deployment's settings may be. The API's
# serializer fields and `clean_spec` both read this table, so the two never disagree.
SETTING_LIMITS: dict[str, tuple[float, float, bool]] = {
    "num_replicas": (1, 1000, True),
    "autoscaling.min_replicas": (0, 1000, True),
    "autoscaling.max_replicas": (1, 1000, True),
    "autoscaling.target_ongoing_requests": (0.1, 10000, False),
    "num_cpus": (0, 256, False),
    "num_gpus": (0, 64, False),
    "max_ongoing_requests": (1, 10000, True),
    "kv_blocks": (16, 1 << 22, True),
    "block_size": (1, 256, True),
    "canary_percent": (0, 100, False),
}


def setting(value: Any, field: str) -> Any:
    """`value` checked against the bounds SETTING_LIMITS gives `field`."""
    low, high, integer = SETTING_LIMITS[field]
    return number(value, field, low, high, integer=integer)


def number(value: Any, field: str, low: float, high: float, *, integer: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationFailed(f"must be a number in [{low}, {high}].", field=field)
    if integer and int(value) != value:
        raise ValidationFailed("must be a whole number.", field=field)
    if not low <= value <= high:
        raise ValidationFailed(f"must be between {low} and {high}.", field=field)
    return int(value) if integer else float(value)


def settings_object(raw: Any, field: str, known: Sequence[str]) -> dict[str, Any]:
    """`raw` as an object of settings ({} for none), refusing a key not in `known`: the error
    names the first unknown key (its first 40 characters) and lists `known` in its order."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise ValidationFailed("must be an object.", field=field)
    unknown = sorted(str(k)[:40] for k in set(raw) - set(known))
    if unknown:
        raise ValidationFailed(
            f"unknown setting {unknown[0]!r} (known: {', '.join(known)}).",
            field=f"{field}.{unknown[0]}",
        )
    return raw


def checked_map(raw: Any, field: str, limits: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    clean: dict[str, Any] = {}
    for key, value in settings_object(raw, field, sorted(limits)).items():
        low, high = limits[key]
        # Limits given as ints are whole-number settings; float limits (rates) are not.
        integer = isinstance(low, int) and isinstance(high, int) and key != "failure_rate"
        clean[key] = number(value, f"{field}.{key}", low, high, integer=integer)
    return clean
