"""The Ray worker setup hook of the local head, which keeps replicas' gRPC servers on loopback.

`head.head_env` names it through Ray's worker setup hook variable, so every worker of the local
head runs it before user code; it imports Ray's internals itself, so the portal never loads Ray.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from serving.control.cluster.config import LOOPBACK

# What runtime_env's `worker_process_setup_hook` sets; on the head it reaches every worker.
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
# Spelled out, not f"{__name__}...": the dotted path Ray's workers import, which stays the same
# however the portal process was started (under `python -m` a module may be __main__).
SETUP_HOOK = "serving.control.cluster.hooks.bind_wildcard_grpc_to_loopback"


def bind_wildcard_grpc_to_loopback() -> None:
    """Ray worker setup hook of the local head: wildcard gRPC binds become 127.0.0.1 binds.

    Ray 2.60's Serve replicas bind their inter-deployment gRPC server to "[::]:0" (hard-coded in
    ray/serve/_private/replica.py, no setting), which would open every replica to the network.
    On a head whose node address is 127.0.0.1 nothing needs more than loopback, so the helper
    they bind through rewrites wildcard addresses. Runs in each worker before user code imports
    Serve; a runtime_env with its own worker_process_setup_hook replaces this one for its workers.
    """
    # Untyped Ray internals; imported here so the portal process never loads Ray for this.
    tls_utils: Any = importlib.import_module("ray._common.tls_utils")
    original = tls_utils.add_port_to_grpc_server
    if getattr(original, "portal_loopback", False):
        return

    def add_port(server: Any, address: str) -> Any:
        for wildcard in ("[::]:", "0.0.0.0:"):
            if address.startswith(wildcard):
                address = f"{LOOPBACK}:{address.removeprefix(wildcard)}"
        return original(server, address)

    add_port.portal_loopback = True  # type: ignore[attr-defined]
    tls_utils.add_port_to_grpc_server = add_port
    # `from tls_utils import add_port_to_grpc_server` binds the name at import: patch modules
    # that already hold it.
    for module in ("ray.serve._private.replica", "ray.dashboard.agent"):
        loaded: Any = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, "add_port_to_grpc_server"):
            loaded.add_port_to_grpc_server = add_port
