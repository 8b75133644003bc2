"""Compile the desired state of every active deployment into one Ray Serve declarative config.

Per portal deployment, one or two Serve applications:

* `<slug>.<deployment>`: the router (ingress on `/<slug>/<deployment>`), user_config = keys, split,
  guard, breaker. A dedicated deployment's stable slot runs inside the router's replicas
  (init arg `local`, user_config `local`), so stable traffic pays no extra actor hop; the
  router's replicas are the stable slot's (count or autoscaling, CPUs/GPUs);
* `<slug>.<deployment>.canary`: the canary's version server, reached by handle (no route);
* `<slug>.<deployment>.stable`: a vLLM stable slot's server (serving.engine.vllm). vLLM cannot
  hot-swap weights, so they are its init args: a new version rolls its replicas, each new one
  started before the one it replaces drains and stops (`max_surge_percent`), while the thin
  router in front never restarts and keeps answering (a promoted canary's last calls are
  retired to the stable slot).

A version slot's user_config says which weights (artifact, where a node fetches them from,
fingerprint), the tenant's cache salt and block quota, and its faults. A shared deployment's
router stays a thin router in front of the pool's application (`platform.<pool>.pool`),
holding the tenant's share of the pool's request slots; the pool's user_config gives every
tenant its fair share (`fair_share()`). A router whose tenant is suspended, or no longer
allowed on its pool, answers 403 to everything (user_config: no restart either way). Every
name comes from `serving.control.names`, whose scheme cannot collide whatever the tenants'
names.

Everything a rollout or rollback changes lives in user_config (Serve reconfigures live
replicas); only replica shape (count, CPUs/GPUs, engine sizes, architecture) changes options
or init args, which Serve rolls out with new replicas. Same desired state, same bytes.
"""

from __future__ import annotations

from typing import Any

from serving.control import names, tier_apps
from serving.control.names import GPU_NODES_APP
from serving.control.shape import (
    GPU_NODES_IMPORT,
    HEALTH_CHECK,
    gpu_nodes_apps,
    restart_free,
)
from serving.control.specs import (
    DeploymentSpec,
    FairShare,
    GpuNodesSpec,
    Placement,
    PoolSpec,
    PoolTenant,
    SlotSpec,
    fair_share,
    pool_max_ongoing,
)

# The specs live in serving.control.specs; they stay importable from here.
__all__ = [
    "GPU_NODES_APP",
    "GPU_NODES_IMPORT",
    "HEALTH_CHECK",
    "ROUTER_IMPORT",
    "SAME_LOOP_ENV",
    "VERSION_IMPORT",
    "DeploymentSpec",
    "FairShare",
    "GpuNodesSpec",
    "Placement",
    "PoolSpec",
    "PoolTenant",
    "SlotSpec",
    "assemble",
    "compile_config",
    "deployment_apps",
    "fair_share",
    "gpu_nodes_apps",
    "pool_apps",
    "pool_max_ongoing",
    "restart_free",
]


ROUTER_IMPORT = "serving.dataplane.app:build_router"
# Our replicas never block their event loop (the engine steps in its own thread), so user code
# and the handle router run on the replica's main loop: measured in bench/router.py, this takes
# ~5 ms off each hop on a 2-core machine (bare Serve p50 16 -> 11 ms, routed 23 -> 16 ms).
SAME_LOOP_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
}
VERSION_IMPORT = "serving.dataplane.app:build_version"


def _scaling(spec: DeploymentSpec) -> dict[str, Any]:
    if spec.autoscaling:
        keys = ("min_replicas", "max_replicas", "target_ongoing_requests", "initial_replicas")
        config = {k: spec.autoscaling[k] for k in keys if k in spec.autoscaling}
        return {"autoscaling_config": config}
    return {"num_replicas": spec.num_replicas or 1}


VLLM_SERVER = "serving.dataplane.vllm_version:VllmCore"
# vLLM cannot hot-swap weights: a new version in a vLLM slot is new replicas. Serve starts each
# replacement before it stops (drains, then stops) the replica it replaces: no request fails.
VLLM_ROLLOUT = {"max_surge_percent": 100, "graceful_shutdown_timeout_s": 60}


def _engine_args(
    slot: SlotSpec, *, kv_blocks: int, block_size: int, max_num_seqs: int, num_gpus: float
) -> dict[str, Any]:
    if slot.is_vllm:
        return {**slot.engine, "gpu": num_gpus > 0}
    return {
        "num_blocks": kv_blocks,
        "block_size": block_size,
        "max_num_seqs": max_num_seqs,
        "gpu": num_gpus > 0,
    }


def _source(slot: SlotSpec) -> dict[str, Any]:
    return {"source": dict(slot.source)} if slot.source else {}


def _arch_key(slot: SlotSpec) -> str:
    """What forces new replicas: the architecture; for vLLM also the weights (no hot reload)."""
    return f"{slot.arch_key}:{slot.fingerprint[:16]}" if slot.is_vllm else slot.arch_key


def _version_args(spec: DeploymentSpec, group: str, slot: SlotSpec) -> dict[str, Any]:
    args: dict[str, Any] = {
        "app": spec.app_name,
        "group": group,
        "arch_key": _arch_key(slot),
        "engine": _engine_args(
            slot,
            kv_blocks=spec.kv_blocks,
            block_size=spec.block_size,
            max_num_seqs=spec.max_num_seqs,
            num_gpus=spec.num_gpus,
        ),
    }
    if slot.is_vllm:
        args["server"] = VLLM_SERVER
        if spec.kv_cache.get("prefix_caching") is False:  # an init arg: rolls the replicas
            args["engine"]["enable_prefix_caching"] = False
    return args


def _version_user_config(
    spec: DeploymentSpec, group: str, slot: SlotSpec, telemetry: dict[str, Any]
) -> dict[str, Any]:
    return {
        "version": slot.version,
        "artifact": slot.artifact,
        **_source(slot),
        "fingerprint": slot.fingerprint,
        "kv_mode": spec.kv_mode,
        "tenants": {
            spec.tenant_id: {"salt": spec.cache_salt_hex, "quota_blocks": spec.quota_blocks}
        },
        "faults": dict(spec.faults.get(group, {})),
        "telemetry": telemetry,
        **({"kv_cache": dict(spec.kv_cache)} if spec.kv_cache else {}),
        **_memory_caps({spec.tenant_id: spec.gpu_memory_mb}),
    }


def _memory_caps(caps: dict[str, int | None]) -> dict[str, Any]:
    """The tenants' GPU memory caps per replica in MiB, where set (serving.engine.memory)."""
    known = {tenant: mb for tenant, mb in sorted(caps.items()) if mb is not None}
    return {"gpu_memory_mb": known} if known else {}


def _version_app(
    spec: DeploymentSpec, group: str, slot: SlotSpec, telemetry: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": spec.slot_app(group),
        "route_prefix": None,
        "import_path": VERSION_IMPORT,
        "args": _version_args(spec, group, slot),
        "deployments": [
            {
                "name": "version",
                **_scaling(spec),
                **HEALTH_CHECK,
                **(VLLM_ROLLOUT if slot.is_vllm else {}),
                "max_ongoing_requests": spec.max_ongoing_requests,
                "ray_actor_options": {"num_cpus": spec.num_cpus, "num_gpus": spec.num_gpus},
                "user_config": _version_user_config(spec, group, slot, telemetry),
            }
        ],
    }


def _pool_app(pool: PoolSpec, telemetry: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": pool.app_name,
        "route_prefix": None,
        "import_path": VERSION_IMPORT,
        "args": {
            "app": pool.app_name,
            "group": "pool",
            "arch_key": _arch_key(pool.slot),
            "engine": _engine_args(
                pool.slot,
                kv_blocks=pool.kv_blocks,
                block_size=pool.block_size,
                max_num_seqs=pool.max_num_seqs,
                num_gpus=pool.num_gpus,
            ),
            **({"server": VLLM_SERVER} if pool.slot.is_vllm else {}),
        },
        "deployments": [
            {
                "name": "version",
                "num_replicas": pool.num_replicas,
                **HEALTH_CHECK,
                **(VLLM_ROLLOUT if pool.slot.is_vllm else {}),
                "max_ongoing_requests": pool.max_ongoing_requests,
                "ray_actor_options": {"num_cpus": pool.num_cpus, "num_gpus": pool.num_gpus},
                "user_config": {
                    "version": pool.slot.version,
                    "artifact": pool.slot.artifact,
                    **_source(pool.slot),
                    "fingerprint": pool.slot.fingerprint,
                    "kv_mode": "shared",
                    "tenants": {
                        tenant: {
                            "salt": share.salt,
                            "quota_blocks": share.quota_blocks,
                            "max_running": share.max_running,
                            **({"kv_cache": dict(share.kv_cache)} if share.kv_cache else {}),
                        }
                        for tenant, share in sorted(pool.tenants.items())
                    },
                    "faults": {},
                    "telemetry": telemetry,
                    **_memory_caps({t: s.gpu_memory_mb for t, s in pool.tenants.items()}),
                },
            }
        ],
    }


def _own_stable(spec: DeploymentSpec) -> bool:
    """A dedicated vLLM stable slot is an application of its own (`<app>.stable`): its weights
    are init args (no hot swap), so a new version rolls its replicas while the router, which
    never restarts, keeps routing (and retires a dropped canary's calls)."""
    return spec.pool is None and spec.stable.is_vllm


def _thin_router_shape(spec: DeploymentSpec) -> dict[str, Any]:
    return {
        "num_replicas": spec.router_replicas,
        "max_ongoing_requests": max(64, spec.max_ongoing_requests * 4),
        "ray_actor_options": {"num_cpus": 0},
    }


def _router_app(spec: DeploymentSpec, telemetry: dict[str, Any]) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {
        "stable": {"app": spec.app_name, "version": spec.stable.version, "local": True}
    }
    if _own_stable(spec):
        groups["stable"] = {"app": spec.slot_app("stable"), "version": spec.stable.version}
    if spec.canary is not None:
        groups["canary"] = {"app": spec.slot_app("canary"), "version": spec.canary.version}
    user_config: dict[str, Any] = {
        "tenant": spec.tenant_id,
        "deployment": spec.name,
        "revision": spec.revision,
        "key_hashes": sorted(spec.key_hashes),
        "canary_percent": spec.canary_percent if "canary" in groups else 0,
        "groups": groups,
        "guard": dict(spec.guard),
        "breaker": dict(spec.breaker),
        "telemetry": telemetry,
        "suspended": spec.suspended,
        "traffic": dict(spec.traffic),
        # The weights each group should answer with (X-Model-Fingerprint, until one answers).
        "fingerprints": {"stable": spec.stable.fingerprint}
        | ({"canary": spec.canary.fingerprint} if spec.canary is not None else {}),
    }
    if spec.batch_key_hashes:  # absent: every key realtime (serving.dataplane.keys)
        user_config["batch_key_hashes"] = sorted(spec.batch_key_hashes)
    if spec.pool is not None:
        user_config["canary_percent"] = 0
        user_config["groups"] = {
            "stable": {"app": names.pool_app(spec.pool), "version": spec.stable.version}
        }
        user_config["pool_slots"] = spec.pool_slots
        user_config["pool_access_revoked"] = not spec.pool_access
        shape: dict[str, Any] = _thin_router_shape(spec)
        args: dict[str, Any] = {}
    elif _own_stable(spec):
        shape, args = _thin_router_shape(spec), {}
    else:
        user_config["local"] = _version_user_config(spec, "stable", spec.stable, telemetry)
        shape = {
            **_scaling(spec),
            "max_ongoing_requests": spec.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": spec.num_cpus, "num_gpus": spec.num_gpus},
        }
        args = {"local": _version_args(spec, "stable", spec.stable)}
    return {
        "name": spec.app_name,
        "route_prefix": spec.route_prefix,
        "import_path": ROUTER_IMPORT,
        "args": args,
        "deployments": [{"name": "router", **shape, **HEALTH_CHECK, "user_config": user_config}],
    }


def deployment_apps(spec: DeploymentSpec, telemetry: dict[str, Any]) -> list[dict[str, Any]]:
    """One portal deployment's applications: its router, a dedicated canary's server, and a
    vLLM stable slot's server."""
    apps = [_router_app(spec, telemetry)]
    if _own_stable(spec):
        apps.append(_version_app(spec, "stable", spec.stable, telemetry))
    if spec.pool is None and spec.canary is not None:
        apps.append(_version_app(spec, "canary", spec.canary, telemetry))
    return tier_apps.with_tiers(spec, apps, lambda g, s: _version_app(spec, g, s, telemetry))


def pool_apps(pool: PoolSpec, telemetry: dict[str, Any]) -> list[dict[str, Any]]:
    return [_pool_app(pool, telemetry)]


def assemble(
    applications: list[dict[str, Any]],
    *,
    http_host: str = "127.0.0.1",
    http_port: int = 8001,
    runtime_env: dict[str, Any] | None = None,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """The declarative config around compiled applications (each gets the runtime env)."""
    placement = placement or Placement()
    out = []
    for app in applications:
        env = dict(runtime_env or {})
        env["env_vars"] = {**SAME_LOOP_ENV, **env.get("env_vars", {})}
        out.append(placement.place({**app, "runtime_env": env}))
    return {
        "proxy_location": placement.proxy_location,
        "http_options": {"host": http_host, "port": http_port},
        "applications": out,
    }


def compile_config(
    specs: list[DeploymentSpec],
    *,
    pools: list[PoolSpec] | None = None,
    http_host: str = "127.0.0.1",
    http_port: int = 8001,
    telemetry: dict[str, Any] | None = None,
    runtime_env: dict[str, Any] | None = None,
    gpu_nodes: GpuNodesSpec | None = None,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """The whole Serve config: every active deployment, sorted by application name; with
    `gpu_nodes`, the GPU samplers' application first."""
    telemetry = dict(telemetry or {})
    applications = gpu_nodes_apps(gpu_nodes, telemetry)
    for pool in sorted(pools or [], key=lambda p: p.name):
        applications += pool_apps(pool, telemetry)
    known_pools = {p.name for p in pools or []}
    for spec in sorted(specs, key=lambda s: s.app_name):
        if spec.pool is not None and spec.pool not in known_pools:
            raise ValueError(f"{spec.app_name}: shared pool {spec.pool!r} is not configured")
        applications += deployment_apps(spec, telemetry)
    return assemble(
        applications,
        http_host=http_host,
        http_port=http_port,
        runtime_env=runtime_env,
        placement=placement,
    )
