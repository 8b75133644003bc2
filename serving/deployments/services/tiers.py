"""Degraded tiers of a deployment (seed 000 §3.1, SelectModelBranch(σ): σ < 0.2 full, < 0.5
distilled, else a light proxy): `clean_tiers` checks the `tiers` setting (ValidationFailed names
the field), `deployment_switch_tier` pins a tier until released (the `switch_to_fallback`
remediation calls it). The router applies them (serving.dataplane.tiers). Besides σ and open
breakers, `saturation` (the in-process stable slot's ongoing requests over Serve's limit) can
move traffic to a level, with its own hysteresis. The same setting holds the fast-recovery
option `standby_precision` (serving.dataplane.standby), which needs no levels."""

from __future__ import annotations

from typing import Any

from portal.exceptions import ValidationFailed
from serving.deployments.models import Deployment, DeploymentRevision, KvMode
from serving.engine.choice import BUILTIN
from serving.registry.selectors import version_get_deployable
from tenants.actors import SYSTEM, Actor
from tenants.models import Tenant

FULL = "full"
# The levels the seed names, in order of degradation, with its thresholds as the defaults.
LEVELS = {"distilled": 0.2, "proxy": 0.5}
HYSTERESIS = 0.1  # a level is left below `enter - 0.1` unless its `exit` says otherwise
# name -> (low, high, default); the dwell and windows bound what a tenant makes the router keep.
POLICY_LIMITS: dict[str, tuple[float, float, float]] = {
    "dwell_s": (0, 3600, 30),
    "reference_requests": (5, 10000, 50),
    "window": (5, 10000, 50),
    "sla_window_s": (60, 30 * 86400, 3600),
}
LEVEL_KEYS = {"name", "version_id", "enter", "exit", "sla_latency_scale"}
SATURATION_KEYS = {"level", "enter", "exit"}
PRECISIONS = ("same", "float16")
TOP_KEYS = {"levels", "on_breakers_open", "pin", "saturation", "standby_precision", *POLICY_LIMITS}


def _number(value: Any, field: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationFailed("must be a number.", field=field)
    if not low <= float(value) <= high:
        raise ValidationFailed(f"must be between {low:g} and {high:g}.", field=field)
    return float(value)


def _level(tenant: Tenant, raw: Any, index: int, stable_id: Any) -> dict[str, Any]:
    base = f"tiers.levels.{index}"
    if not isinstance(raw, dict):
        raise ValidationFailed("must be an object.", field=base)
    unknown = sorted(set(raw) - LEVEL_KEYS)
    if unknown:
        raise ValidationFailed(f"unknown field {unknown[0]!r}.", field=f"{base}.{unknown[0]}")
    name = raw.get("name")
    if name not in LEVELS:
        raise ValidationFailed(f"must be one of {', '.join(LEVELS)}.", field=f"{base}.name")
    version = version_get_deployable(
        tenant=tenant, version_id=raw.get("version_id"), field=f"{base}.version_id"
    )
    if version.pk == stable_id:
        raise ValidationFailed(
            "a tier serves another version than the full one.", field=f"{base}.version_id"
        )
    if BUILTIN not in (version.engines or [BUILTIN]):
        raise ValidationFailed(
            "a tier's version runs on the built-in engine.", field=f"{base}.version_id"
        )
    enter = _number(raw.get("enter", LEVELS[name]), f"{base}.enter", 0.01, 1)
    leave = _number(raw.get("exit", max(0.0, enter - HYSTERESIS)), f"{base}.exit", 0, 1)
    if leave >= enter:
        raise ValidationFailed("must be below enter (hysteresis).", field=f"{base}.exit")
    scale = _number(raw.get("sla_latency_scale", 1), f"{base}.sla_latency_scale", 1, 10)
    return {
        "name": name,
        "version_id": version.pk,
        "enter": enter,
        "exit": leave,
        "sla_latency_scale": scale,
    }


def _saturation(raw: Any, spec: dict[str, Any], names: list[str]) -> dict[str, Any] | None:
    """`tiers.saturation`: {level, enter, exit}, or None for no saturation trigger."""
    if raw is None:
        return None
    base = "tiers.saturation"
    if not isinstance(raw, dict):
        raise ValidationFailed("must be an object or null.", field=base)
    unknown = sorted(set(raw) - SATURATION_KEYS)
    if unknown:
        raise ValidationFailed(f"unknown field {unknown[0]!r}.", field=f"{base}.{unknown[0]}")
    if (spec.get("engine") or {}).get("name", BUILTIN) != BUILTIN:
        raise ValidationFailed(
            "saturation is measured on the router's in-process stable slot: the built-in engine's.",
            field=base,
        )
    level = raw.get("level", names[0])
    if level not in names:
        raise ValidationFailed(
            f"must be a declared level ({', '.join(names)}).", field=f"{base}.level"
        )
    enter = _number(raw.get("enter", 0.9), f"{base}.enter", 0.05, 1)
    leave = _number(raw.get("exit", max(0.0, enter - 0.2)), f"{base}.exit", 0, 1)
    if leave >= enter:
        raise ValidationFailed("must be below enter (hysteresis).", field=f"{base}.exit")
    return {"level": level, "enter": enter, "exit": leave}


def _precision(raw: dict[str, Any]) -> str:
    precision = raw.get("standby_precision", "same")
    if precision not in PRECISIONS:
        raise ValidationFailed(
            f"must be one of {', '.join(PRECISIONS)}.", field="tiers.standby_precision"
        )
    return str(precision)


def clean_tiers(*, tenant: Tenant, spec: dict[str, Any]) -> dict[str, Any]:
    """The `tiers` setting, checked and completed with defaults; {} for none."""
    raw = spec.get("tiers")
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise ValidationFailed("must be an object.", field="tiers")
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ValidationFailed(f"unknown field {unknown[0]!r}.", field=f"tiers.{unknown[0]}")
    if spec.get("kv_mode") == KvMode.SHARED:
        raise ValidationFailed("a shared deployment runs on its pool alone.", field="tiers")
    precision = _precision(raw)
    if set(raw) <= {"standby_precision", "levels"} and not raw.get("levels"):
        # Only the fast-recovery option: no degraded levels.
        return {} if precision == "same" else {"standby_precision": precision}
    levels = raw.get("levels")
    if not isinstance(levels, list) or not 1 <= len(levels) <= len(LEVELS):
        raise ValidationFailed(f"give 1 to {len(LEVELS)} levels.", field="tiers.levels")
    out_levels = [
        _level(tenant, level, i, spec.get("stable_version_id")) for i, level in enumerate(levels)
    ]
    names = [level["name"] for level in out_levels]
    if len(set(names)) != len(names):
        raise ValidationFailed("each level at most once.", field="tiers.levels")
    by_name = {level["name"]: level for level in out_levels}
    if len(by_name) == 2 and by_name["proxy"]["enter"] <= by_name["distilled"]["enter"]:
        raise ValidationFailed("must be above the distilled level's.", field="tiers.levels.enter")
    out: dict[str, Any] = {
        "levels": sorted(out_levels, key=lambda v: list(LEVELS).index(v["name"]))
    }
    for key, (low, high, default) in POLICY_LIMITS.items():
        value = _number(raw.get(key, default), f"tiers.{key}", low, high)
        out[key] = int(value) if key in ("reference_requests", "window") else value
    flag = raw.get("on_breakers_open", True)
    if not isinstance(flag, bool):
        raise ValidationFailed("must be true or false.", field="tiers.on_breakers_open")
    out["on_breakers_open"] = flag
    pin = raw.get("pin")
    if pin is not None and pin != FULL and pin not in by_name:
        raise ValidationFailed(
            f"must be null, {FULL!r} or a declared level ({', '.join(sorted(by_name))}).",
            field="tiers.pin",
        )
    out["pin"] = pin
    saturation = _saturation(raw.get("saturation"), spec, [n for n in LEVELS if n in by_name])
    if saturation is not None:
        out["saturation"] = saturation
    if precision != "same":
        out["standby_precision"] = precision
    return out


def tier_usage(*, spec: dict[str, Any]) -> int:
    """How many version slots the tiers add (each runs the deployment's replica shape)."""
    return len((spec.get("tiers") or {}).get("levels") or [])


def deployment_switch_tier(
    *,
    deployment: Deployment,
    tier: str | None,
    reason: str,
    actor: Actor = SYSTEM,
) -> DeploymentRevision:
    """Pin `tier` ("full" or a declared level) until released (`tier=None`): a new revision,
    audited, reconciled on commit. The router serves the pinned tier whatever σ says."""
    from serving.deployments.services.revisions import deployment_change

    revision = deployment.current_revision
    tiers = dict(revision.tiers or {}) if revision is not None else {}
    if not tiers.get("levels"):
        raise ValidationFailed("this deployment declares no tiers.", field="tier")
    declared = [FULL, *(level["name"] for level in tiers.get("levels", []))]
    if tier is not None and tier not in declared:
        raise ValidationFailed(f"must be one of {', '.join(declared)}, or null.", field="tier")
    return deployment_change(
        tenant=deployment.tenant,
        actor=actor,
        deployment=deployment,
        changes={"tiers": {**tiers, "pin": tier}},
        reason=f"tier {tier or 'released'}: {reason}"[:200],
        action="deployment.tier_switched",
    )
