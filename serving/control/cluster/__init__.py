"""Where the portal's Ray cluster is, and the local Ray head the portal starts and stops itself.

A target is either the local head managed by the portal (the embedded default: every listener on
127.0.0.1, token auth on, ports of its own so it never takes Redis' 6379 or the portal's 8000) or
an existing cluster named by RAY_ADDRESS + RAY_DASHBOARD_URL + RAY_AUTH_TOKEN (+ RAY_SERVE_URL).
The local head is stopped by the processes of the session it was started in, never by process
name: other Ray clusters may share the host. Usable without Django: plain paths and ports.
`config` holds the target and the head's settings, `procs` the /proc readers, `head` start, stop
and status, `hooks` the workers' loopback hook, `cli` the command line:

    python -m serving.control.cluster start|stop|status|run
"""

from __future__ import annotations

from serving.control.cluster.cli import main
from serving.control.cluster.config import (
    DEFAULT_AUTOSCALER_METRICS_PORT,
    DEFAULT_CLIENT_SERVER_PORT,
    DEFAULT_DASHBOARD_AGENT_PORT,
    DEFAULT_DASHBOARD_METRICS_PORT,
    DEFAULT_DASHBOARD_PORT,
    DEFAULT_GCS_PORT,
    DEFAULT_GRACE_S,
    DEFAULT_NUM_CPUS,
    DEFAULT_OBJECT_STORE_MB,
    DEFAULT_SERVE_PORT,
    LOOPBACK,
    MAX_TEMP_DIR_LEN,
    REPO_ROOT,
    ClusterConfigError,
    ClusterError,
    ClusterStartError,
    LocalHeadConfig,
    RayTarget,
    ensure_token,
    local_target,
    ray_target_from_env,
)
from serving.control.cluster.head import (
    HeadState,
    HeadStatus,
    dashboard_ok,
    head_command,
    head_env,
    head_processes,
    head_status,
    ports_in_use,
    start_head,
    stop_head,
)
from serving.control.cluster.hooks import (
    SETUP_HOOK,
    SETUP_HOOK_ENV,
    bind_wildcard_grpc_to_loopback,
)
from serving.control.cluster.procs import (
    Listener,
    ProcInfo,
    all_procs,
    decode_address,
    is_alive,
    listening_sockets,
    read_proc,
    stop_processes,
)

__all__ = [
    "DEFAULT_AUTOSCALER_METRICS_PORT",
    "DEFAULT_CLIENT_SERVER_PORT",
    "DEFAULT_DASHBOARD_AGENT_PORT",
    "DEFAULT_DASHBOARD_METRICS_PORT",
    "DEFAULT_DASHBOARD_PORT",
    "DEFAULT_GCS_PORT",
    "DEFAULT_GRACE_S",
    "DEFAULT_NUM_CPUS",
    "DEFAULT_OBJECT_STORE_MB",
    "DEFAULT_SERVE_PORT",
    "LOOPBACK",
    "MAX_TEMP_DIR_LEN",
    "REPO_ROOT",
    "SETUP_HOOK",
    "SETUP_HOOK_ENV",
    "ClusterConfigError",
    "ClusterError",
    "ClusterStartError",
    "HeadState",
    "HeadStatus",
    "Listener",
    "LocalHeadConfig",
    "ProcInfo",
    "RayTarget",
    "all_procs",
    "bind_wildcard_grpc_to_loopback",
    "dashboard_ok",
    "decode_address",
    "ensure_token",
    "head_command",
    "head_env",
    "head_processes",
    "head_status",
    "is_alive",
    "listening_sockets",
    "local_target",
    "main",
    "ports_in_use",
    "ray_target_from_env",
    "read_proc",
    "start_head",
    "stop_head",
    "stop_processes",
]
