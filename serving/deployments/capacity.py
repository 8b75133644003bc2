"""The cluster's capacity, as the portal uses it: shown beside the deployments, checked at
admission, and told as Ray's reason on a deployment that waits for resources.

Admission refuses (409, naming the setting) a create or change whose replicas the cluster as
it is cannot place, counting as free what the deployment's current replicas hold (Serve
replaces them). A change that asks for no more than the current revision (a scale-down, a
rollback, a canary removed) is never refused; nor is anything when the cluster autoscales
(RAY_CLUSTER_AUTOSCALES=1: the deployment then says it waits for the autoscaler) or when Ray
cannot say (dashboard unreachable: the deployment's status will tell). Ray's accounting is
read at most once every CACHE_S seconds, whoever asks (a page reloaded in a loop included).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django.conf import settings
from django.core.cache import cache

from portal.exceptions import ConflictError
from serving.control.capacity import RESOURCES, ClusterCapacity, Shortfall, parse_cluster_status
from serving.control.capacity import place as place_replicas
from serving.control.cluster import ClusterConfigError, ray_target_from_env
from serving.control.serve_api import ServeApiClient, ServeApiError
from serving.deployments.models import Deployment, KvMode

logger = logging.getLogger(__name__)

CACHE_KEY = "serving:cluster-capacity"
CACHE_S = 3
_EPSILON = 1e-9


class NoCapacity(ConflictError):
    code = "insufficient_capacity"


def cluster_capacity(*, client: ServeApiClient | None = None) -> ClusterCapacity | None:
    """The cluster's capacity now (at most CACHE_S seconds old), or None when Ray cannot say
    (or the check is off: CLUSTER_CAPACITY)."""
    if not getattr(settings, "CLUSTER_CAPACITY", True):
        return None
    data = cache.get(CACHE_KEY)
    if data is None:
        try:
            target = ray_target_from_env()
            client = client or target.serve_client(timeout=3.0)
            data = {"status": client.cluster_status(), "autoscales": target.autoscales}
        except (ClusterConfigError, ServeApiError) as exc:
            logger.info("cluster capacity unknown: %s", exc)
            data = {"error": str(exc)[:300]}
        cache.set(CACHE_KEY, data, CACHE_S)
    if "error" in data:
        return None
    return parse_cluster_status(data["status"], autoscales=bool(data["autoscales"]))


def capacity_view() -> dict[str, Any]:
    """What a tenant may see of the cluster (the deployments page, the API): totals only, no
    node and no other deployment's demand; `known` is False when Ray cannot say."""
    cluster = cluster_capacity()
    if cluster is None:
        return {"known": False}
    summary = cluster.summary()
    summary.pop("pending", None)
    return {"known": True, **summary}


def replica_asks(spec: Mapping[str, Any] | None) -> list[dict[str, float]]:
    """What a revision's replicas ask Ray for when it starts: per replica of the router (which
    runs the stable slot) and of the canary's server, `num_cpus` and `num_gpus`. A shared
    deployment asks for nothing of its own (the pool's replicas are the platform's)."""
    if spec is None or spec["kv_mode"] == KvMode.SHARED:
        return []
    autoscaling = spec.get("autoscaling")
    if autoscaling:
        count = int(autoscaling.get("initial_replicas") or autoscaling.get("min_replicas") or 0)
    else:
        count = int(spec.get("num_replicas") or 1)
    slots = 2 if spec.get("canary_version_id") else 1
    slots += len((spec.get("tiers") or {}).get("levels") or [])  # each tier: its own server
    one = {"CPU": float(spec["num_cpus"]), "GPU": float(spec["num_gpus"])}
    return [dict(one) for _ in range(count * slots)]


def grows(before: Sequence[Mapping[str, float]], after: Sequence[Mapping[str, float]]) -> bool:
    for resource in RESOURCES:
        if sum(a[resource] for a in after) > sum(b[resource] for b in before) + _EPSILON:
            return True
        most = max((b[resource] for b in before), default=0.0)
        if max((a[resource] for a in after), default=0.0) > most + _EPSILON:
            return True
    return False


def held_by(deployment: Deployment, current: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per node, what the deployment's running replicas hold (its current revision's asks)."""
    revision = deployment.current_revision
    asks = replica_asks(current)
    if revision is None or not asks:
        return {}
    try:
        apps = ray_target_from_env().serve_client(timeout=3.0).applications()
    except (ClusterConfigError, ServeApiError) as exc:
        logger.info("replicas of %s unknown: %s", deployment, exc)
        return {}
    held: dict[str, dict[str, float]] = {}
    own, _shared = deployment.serve_apps(revision)
    for name in own:
        info = apps.get(name)
        for replica in info.replicas if info is not None else ():
            if replica.node_id and replica.state in ("RUNNING", "STARTING", "UPDATING"):
                node = held.setdefault(replica.node_id, dict.fromkeys(RESOURCES, 0.0))
                for resource in RESOURCES:
                    node[resource] += asks[0][resource]
    return held


def _setting(short: Shortfall, spec: Mapping[str, Any], current: Mapping[str, Any] | None) -> str:
    """The setting to name: the per-replica ask when one replica fits on no node, else what
    the change raised (the canary, the ask, the count)."""
    if short.each > short.largest_node + _EPSILON:
        return short.setting
    if current is not None:
        if spec.get("canary_version_id") and not current.get("canary_version_id"):
            return "canary_version"
        if (spec.get("tiers") or {}).get("levels") and not (current.get("tiers") or {}):
            return "tiers"
        if float(spec[short.setting]) > float(current[short.setting]) + _EPSILON:
            return short.setting
    return "autoscaling" if spec.get("autoscaling") else "num_replicas"


def check_fits(
    *,
    spec: Mapping[str, Any],
    current: Mapping[str, Any] | None = None,
    deployment: Deployment | None = None,
) -> None:
    """Refuse (409 NoCapacity, naming the setting) `spec` when the cluster as it is cannot
    place its replicas, `current` (the revision it replaces, of `deployment`) giving back
    what it holds."""
    want = replica_asks(spec)
    before = replica_asks(current)
    if not grows(before, want):
        return
    cluster = cluster_capacity()
    if cluster is None or cluster.autoscales:
        return
    held = held_by(deployment, current) if deployment is not None and current is not None else {}
    short = place_replicas(cluster, want, held=held)
    if short is not None:
        raise NoCapacity(
            f"the cluster cannot place this deployment as it is: {short.describe()}. Ask for "
            "less, free some capacity, or add a node (the cluster does not autoscale).",
            field=_setting(short, spec, current),
        )


def waiting_reason(cluster: ClusterCapacity | None, spec: Mapping[str, Any], starting: int) -> str:
    """Ray's reason why `starting` replicas of `spec` (the deployment's own, not yet running)
    wait, when Ray holds demands of their shape it cannot place; else ''. Only the cluster's
    totals are told, never another deployment's demands."""
    asks = replica_asks(spec)
    if cluster is None or not asks or starting <= 0:
        return ""
    one = {r: v for r, v in asks[0].items() if v > 0}
    if not any(
        all(abs(shape.get(r, 0.0) - one.get(r, 0.0)) < _EPSILON for r in RESOURCES)
        for shape, _count in cluster.pending
    ):
        return ""
    free = ", ".join(
        f"{cluster.free(r):g} of {cluster.total(r):g} {r} free" for r in RESOURCES if r in one
    )
    asked = ", ".join(f"{v:g} {r}" for r, v in one.items())
    said = f"Ray cannot place {starting} replica(s) asking for {asked} each: the cluster has {free}"
    if cluster.autoscales:
        return said + "; waiting for the autoscaler to add a node."
    return said + " and does not autoscale: scale down or free capacity."
