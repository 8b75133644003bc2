"""A tenant's drills touch only its own replicas and traffic, within its own quotas
(incidents.drills.policy): platform faults and shared pools are for platform staff, a leak is
bounded by the replica's memory share, a flood by the deployment's capacity, drills and
concurrent runs by the tenant's quota; a suspended tenant runs no drill."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from incidents import drills
from incidents.drills.models import ChaosDrill, DrillRun, DrillStatus
from portal.exceptions import ConflictError, PermissionDeniedError, QuotaExceeded, ValidationFailed
from serving.deployments import services as deploy
from serving.deployments.models import Deployment, DeploymentRevision, DeploymentStatus, SharedPool
from tenants import services as tenant_services
from tenants.actors import Actor
from tenants.models import AuditEvent, Quota
from tests.conftest import TenantWorld
from tests.serving.test_ops_loop import _ready

pytestmark = pytest.mark.django_db

NO_CONTRACT = {"contract": False, "probes": [{"sli": "error_rate", "max": 0.5}]}


def _staff() -> User:
    user, _ = User.objects.get_or_create(
        username="sre@platform.example", defaults={"email": "sre@platform.example",
                                                   "is_staff": True},
    )  # fmt: skip
    return user


def _data(fault: str, **extra: Any) -> dict[str, Any]:
    return {"name": f"{fault} {time.monotonic_ns()}", "fault": fault, "group": "stable",
            "duration_s": 10, "steady_state": NO_CONTRACT, **extra}  # fmt: skip


def _create(world: TenantWorld, deployment: Deployment, actor: Actor, fault: str,
            **extra: Any) -> ChaosDrill:  # fmt: skip
    return drills.drill_create(
        tenant=world.tenant, actor=actor, deployment=deployment, **_data(fault, **extra)
    )


def test_control_plane_faults_are_for_platform_staff(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    for who in (world_a.owner, world_a.operator):
        with pytest.raises(PermissionDeniedError) as exc:
            _create(world_a, deployment, Actor(user=who), "control_plane_delay")
        assert exc.value.field == "fault" and "platform staff" in exc.value.message
    assert not ChaosDrill.objects.exists()
    drill = _create(world_a, deployment, Actor(user=_staff()), "control_plane_delay")
    # The tenant cannot start the platform's drill either, nor change it.
    with pytest.raises(PermissionDeniedError):
        drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    with pytest.raises(PermissionDeniedError):
        drills.drill_update(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill,
                            description="mine now")  # fmt: skip
    # Its cron schedule runs it (the schedule acts for the staff member who made it).
    run = drills.run_start(tenant=world_a.tenant, actor=Actor(system="schedule"), drill=drill)
    assert run.status == DrillStatus.SCHEDULED


def test_a_deployment_on_a_shared_pool_is_drilled_by_staff_only(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    drill = _create(world_a, deployment, Actor(user=world_a.owner), "error_burst",
                    traffic_share=0.5)  # fmt: skip
    pool = SharedPool.objects.create(name="shared", model_version=world_a.version)
    DeploymentRevision.objects.filter(pk=deployment.current_revision_id).update(
        kv_mode="shared", pool=pool
    )
    # Created on a dedicated deployment, the run is refused once it serves from a pool.
    with pytest.raises(PermissionDeniedError) as exc:
        drills.run_start(tenant=world_a.tenant, actor=Actor(user=world_a.owner), drill=drill)
    assert exc.value.field == "deployment" and "shared pool" in exc.value.message
    with pytest.raises(PermissionDeniedError):
        _create(world_a, deployment, Actor(user=world_a.owner), "replica_crash")
    assert drills.run_start(tenant=world_a.tenant, actor=Actor(user=_staff()), drill=drill)


def test_a_leak_is_bounded_by_the_replicas_own_memory_share(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)  # 0.25 CPUs: 512 MB of host memory, a leak of 256 MB at most
    owner = Actor(user=world_a.owner)
    with pytest.raises(ValidationFailed) as exc:
        _create(world_a, deployment, owner, "gpu_memory_leak", replica_share=1,
                parameters={"max_mb": 1_000_000})  # fmt: skip
    assert exc.value.field == "parameters.max_mb"
    assert "at most 256 MB" in exc.value.message and "0.25 CPU" in exc.value.message
    # Staff are bounded too: the replica's neighbours on the node are someone's.
    with pytest.raises(ValidationFailed):
        _create(world_a, deployment, Actor(user=_staff()), "gpu_memory_leak",
                replica_share=1, parameters={"max_mb": 257})  # fmt: skip
    drill = _create(world_a, deployment, owner, "gpu_memory_leak", replica_share=1)
    assert drill.parameters["max_mb"] == 256  # the default fits a small replica
    # A GPU replica's share is its device memory.
    DeploymentRevision.objects.filter(pk=deployment.current_revision_id).update(num_gpus=1)
    deployment.refresh_from_db()
    assert _create(world_a, deployment, owner, "gpu_memory_leak", replica_share=1,
                   parameters={"max_mb": 40_000})  # fmt: skip


def test_a_flood_is_bounded_by_the_deployments_own_capacity(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    revision = deployment.current_revision
    capacity = (revision.num_replicas or 1) * revision.max_ongoing_requests
    owner = Actor(user=world_a.owner)
    with pytest.raises(ValidationFailed) as exc:
        _create(world_a, deployment, owner, "token_starvation",
                parameters={"concurrency": capacity + 1})  # fmt: skip
    assert exc.value.field == "parameters.concurrency" and f"at most {capacity}" in (
        exc.value.message
    )
    assert _create(world_a, deployment, owner, "token_starvation",
                   parameters={"concurrency": capacity})  # fmt: skip


def test_drills_and_concurrent_runs_are_bounded_by_the_quota(
    world_a: TenantWorld, world_b: TenantWorld
) -> None:
    deployment = _ready(world_a)
    owner = Actor(user=world_a.owner)
    Quota.objects.filter(tenant=world_a.tenant).update(max_drills=2, max_concurrent_drill_runs=1)
    first = _create(world_a, deployment, owner, "error_burst", traffic_share=0.2)
    _create(world_a, deployment, owner, "latency_spike", traffic_share=0.2)
    with pytest.raises(QuotaExceeded) as exc:
        _create(world_a, deployment, owner, "replica_hang")
    assert "max_drills" in exc.value.message and ChaosDrill.objects.count() == 2
    # A second deployment of the tenant: one run at a time in all (its quota).
    other, _ = deploy.deployment_create(
        tenant=world_a.tenant, actor=owner, name="second",
        version_id=deployment.current_revision.stable_version_id, settings={"num_cpus": 0.25},
    )  # fmt: skip
    Deployment.objects.filter(pk=other.pk).update(status=DeploymentStatus.RUNNING)
    Quota.objects.filter(tenant=world_a.tenant).update(max_drills=3)
    on_other = _create(world_a, other, owner, "error_burst", traffic_share=0.2)
    drills.run_start(tenant=world_a.tenant, actor=owner, drill=first)
    with pytest.raises(ConflictError) as exc:
        drills.run_start(tenant=world_a.tenant, actor=owner, drill=on_other)
    assert exc.value.field == "drill" and "max_concurrent_drill_runs" in exc.value.message
    # The neighbour's quota is its own.
    b_deployment = _ready(world_b)
    b_drill = _create(world_b, b_deployment, Actor(user=world_b.owner), "error_burst",
                      traffic_share=0.2)  # fmt: skip
    assert drills.run_start(tenant=world_b.tenant, actor=Actor(user=world_b.owner), drill=b_drill)


def test_a_suspended_tenant_starts_no_drill_and_its_run_aborts(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    owner = Actor(user=world_a.owner)
    drill = _create(world_a, deployment, owner, "error_burst", traffic_share=0.2)
    run = drills.run_start(tenant=world_a.tenant, actor=owner, drill=drill)
    now = time.time()
    drills.run_advance(run.pk, now)  # checking
    with pytest.raises(PermissionDeniedError):
        tenant_services.tenant_set_suspended(
            tenant=world_a.tenant, actor=owner, suspended=True, reason="abuse"
        )
    tenant_services.tenant_set_suspended(
        tenant=world_a.tenant, actor=Actor(user=_staff()), suspended=True, reason="abuse"
    )
    assert AuditEvent.objects.filter(tenant=world_a.tenant, action="tenant.suspended").exists()
    for step in range(1, 6):
        if drills.run_advance(run.pk, now + step) is None:
            break
    run.refresh_from_db()
    assert run.status == DrillStatus.ABORTED and "suspended" in run.verdict
    deployment.refresh_from_db()
    assert not (deployment.current_revision.faults or {})  # nothing left in
    with pytest.raises(PermissionDeniedError) as exc:
        drills.run_start(tenant=world_a.tenant, actor=Actor(user=_staff()), drill=drill)
    assert "suspended" in exc.value.message
    assert DrillRun.objects.filter(tenant=world_a.tenant).count() == 1


def test_the_api_refuses_a_tenants_platform_drill_naming_the_field(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    response = world_a.client().post(
        "/api/v1/drills/", {**_data("control_plane_delay"), "deployment": deployment.pk},
        format="json",
    )  # fmt: skip
    assert response.status_code == 403, response.content
    assert "fault" in str(response.json())
    assert not ChaosDrill.objects.exists()


def test_staff_suspend_a_tenant_in_the_admin(world_a: TenantWorld) -> None:
    staff = _staff()
    staff.is_superuser = True
    staff.set_password("pw-for-the-admin-1")
    staff.save()
    client = Client()
    client.force_login(staff)
    response = client.post(
        "/admin/tenants/tenant/",
        {"action": "suspend", "_selected_action": [world_a.tenant.pk]},
    )
    assert response.status_code == 302
    world_a.tenant.refresh_from_db()
    assert not world_a.tenant.is_active
    assert AuditEvent.objects.filter(tenant=world_a.tenant, action="tenant.suspended").exists()


def test_a_deployments_own_leak_fault_is_bounded_the_same_way(world_a: TenantWorld) -> None:
    deployment = _ready(world_a)
    leak = {"stable": {"gpu_memory_leak": {"mb_per_s": 10, "max_mb": 100_000}}}
    before = deployment.current_revision_id
    with pytest.raises(ValidationFailed) as exc:
        deploy.deployment_change(tenant=world_a.tenant, actor=Actor(user=world_a.owner),
                                 deployment=deployment, changes={"faults": leak}, reason="leak")  # fmt: skip
    assert exc.value.field == "faults.stable.gpu_memory_leak.max_mb"
    assert "at most 256 MB" in exc.value.message
    deployment.refresh_from_db()
    assert deployment.current_revision_id == before  # nothing written


def test_a_suspended_tenants_warm_token_is_refused_at_once(world_a: TenantWorld) -> None:
    client = world_a.client()
    assert client.get("/api/v1/deployments/").status_code == 200  # the token is now cached
    tenant_services.tenant_set_suspended(
        tenant=world_a.tenant, actor=Actor(user=_staff()), suspended=True, reason="abuse"
    )
    assert client.get("/api/v1/deployments/").status_code == 401
    from tenants.auth import token_cache

    token_cache.clear()  # once every cache has let the token go, the reason is the suspension
    response = client.get("/api/v1/deployments/")
    assert response.status_code in (401, 403)
