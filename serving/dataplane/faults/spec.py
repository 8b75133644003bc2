"""The fault catalogue: what a version slot's `faults` user_config may hold (the schema), the
validation the portal runs before a spec becomes a revision, and the errors faults raise."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GROUPS = ("stable", "canary")
MAX_DELAY_MS = 600_000
MAX_TIMESTAMP = 1e11  # unix seconds, year ~5138: refuses milliseconds passed by mistake
DISTRIBUTIONS = ("fixed", "uniform", "exponential")
MB = 1 << 20


class FaultSpecError(ValueError):
    """A faults spec the catalogue refuses; `field` is the dotted path of the bad value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InjectedFault(RuntimeError):
    """A request failed on purpose (`error_burst`); the router answers with `status`."""

    def __init__(self, status: int, kind: str, drill: str = "") -> None:
        super().__init__(_injected_message(kind, drill))
        self.status = status
        self.kind = kind
        self.drill = drill

    @property
    def message(self) -> str:
        return _injected_message(self.kind, self.drill)

    def __reduce__(self) -> tuple[type[InjectedFault], tuple[int, str, str]]:
        # Raised inside a version replica, it must survive Ray's pickling to reach the router.
        return (InjectedFault, (self.status, self.kind, self.drill))


def _injected_message(kind: str, drill: str) -> str:
    return f"injected fault: {kind}" + (f" (drill {drill})" if drill else "")


class ReplicaHung(RuntimeError):
    """What Serve's health check gets from a replica a `replica_hang` fault selected."""


@dataclass(frozen=True)
class _Num:
    low: float
    high: float
    default: float | None = None  # None: required
    integer: bool = False
    low_open: bool = False  # the lower bound itself is refused (a rate of 0 means nothing)

    def check(self, value: Any, field: str) -> float | int:
        low = "(" if self.low_open else "["
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FaultSpecError(field, f"must be a number in {low}{self.low}, {self.high}].")
        if not math.isfinite(value):
            raise FaultSpecError(field, "must be a finite number.")
        if self.integer and int(value) != value:
            raise FaultSpecError(field, "must be a whole number.")
        if value < self.low or value > self.high or (self.low_open and value == self.low):
            lower = f"greater than {self.low}" if self.low_open else f"at least {self.low}"
            raise FaultSpecError(field, f"must be {lower} and at most {self.high}.")
        return int(value) if self.integer else float(value)


@dataclass(frozen=True)
class _Choice:
    values: tuple[str, ...]
    default: str

    def check(self, value: Any, field: str) -> str:
        if value not in self.values:
            raise FaultSpecError(field, f"must be one of {', '.join(self.values)}.")
        return str(value)


@dataclass(frozen=True)
class _Text:
    pattern: str  # the whole value must match
    hint: str
    default: str | None = None

    def check(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or re.fullmatch(self.pattern, value) is None:
            raise FaultSpecError(field, f"must be {self.hint}.")
        return value


_Field = _Num | _Choice | _Text
PROBE_IDENTITY = r"drill-probe:[0-9A-Za-z_-]{1,64}"

FLAT_FAULTS: dict[str, _Num] = {
    "error_rate": _Num(0.0, 1.0),
    "latency_ms": _Num(0, MAX_DELAY_MS, integer=True),
}
NESTED_FAULTS: dict[str, dict[str, _Field]] = {
    "error_burst": {
        "share": _Num(0.0, 1.0),
        "status": _Num(500, 599, default=503, integer=True),
    },
    "latency_spike": {
        "delay_ms": _Num(0.0, MAX_DELAY_MS),
        "jitter_ms": _Num(0.0, MAX_DELAY_MS, default=0.0),
        "distribution": _Choice(DISTRIBUTIONS, "fixed"),
        "share": _Num(0.0, 1.0, default=1.0),
    },
    "gpu_memory_leak": {
        "mb_per_s": _Num(0.0, 10_000.0, low_open=True),
        "max_mb": _Num(0.0, 1_000_000.0, default=4096.0, low_open=True),
        "replica_share": _Num(0.0, 1.0, default=1.0),
    },
    "replica_crash": {
        "replica_share": _Num(0.0, 1.0, default=1.0),
        "after_s": _Num(0.0, 3600.0, default=0.0),
    },
    "replica_hang": {"replica_share": _Num(0.0, 1.0, default=1.0)},
    "kv_pollution_probe": {
        "identity": _Text(PROBE_IDENTITY, 'a synthetic tenant "drill-probe:<run>"'),
        "key_hash": _Text(r"[0-9a-f]{64}", "the SHA-256 of the probe key, 64 hex digits"),
        "quota_blocks": _Num(1, 1 << 22, default=16, integer=True),
    },
    "weight_swap_jitter": {"reload": _Num(1, 1_000_000, integer=True)},
}
META_KEYS = ("drill", "issued_at", "expires_at")
FAULT_KEYS: tuple[str, ...] = (*FLAT_FAULTS, *NESTED_FAULTS, *META_KEYS)
_TIMESTAMP = _Num(0.0, MAX_TIMESTAMP)


def validate_group(raw: Any, field: str) -> dict[str, Any]:
    """One group's faults, normalized (defaults filled in); FaultSpecError names the field."""
    if raw is None or raw == {}:
        return {}
    if not isinstance(raw, Mapping):
        raise FaultSpecError(field, "must be an object.")
    unknown = sorted(str(k) for k in raw if k not in FAULT_KEYS)
    if unknown:
        raise FaultSpecError(
            f"{field}.{unknown[0]}",
            f"unknown fault {unknown[0]!r} (known: {', '.join(sorted(FAULT_KEYS))}).",
        )
    clean: dict[str, Any] = {}
    for key, value in raw.items():
        path = f"{field}.{key}"
        if key == "drill":
            if not isinstance(value, str) or not 1 <= len(value) <= 100:
                raise FaultSpecError(path, "must be a string of 1 to 100 characters.")
            clean[key] = value
        elif key in ("issued_at", "expires_at"):
            clean[key] = _TIMESTAMP.check(value, path)
        elif key in FLAT_FAULTS:
            clean[key] = FLAT_FAULTS[key].check(value, path)
        else:
            clean[key] = _nested(value, path, NESTED_FAULTS[key])
    _cross_checks(clean, field)
    return clean


def _nested(raw: Any, field: str, schema: Mapping[str, _Field]) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise FaultSpecError(field, "must be an object.")
    unknown = sorted(str(k) for k in raw if k not in schema)
    if unknown:
        raise FaultSpecError(
            f"{field}.{unknown[0]}",
            f"unknown setting {unknown[0]!r} (known: {', '.join(sorted(schema))}).",
        )
    clean: dict[str, Any] = {}
    for name, spec in schema.items():
        if name in raw:
            clean[name] = spec.check(raw[name], f"{field}.{name}")
        elif spec.default is None:
            raise FaultSpecError(f"{field}.{name}", "is required.")
        else:
            clean[name] = spec.default
    return clean


def _cross_checks(clean: Mapping[str, Any], field: str) -> None:
    issued, expires = clean.get("issued_at"), clean.get("expires_at")
    if issued is not None and expires is not None and expires <= issued:
        raise FaultSpecError(f"{field}.expires_at", "must be later than issued_at.")
    for kind in ("replica_crash", "replica_hang"):
        # Without it a replica Serve starts in place of a crashed one would crash again.
        if kind in clean and issued is None:
            raise FaultSpecError(
                f"{field}.issued_at",
                f"is required with {kind}: only replicas started before "
                "it are affected, so their replacements are not.",
            )
    # The synthetic identity (and the key the router takes for it) must end by itself.
    if "kv_pollution_probe" in clean and expires is None:
        raise FaultSpecError(
            f"{field}.expires_at",
            "is required with kv_pollution_probe: the probe identity "
            "and its key must end by themselves.",
        )


def validate_faults(raw: Any, field: str = "faults") -> dict[str, dict[str, Any]]:
    """A revision's faults: per group (stable, canary), each validated by validate_group."""
    if raw is None or raw == {}:
        return {}
    if not isinstance(raw, Mapping) or set(raw) - set(GROUPS):
        raise FaultSpecError(field, "faults are given per group: stable, canary.")
    clean = {str(g): validate_group(v, f"{field}.{g}") for g, v in raw.items()}
    if "kv_pollution_probe" in clean.get("canary", {}):
        # Only the router knows the probe key, and it serves the stable slot itself.
        raise FaultSpecError(
            f"{field}.canary.kv_pollution_probe",
            "only the stable slot can take it (the "
            "router, which accepts the probe key, serves the stable slot in-process).",
        )
    return clean
