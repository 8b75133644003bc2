"""One tenant's names or bad spec never block another tenant's changes (real Ray Serve).

* `assistant--canary` beside `assistant` with a canary: both deploy (they compiled to one Serve
  application before, and Serve refused the whole config);
* a revision Serve refuses (a row Serve answers with a 400) is marked failed with
  Serve's reason on that deployment, keeps its last good config serving, and the neighbour's
  key revocation in the same reconcile applies at once.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from django.utils import timezone

from serving.control import isolate
from serving.deployments import reconcile as control
from serving.deployments import services as deployments
from serving.deployments.models import Deployment, DeploymentRevision, DeploymentStatus
from serving.engine.testing import write_tiny_checkpoint
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.ray_cluster import RayCluster
from tests.serving.test_serving_ray import _apply, _key, _post, _ready_version, _served

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


def test_colliding_names_and_a_refused_spec_block_no_one(
    world_a: TenantWorld,
    world_b: TenantWorld,
    ray_cluster: RayCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    actor = Actor(user=world_a.owner)
    assistant = _served(world_a)
    v2 = _ready_version(world_a, write_tiny_checkpoint(tmp_path / "v2", seed=3), "v2")
    deployments.deployment_set_canary(
        tenant=world_a.tenant, actor=actor, deployment=assistant, version_id=v2.pk, percent=10
    )
    hostile, _ = deployments.deployment_create(
        tenant=world_a.tenant, actor=actor, name="assistant--canary", version_id=v2.pk,
        settings={"num_cpus": 0.25},
    )  # fmt: skip
    key_b = _key(world_b, _served(world_b))
    apps = ["acme.assistant", "acme.assistant.canary", "acme.assistant--canary",
            "globex.assistant"]  # fmt: skip
    _apply(ray_cluster, apps, timeout=180)
    for deployment in Deployment.objects.filter(deleted_at__isnull=True):
        assert deployment.status == DeploymentStatus.RUNNING, deployment.status_message

    url_b = f"{ray_cluster.serve_url}/globex/assistant/v1/completions"
    with httpx.Client(timeout=30, trust_env=False) as http:
        assert _post(http, url_b, key_b).status_code == 200

        # A revision Serve refuses (max_ongoing_requests 0: a row written behind the services' back),
        # in the same reconcile as the neighbour's key revocation. The local copy of Serve's
        # schema is switched off here, so that the real Serve answers the 400 and the
        # reconcile has to find the bad application among the changed ones.
        deployments.deployment_change(
            tenant=world_a.tenant, actor=actor, deployment=hostile, changes={"num_cpus": 0.2},
            reason="resize",
        )  # fmt: skip
        hostile.refresh_from_db()
        revision = hostile.current_revision
        DeploymentRevision.objects.filter(pk=revision.pk).update(max_ongoing_requests=0)
        key_row = _served(world_b).keys.get(name="test")
        deployments.inference_key_revoke(
            tenant=world_b.tenant, actor=Actor(user=world_b.owner), key=key_row
        )
        puts: list[int] = []
        real = isolate.apply_isolating

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            outcome = real(*args, **kwargs)
            puts.append(outcome.puts)
            return outcome

        monkeypatch.setattr(isolate, "apply_isolating", counted)
        with monkeypatch.context() as local:
            local.setattr(isolate, "schema_errors", lambda plan, unit: "")
            run = control.reconcile(target=ray_cluster.target)
        assert run.ok, run.error
        assert puts == [3]  # the whole config refused; the bad unit alone; the rest applied
        assert f"deployment:{hostile.pk}: Serve refused it" in run.error, run.error
        hostile.refresh_from_db()
        assert hostile.status == DeploymentStatus.FAILED
        assert "max_ongoing_requests" in hostile.status_message, hostile.status_message
        # The neighbour's revocation applied: its key is refused on its own route now.
        for _ in range(50):
            if _post(http, url_b, key_b).status_code == 401:
                break
        assert _post(http, url_b, key_b).status_code == 401
        # The refused deployment's last good config keeps serving, and the status refresh
        # keeps the refusal on it.
        assert ray_cluster.client().applications()["acme.assistant--canary"].status == "RUNNING"
        control.refresh_status(client=ray_cluster.client())
        hostile.refresh_from_db()
        assert hostile.status == DeploymentStatus.FAILED

        # With the local schema check on, such a row is refused before anything is sent (no
        # PUT at all: nothing else changed).
        DeploymentRevision.objects.filter(pk=revision.pk).update(max_ongoing_requests=16)
        deployments.deployment_change(
            tenant=world_a.tenant, actor=actor, deployment=hostile, changes={"num_cpus": 0.3},
            reason="retry",
        )  # fmt: skip
        hostile.refresh_from_db()
        DeploymentRevision.objects.filter(pk=hostile.current_revision_id).update(
            max_ongoing_requests=0
        )
        again = control.reconcile(target=ray_cluster.target)
        assert puts[-1] == 0 and "Serve's schema refuses" in again.error, again.error
        # A good revision afterwards applies, and the deployment leaves the refusal behind.
        DeploymentRevision.objects.filter(pk=hostile.current_revision_id).update(
            max_ongoing_requests=16
        )
        control.reconcile(target=ray_cluster.target, force=True)
        control.refresh_status(client=ray_cluster.client())
        hostile.refresh_from_db()
        assert hostile.status != DeploymentStatus.FAILED, hostile.status_message


def test_another_owners_applications_survive_every_reconcile(
    world_a: TenantWorld, ray_cluster: RayCluster
) -> None:
    """The portal shares its Serve instance: an application it does not own, deployed through
    Serve's REST API beside the portal's, stays (same replica, no restart) through the portal's
    reconciles, which name it back unchanged; the portal's own changes still apply."""
    Deployment.objects.exclude(tenant=world_a.tenant).update(deleted_at=timezone.now())
    _apply(ray_cluster, ["acme.assistant"], timeout=180)
    client = ray_cluster.client()
    # Another team's PUT: everything that runs, plus its own app.
    details = client.details()
    running = [app["deployed_app_config"] for app in details["applications"].values()]
    foreign = {
        "name": "team-x", "route_prefix": "/team-x",
        "import_path": "tests.serving.serve_echo_app:app",
        "runtime_env": {"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}},
        "deployments": [{"name": "Echo", "user_config": {"value": "theirs"},
                         "ray_actor_options": {"num_cpus": 0.1}}],
    }  # fmt: skip
    client.put({"applications": [*running, foreign]})
    client.wait_until(["team-x"], timeout=120)
    pid = {r.pid for r in client.replicas("team-x")}
    # A portal change: a new key (user_config) and a new deployment (a new application).
    deployment = _served(world_a)
    _key(world_a, deployment)
    v1 = deployment.current_revision.stable_version_id
    deployments.deployment_create(
        tenant=world_a.tenant, actor=Actor(user=world_a.owner), name="second", version_id=v1,
        settings={"num_cpus": 0.25},
    )  # fmt: skip
    run = control.reconcile(target=ray_cluster.target)
    assert run.ok and not run.skipped, run.error
    client.wait_until(["acme.second", "team-x"], timeout=120)
    assert {r.pid for r in client.replicas("team-x")} == pid  # not restarted
    with httpx.Client(timeout=30, trust_env=False) as http:
        assert http.get(f"{ray_cluster.serve_url}/team-x").json()["value"] == "theirs"
    # Nothing changed: the next reconcile is skipped, the foreign app counted as applied.
    assert control.reconcile(target=ray_cluster.target).skipped
    # The portal's deployments go; the other owner's app stays.
    Deployment.objects.update(deleted_at=timezone.now())
    control.reconcile(target=ray_cluster.target)
    client.wait_until(["acme.assistant", "acme.second"], ["ABSENT"], timeout=120)
    assert "team-x" in client.applications()
    client.put({"applications": []})  # the other team's cleanup
