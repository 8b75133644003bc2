"""A revision's degraded tiers as compile specs (serving.control.tier_apps): each level's
version as a slot, the router's policy; and the hot-reload deadline and standby precision every
slot gets."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings

from serving.control.specs import SlotSpec
from serving.deployments.models import DeploymentRevision
from serving.registry.models import ModelVersion

ROUTER_KEYS = (
    "dwell_s",
    "reference_requests",
    "window",
    "on_breakers_open",
    "pin",
    "sla_window_s",
    "saturation",
)


def tier_fields(
    revision: DeploymentRevision, slot: Callable[[ModelVersion], SlotSpec]
) -> dict[str, Any]:
    """DeploymentSpec's `tiers`, `tier_policy`, `reload_deadline_s` and `standby_precision`
    for `revision`."""
    tiers = revision.tiers or {}
    out: dict[str, Any] = {
        "reload_deadline_s": float(settings.RELOAD_DEADLINE_S),
        "standby_precision": str(tiers.get("standby_precision") or "same"),
    }
    levels = list(tiers.get("levels") or [])
    if not levels or revision.pool_id is not None:
        return out
    versions = ModelVersion.objects.select_related("model").in_bulk(
        [level["version_id"] for level in levels]
    )
    slots = [(lv["name"], slot(versions[lv["version_id"]])) for lv in levels]
    policy = {key: tiers[key] for key in ROUTER_KEYS if key in tiers}
    policy["levels"] = [
        {"name": lv["name"], "enter": lv["enter"], "exit": lv["exit"]} for lv in levels
    ]
    return {**out, "tiers": tuple(slots), "tier_policy": policy}


def tier_version_ids(revisions: Iterable[dict[str, Any] | None]) -> set[int]:
    """The versions the given revisions' tiers run (replicas may fetch them)."""
    return {
        int(level["version_id"])
        for tiers in revisions
        for level in (tiers or {}).get("levels") or []
    }
