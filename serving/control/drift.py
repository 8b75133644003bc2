"""Config drift, graded (seed 003 §3.2): the config Serve reports it runs for an application
(`deployed_app_config`) against the config the portal PUT for it, both in a canonical JSON form
(keys sorted, a named list such as `deployments` keyed by name, 2 and 2.0 the same number), each
hashed; where the hashes differ, the differing fields, each graded:

* P0 - traffic or weights: versions, artifacts and their sources, fingerprints, the traffic
  split and groups, faults, keys, tenants' salts, suspension; the import path, route,
  architecture; an application or deployment missing or extra.
* P1 - capacity and protection: replicas, autoscaling, actor resources, concurrency limits,
  engine sizes, guard, breaker, quotas, health checks, runtime env, telemetry; and any field
  this table does not know (a field nobody graded is not assumed harmless).
* P2 - cosmetic: the order of named lists, log levels (`logging_config`), fields that change
  no serving.

Django-free: the portal's side is serving.deployments.drift.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

P0, P1, P2 = "P0", "P1", "P2"
GRADE_ORDER = {P0: 0, P1: 1, P2: 2}
ORDER_FIELD = "(order)"
MISSING_APP = "(application missing)"
EXTRA_APP = "(application not applied by the portal)"

# The key nearest the leaf decides (`user_config.local.tenants.1.quota_blocks` is a quota: P1;
# `...tenants.1.salt` is isolation: P0).
_GRADES: dict[str, str] = {
    **dict.fromkeys(
        (
            "version",
            "artifact",
            "source",
            "fingerprint",
            "faults",
            "canary_percent",
            "groups",
            "revision",
            "key_hashes",
            "salt",
            "suspended",
            "pool_access_revoked",
            "kv_mode",
            "tenant",
            "deployment",
            "app",
            "group",
            "import_path",
            "route_prefix",
            "arch_key",
            "server",
            "name",
            "local",
        ),
        P0,
    ),
    **dict.fromkeys(
        (
            "num_replicas",
            "autoscaling_config",
            "ray_actor_options",
            "max_ongoing_requests",
            "max_queued_requests",
            "max_replicas_per_node",
            "placement_group_bundles",
            "placement_group_strategy",
            "health_check_period_s",
            "health_check_timeout_s",
            "graceful_shutdown_wait_loop_s",
            "graceful_shutdown_timeout_s",
            "max_surge_percent",
            "engine",
            "guard",
            "breaker",
            "quota_blocks",
            "max_running",
            "pool_slots",
            "runtime_env",
            "telemetry",
            "tenants",
        ),
        P1,
    ),
    **dict.fromkeys(("logging_config", "docs_path", "description"), P2),
}


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return float(value)


def _named(items: list[Any]) -> bool:
    return bool(items) and all(
        isinstance(i, Mapping) and isinstance(i.get("name"), str) for i in items
    )


def canonical(value: Any, *, keep_order: bool = False) -> Any:
    """The config with the differences that mean nothing removed: key order, the order of
    named lists (unless `keep_order`), int versus float."""
    if isinstance(value, Mapping):
        return {
            str(k): canonical(v, keep_order=keep_order)
            for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
        }
    if isinstance(value, list | tuple):
        items = [canonical(v, keep_order=keep_order) for v in value]
        return sorted(items, key=lambda i: i["name"]) if _named(items) and not keep_order else items
    return _number(value)


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(app: Mapping[str, Any] | None) -> str:
    """sha256 of the canonical JSON (16 hex digits); '' for no config."""
    if app is None:
        return ""
    return hashlib.sha256(_dump(canonical(app)).encode()).hexdigest()[:16]


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """Leaf path -> canonical JSON of the leaf; a named list's items are `key[name]`."""
    out: dict[str, str] = {}
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list) and _named(value):
        for item in value:
            here = f"{prefix}[{item['name']}]"
            out[here] = '"present"'  # an item on one side only differs here
            out.update(flatten({k: v for k, v in item.items() if k != "name"}, here))
    else:
        out[prefix] = _dump(value)
    return out


def grade(path: str) -> str:
    """The grade of one differing field (see the module doc)."""
    if path == ORDER_FIELD:
        return P2
    if path in (MISSING_APP, EXTRA_APP):
        return P0
    parts = [p for chunk in path.replace("]", "").split(".") for p in chunk.split("[")]
    if len(parts) == 2 and parts[0] == "deployments":
        return P0  # a whole deployment missing or extra
    for part in reversed(parts):
        if part in _GRADES:
            return _GRADES[part]
    return P1


@dataclass(frozen=True)
class AppDrift:
    app: str
    grade: str
    fields: tuple[str, ...]  # the differing fields, worst first
    applied_hash: str
    reported_hash: str
    details: dict[str, dict[str, str | None]] = field(default_factory=dict)  # path -> both

    def as_json(self) -> dict[str, Any]:
        """Names and hashes only: the values (`details`, which may hold platform settings such
        as the telemetry Redis URL) go to the operator's log, never to a tenant's page."""
        return {
            "app": self.app,
            "grade": self.grade,
            "fields": list(self.fields),
            "applied_hash": self.applied_hash,
            "reported_hash": self.reported_hash,
        }


MAX_FIELDS = 20  # what a finding carries: enough to act on, bounded whatever Serve reports
MAX_VALUE_CHARS = 200


def compare_app(
    name: str, applied: Mapping[str, Any] | None, reported: Mapping[str, Any] | None
) -> AppDrift | None:
    """None when Serve runs what the portal applied; else the graded difference."""
    applied_hash, reported_hash = config_hash(applied), config_hash(reported)
    if applied is None or reported is None:
        path = MISSING_APP if reported is None else EXTRA_APP
        return AppDrift(name, P0, (path,), applied_hash, reported_hash)
    if applied_hash == reported_hash:
        if _dump(canonical(applied, keep_order=True)) == _dump(
            canonical(reported, keep_order=True)
        ):
            return None
        return AppDrift(name, P2, (ORDER_FIELD,), applied_hash, reported_hash)
    ours, theirs = flatten(canonical(applied)), flatten(canonical(reported))
    paths = sorted(
        (p for p in set(ours) | set(theirs) if ours.get(p) != theirs.get(p)),
        key=lambda p: (GRADE_ORDER[grade(p)], p),
    )[:MAX_FIELDS]
    details = {
        p: {
            "applied": _clip(ours.get(p)),
            "reported": _clip(theirs.get(p)),
        }
        for p in paths
    }
    worst = min((grade(p) for p in paths), key=GRADE_ORDER.__getitem__, default=P2)
    return AppDrift(name, worst, tuple(paths), applied_hash, reported_hash, details)


def _clip(value: str | None) -> str | None:
    if value is None or len(value) <= MAX_VALUE_CHARS:
        return value
    return value[:MAX_VALUE_CHARS] + "..."


def compare(
    applied: Mapping[str, Mapping[str, Any]], reported: Mapping[str, Mapping[str, Any] | None]
) -> list[AppDrift]:
    """Every application of either side that differs (`reported` holds only the applications
    the caller owns), worst first."""
    found = [
        drift
        for name in sorted(set(applied) | set(reported))
        if (drift := compare_app(name, applied.get(name), reported.get(name))) is not None
    ]
    return sorted(found, key=lambda d: (GRADE_ORDER[d.grade], d.app))
