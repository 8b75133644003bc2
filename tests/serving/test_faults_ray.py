"""Chaos faults on a real local Ray cluster, injected the only way they can be: a revision
whose spec carries them, reconciled into the slot's user_config. A `replica_crash` makes the
replica exit; Serve starts another (which, started after the drill, does not crash again)
and the deployment answers again."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from serving.control.serve_api import AppStatus
from serving.deployments import services as deployments
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_serving_ray import _apply, _key, _pids, _post, _served

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


def _wait(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.25)


def test_a_replica_crash_fault_restarts_the_replica_once(
    world_a: TenantWorld, ray_cluster: RayCluster
) -> None:
    deployment = _served(world_a)
    key = _key(world_a, deployment)
    app = "acme.assistant"
    url = f"{ray_cluster.serve_url}/acme/assistant/v1/completions"
    _apply(ray_cluster, [app])
    before = _pids(ray_cluster, app)
    assert len(before) == 1
    with httpx.Client(timeout=30, trust_env=False) as http:
        assert _post(http, url, key).status_code == 200

        issued = time.time()
        faults = {"stable": {"drill": "ray-crash", "issued_at": issued,
                             "expires_at": issued + 300, "replica_crash": {"after_s": 1}}}  # fmt: skip
        deployments.deployment_change(
            tenant=world_a.tenant, actor=Actor(user=world_a.owner), deployment=deployment,
            changes={"faults": faults}, reason="drill: crash the stable replica",
        )  # fmt: skip
        _apply(ray_cluster, [app])  # user_config only: the live replica is reconfigured

        def restarted() -> bool:
            running = [r for r in ray_cluster.client().replicas(app) if r.state == "RUNNING"]
            return bool(running) and all(r.pid not in before for r in running)

        _wait(restarted, "Serve restarted the crashed replica", timeout=60)
        ray_cluster.client().wait_until([app], [AppStatus.RUNNING], timeout=60)
        after = _pids(ray_cluster, app)

        def answers() -> bool:
            return _post(http, url, key).status_code == 200

        _wait(answers, "the deployment answers again", timeout=30)
        statuses = [_post(http, url, key).status_code for _ in range(10)]
        assert statuses == [200] * 10
        # The replacement started after issued_at: the fault, still in force, spares it.
        time.sleep(2.5)
        assert _pids(ray_cluster, app) == after
        assert _post(http, url, key).status_code == 200
