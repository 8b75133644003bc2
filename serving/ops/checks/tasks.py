"""Celery tasks of the checks: the periodic golden-prompt probe and one version check run."""

from __future__ import annotations

from typing import Any

from portal.celery import task

# A load test is bounded by MAX_DURATION_S per concurrency level (serving.ops.checks.limits);
# loading a multi-GiB checkpoint on CPU comes on top.
CHECK_TIME_LIMIT_S = 900


# On `default`, not `health`: a run may take a minute of HTTP, and the health tick (every 1 s)
# must never wait behind it.
@task(name="serving.consistency_probe", queue="default", time_limit=120)
def consistency_probe() -> dict[str, Any]:
    """Replay the golden prompts of the due slots through the Serve proxy (beat, every
    CONSISTENCY_PROBE_INTERVAL_S); quiet when no cluster is configured."""
    from serving.control.cluster import ray_target_from_env
    from serving.ops import consistency

    try:
        serve_url = ray_target_from_env().serve_url
    except Exception:  # no cluster configured: nothing serves, nothing to replay
        return {"probed": 0}
    scores = consistency.consistency_probe(serve_url=serve_url)
    return {"probed": len(scores)}


@task(
    name="serving.run_version_check",
    queue="checks",  # its own worker: a tenant's checks never delay anyone's validation
    time_limit=CHECK_TIME_LIMIT_S,
    idempotent=True,
)
def run_version_check(check_id: int) -> str | None:
    """Run one queued verification or benchmark of a version; a missing or finished check is
    left alone (a re-delivered task finds it done)."""
    from serving.ops.checks.services import version_check_run

    check = version_check_run(check_id=check_id)
    return None if check is None else check.status
