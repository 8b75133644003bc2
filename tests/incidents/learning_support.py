"""Helpers of the incidents-that-learn tests: Serve's message on a world's deployment (what
the reconcile's status refresh writes), an incident on it, a rule that doubles a cause."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone

from incidents import services
from incidents.models import Incident
from serving.deployments.models import Deployment
from tenants.actors import Actor
from tests.conftest import TenantWorld
from tests.incidents.factories import breach, deployment_of

OOM = (
    "Deployment 'stable' in application 't3-assistant' is UNHEALTHY\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
)


def serve_says(world: TenantWorld, message: str, status: str = "unhealthy") -> Deployment:
    """Serve's message on the world's deployment, as `refresh_status` copies it."""
    deployment = deployment_of(world)
    Deployment.objects.filter(pk=deployment.pk).update(
        status=status, status_message=message, status_at=timezone.now()
    )
    return Deployment.objects.get(pk=deployment.pk)


def incident_of(world: TenantWorld, objective: str = "availability", **extra: Any) -> Incident:
    """A breach now (after the deployment's first revision) and the incident it opens."""
    extra.setdefault("detected_at", timezone.now())
    return breach(world, objective=objective, **extra)[1]


def resolved(world: TenantWorld, incident: Incident) -> Incident:
    return services.incident_resolve(
        tenant=world.tenant, actor=Actor(user=world.owner), incident=incident
    )


def rival_rule(world: TenantWorld, weight: float = 3.0) -> None:
    """A second cause of the same symptom: 'Batch too large' (3.0) beside 'Out of GPU memory'
    (4.0), so one vote can swap them."""
    services.cause_rule_create(
        tenant=world.tenant,
        actor=Actor(user=world.owner),
        symptom="serve_out_of_memory",
        op="gt",
        threshold=0,
        cause="Batch too large",
        fix="lower max_num_seqs",
        weight=weight,
    )


def api(name: str, **kwargs: Any) -> str:
    return reverse(name, kwargs=kwargs or None)


def page(world: TenantWorld, name: str, **kwargs: Any) -> str:
    return reverse(name, kwargs={"slug": world.tenant.slug, **kwargs})


def hours_ago(hours: float) -> Any:
    return timezone.now() - timedelta(hours=hours)
