"""Restart one Serve replica: its actor is killed (no Ray restart) and Serve, which owns the
deployment's target replica count, starts a replacement. Django-free.

Serve's REST API has no per-replica restart, so the kill runs as a short-lived Ray driver in a
child process (the portal process never joins the cluster as a driver: no core worker, no
lingering connection), authenticated with the cluster's token.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serving.control.cluster.config import RayTarget

KILL_TIMEOUT_S = 60.0
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
# argv[1]: the replica actor's name in the "serve" namespace, as Serve reports it.
_KILL = """
import sys
import ray
ray.init(namespace="serve", logging_level="ERROR", log_to_driver=False, include_dashboard=False)
try:
    actor = ray.get_actor(sys.argv[1], namespace="serve")
except ValueError:
    sys.exit(3)  # already gone
ray.kill(actor, no_restart=True)
"""


class ReplicaKillError(Exception):
    pass


def kill_replica(target: RayTarget, actor_name: str, *, timeout_s: float = KILL_TIMEOUT_S) -> bool:
    """Kill the replica actor `actor_name`; False when it was already gone."""
    env = {
        **os.environ,
        "RAY_ADDRESS": target.address,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": target.token,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    if target.address.rsplit(":", 1)[0] in LOOPBACK_HOSTS:
        # A head on loopback (the local head): Ray would otherwise swap 127.0.0.1 for the
        # host's external address, where nothing listens (the head sets the same).
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        done = subprocess.run(  # noqa: S603 (sys.executable, a fixed script, one name argument)
            [sys.executable, "-c", _KILL, actor_name],
            env=env,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ReplicaKillError(f"killing {actor_name} took over {timeout_s:.0f}s") from exc
    if done.returncode == 3:
        return False
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise ReplicaKillError(f"killing {actor_name} failed: {' | '.join(tail)[:500]}")
    return True
