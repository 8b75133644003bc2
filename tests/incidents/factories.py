"""Small factories for the incidents tests and the route matrices: objects built through the
services, on a world's `assistant` deployment."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from incidents import services
from incidents.models import CauseRule, Incident
from incidents.notifications.models import NotificationChannel
from serving.deployments.models import Deployment
from tenants.actors import Actor
from tests.conftest import TenantWorld


def deployment_of(world: TenantWorld) -> Deployment:
    return Deployment.objects.get(tenant=world.tenant, name="assistant")


def breach(
    world: TenantWorld,
    *,
    objective: str = "availability",
    group: str = "stable",
    severity: str = "page",
    detected_at: datetime | None = None,
    **extra: Any,
) -> tuple[Any, Incident, bool]:
    fields: dict[str, Any] = {
        "kind": "burn",
        "action": "rollback",
        "detail": "burn rate 14.4x over 1h/5m",
        "observed": {"error_ratio": 0.2},
        "burn_long": 15.0,
        "burn_short": 20.0,
        "contract_version": 1,
        **extra,
    }
    return services.breach_record(
        tenant=world.tenant,
        deployment=deployment_of(world),
        group=group,
        objective=objective,
        severity=severity,
        detected_at=detected_at or timezone.now() - timedelta(minutes=5),
        **fields,
    )


def incident_for_world(world: TenantWorld) -> Incident:
    return breach(world)[1]


def cause_rule_for_world(world: TenantWorld) -> CauseRule:
    return services.cause_rule_create(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        symptom="kv_usage",
        op="gte",
        threshold=0.9,
        cause="Tenant cache too small",
        fix="buy more blocks",
    )


def channel_for_world(world: TenantWorld) -> NotificationChannel:
    channel, _ = services.notification_channel_create(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        kind="webhook",
        name="ops-hook",
        url="https://hooks.example.net/portal",
    )
    return channel


def drill_for_world(world: TenantWorld) -> Any:
    from incidents import drills
    from incidents.drills.models import ChaosDrill

    existing = ChaosDrill.objects.filter(tenant=world.tenant).first()
    if existing is not None:
        return existing
    return drills.drill_create(
        tenant=world.tenant, actor=Actor(user=world.owner), deployment=deployment_of(world),
        name="latency drill", fault="latency_spike", parameters={"delay_ms": 300},
        duration_s=30,
    )  # fmt: skip


def drill_run_for_world(world: TenantWorld) -> Any:
    """A finished run (history): no matrix test injects a fault for real."""
    from incidents.drills.models import DrillRun, DrillStatus

    drill = drill_for_world(world)
    now = timezone.now()
    return DrillRun.objects.create(
        tenant=world.tenant, drill=drill, deployment=drill.deployment, fault=drill.fault,
        status=DrillStatus.PASSED, snapshot={"group": "stable"}, started_at=now,
        finished_at=now, verdict="the steady state held throughout",
    )  # fmt: skip
