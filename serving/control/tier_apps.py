"""A deployment's degraded tiers in the Serve config (serving.dataplane.tiers): each tier's
version is an application of its own (`<app>.distilled`, `<app>.proxy`) reached by handle, a
router group of the same name, and the router's tier policy in its user_config; and the
hot-reload deadline and the standby copy's precision of every version slot
(serving.dataplane.standby), each written only when it is not the data plane's default (a
deployment without any of these compiles to the same bytes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from serving.control.specs import DeploymentSpec, SlotSpec
from serving.dataplane.standby import DEFAULT_DEADLINE_S

VersionApp = Callable[[str, SlotSpec], dict[str, Any]]


def _with_recovery(app: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    deployments = []
    for deployment in app["deployments"]:
        user_config = dict(deployment.get("user_config") or {})
        if deployment["name"] == "version":
            user_config.update(options)
        elif "local" in user_config:  # the router's in-process stable slot
            user_config["local"] = {**user_config["local"], **options}
        deployments.append({**deployment, "user_config": user_config})
    return {**app, "deployments": deployments}


def with_tiers(
    spec: DeploymentSpec, apps: list[dict[str, Any]], version_app: VersionApp
) -> list[dict[str, Any]]:
    """`apps` (the router's first) with the tiers' applications and the router's groups and
    policy for them, for a dedicated deployment; a shared one runs on its pool alone."""
    out = list(apps)
    if spec.tiers and spec.pool is None:
        router = out[0]
        deployment = dict(router["deployments"][0])
        user_config = dict(deployment["user_config"])
        groups = dict(user_config["groups"])
        for name, slot in spec.tiers:
            groups[name] = {"app": spec.slot_app(name), "version": slot.version}
            out.append(version_app(name, slot))
        user_config["groups"] = groups
        user_config["tiers"] = dict(spec.tier_policy)
        deployment["user_config"] = user_config
        out[0] = {**router, "deployments": [deployment, *router["deployments"][1:]]}
    options: dict[str, Any] = {}
    if spec.reload_deadline_s != DEFAULT_DEADLINE_S:
        options["reload_deadline_s"] = spec.reload_deadline_s
    if spec.standby_precision != "same":
        options["standby_precision"] = spec.standby_precision
    if options:
        out = [_with_recovery(app, options) for app in out]
    return out
