"""Shapes shared by the compiled Serve config: the replicas' health check, the GPU samplers'
application (one per Ray node, no route), and `restart_free`, which tells a change Serve applies
to live replicas from one that rolls new ones."""

from __future__ import annotations

from typing import Any

from serving.control.names import GPU_NODES_APP
from serving.control.specs import GpuNodesSpec

GPU_NODES_IMPORT = "serving.dataplane.gpu_node:build_gpu_nodes"

# Serve checks each replica every 2 s (default 10 s): a replica whose check fails (a drill's
# replica_hang, a wedged engine) is replaced in ~10 s instead of ~33 s. The timeout stays
# generous (15 s; default 30 s): a replica's event loop slowed by a loaded machine must not
# look dead. Lightweight options: changing them reconfigures, it restarts nothing.
HEALTH_CHECK = {"health_check_period_s": 2, "health_check_timeout_s": 15}


def _gpu_nodes_app(gpu: GpuNodesSpec, telemetry: dict[str, Any]) -> dict[str, Any]:
    """One GPU sampler per Ray node (serving.dataplane.gpu_node), no route, no CPU reserved."""
    return {
        "name": GPU_NODES_APP,
        "route_prefix": None,
        "import_path": GPU_NODES_IMPORT,
        "args": {},
        "deployments": [
            {
                "name": "sampler",
                "num_replicas": gpu.nodes,
                "max_replicas_per_node": 1,
                **HEALTH_CHECK,
                "ray_actor_options": {"num_cpus": 0},
                "user_config": {"telemetry": telemetry, "hz": gpu.hz, "simulate": gpu.simulate},
            }
        ],
    }


def gpu_nodes_apps(gpu: GpuNodesSpec | None, telemetry: dict[str, Any]) -> list[dict[str, Any]]:
    return [_gpu_nodes_app(gpu, telemetry)] if gpu and gpu.nodes else []


def restart_free(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """True when `new` differs from `old` only in user_config: Serve reconfigures live
    replicas and restarts none."""

    def shape(config: dict[str, Any]) -> Any:
        apps = []
        for app in config.get("applications", []):
            deps = [{k: v for k, v in d.items() if k != "user_config"} for d in app["deployments"]]
            apps.append({**{k: v for k, v in app.items() if k != "deployments"}, "deps": deps})
        return ({k: v for k, v in config.items() if k != "applications"}, apps)

    return bool(shape(old) == shape(new))
