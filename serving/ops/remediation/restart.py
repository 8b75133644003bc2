"""`restart_replicas`: the slot's replicas restarted one at a time, each replacement RUNNING
before the next replica goes, so the slot never loses more than one replica of capacity.

Progress is written to the step's row after every replica (`originals`, `restarted`: old id ->
new id), so a worker that dies mid-way is resumed by the next one without restarting a
replica twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

from serving.control.cluster import ray_target_from_env
from serving.control.names import slot_app
from serving.control.replicas import KILL_TIMEOUT_S, kill_replica
from serving.control.serve_api import ServeApiClient
from serving.dataplane.sli import mark_stopped
from serving.deployments.models import Deployment, DeploymentRevision
from serving.ops.health import health_redis
from serving.ops.remediation.actions import Outcome
from serving.slo.remediation import DEFAULT_RESTART_TIMEOUT

RUNNING = "RUNNING"
POLL_S = 0.5
HEARTBEAT_S = 10.0


class RestartTimeout(Exception):
    pass


def slot_application(deployment: Deployment, revision: DeploymentRevision, group: str) -> str:
    """The Serve application whose replicas serve `group` (a dedicated stable slot runs in the
    router's replicas; vLLM and the canary have their own application)."""
    own, shared = deployment.serve_apps(revision)
    if shared:
        raise RestartTimeout("a shared pool's replicas are the platform's, not the tenant's")
    wanted = slot_app(deployment.tenant.slug, deployment.name, group)
    return wanted if wanted in own else deployment.serve_app


def stopped_on_purpose(deployment: Deployment, group: str, replica: str, until: float) -> None:
    """A replica this step kills is a restart asked for, not a replica lost: it goes to the
    slot's stopped hash (serving.dataplane.sli.mark_stopped), as Serve's graceful stops do, so
    the health check does not count it in `replica_restarts` (its crash-loop signal). Written
    before the kill, valid `until` the kill's deadline (its publishes until then are a dying
    replica's; a value published later, the kill having failed, is a live one). Its counts
    since the tick's last read are not known (it never said goodbye)."""
    last = {"at": until, "by": "restart_replicas"}
    mark_stopped(
        health_redis(), settings.SLI_KEY_PREFIX, deployment.serve_app, group, replica, last
    )


def _replacement(client: ServeApiClient, app: str, old: str, known: set[str], count: int) -> str:
    replicas = client.replicas(app)
    ids = {r.replica_id for r in replicas}
    running = [r for r in replicas if r.state == RUNNING]
    fresh = [r.replica_id for r in running if r.replica_id not in known]
    if old not in ids and len(running) >= count and fresh:
        return fresh[0]
    return ""


def restart_replicas(
    *,
    deployment: Deployment,
    revision: DeploymentRevision,
    group: str,
    params: dict[str, Any],
    progress: dict[str, Any],
    save: Callable[[dict[str, Any]], None],
) -> Outcome:
    """Restart every replica the slot had when the step started, one by one. `save` persists
    the progress (and renews the run's lease) after each one."""
    target = ray_target_from_env()
    client = ServeApiClient.from_target(target)
    timeout = float(params.get("timeout", DEFAULT_RESTART_TIMEOUT))
    if not progress.get("originals"):
        app = slot_application(deployment, revision, group)
        live = [r for r in client.replicas(app) if r.state == RUNNING]
        progress = {
            "app": app,
            "originals": [r.replica_id for r in live],
            "names": {r.replica_id: r.actor_name for r in live},
            "restarted": {},
        }
        save(progress)
    app = progress["app"]
    originals: list[str] = progress["originals"]
    restarted: dict[str, str] = progress["restarted"]
    for old in originals:
        if old in restarted:
            continue
        listed = {r.replica_id for r in client.replicas(app)}
        if old in listed and progress["names"].get(old):
            stopped_on_purpose(deployment, group, old, until=time.time() + KILL_TIMEOUT_S)
            kill_replica(target, progress["names"][old], timeout_s=KILL_TIMEOUT_S)
        known = set(originals) | set(restarted.values())
        deadline = time.monotonic() + timeout
        beat = time.monotonic()
        new = ""
        while not new:
            new = _replacement(client, app, old, known, len(originals))
            if new:
                break
            if time.monotonic() > deadline:
                raise RestartTimeout(f"replica {old} was not replaced within {timeout:.0f}s")
            if time.monotonic() - beat > HEARTBEAT_S:  # the run's lease outlives a slow start
                save(progress)
                beat = time.monotonic()
            time.sleep(POLL_S)
        restarted[old] = new
        save(progress)
    pairs = ", ".join(f"{old} -> {new}" for old, new in restarted.items())
    return Outcome(
        f"restarted {len(restarted)} replica(s) of {app} one by one: {pairs or 'none live'}",
        skipped=not originals,
        data=progress,
    )
