"""The Ray Serve applications the portal deploys (see serving.control.compile):

* a router application per portal deployment (ingress on `route_prefix`): checks the tenant's
  inference key, guards the input, splits traffic stable/canary, keeps `X-AB-Group` and
  `traceparent`, trips a circuit breaker per version, answers OpenAI-style;
* a version application per slot (`stable`, `canary`) running the engine; which weights it
  serves is user_config, so a new version of the same architecture is hot-reloaded beside the
  old weights and swapped without restarting the replica.

Everything the portal changes at run time (weights, keys, traffic split, faults, quotas) is
user_config: Serve calls `reconfigure()` on live replicas.
"""

from typing import Any

from serving.dataplane.handles import PoolSlot
from serving.dataplane.router import LOCAL_SERVER, Router, import_object
from serving.dataplane.version import VersionCore, VersionServer

__all__ = [
    "LOCAL_SERVER",
    "PoolSlot",
    "Router",
    "VersionCore",
    "VersionServer",
    "build_router",
    "build_version",
    "import_object",
]


def build_router(args: dict[str, Any]) -> Any:
    """Application builder for `serving.dataplane.app:build_router`."""
    local = args.get("local")
    return Router.bind(local=dict(local) if local else None)  # type: ignore[attr-defined]


def build_version(args: dict[str, Any]) -> Any:
    """Application builder for `serving.dataplane.app:build_version`: the built-in engine's
    server, or vLLM's (`server`: serving.dataplane.vllm_version:VllmCore)."""
    server: Any = VersionServer
    if args.get("server"):
        from serving.dataplane.vllm_version import VllmServer

        server = VllmServer
    return server.bind(  # type: ignore[attr-defined]
        app=str(args["app"]),
        group=str(args.get("group", "stable")),
        engine=dict(args.get("engine") or {}),
        arch_key=str(args.get("arch_key", "")),
    )
