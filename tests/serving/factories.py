"""Objects of the ops loop for the route matrices (tests.api_routes.OBJECT_FACTORIES): built
directly, as finished history, so no matrix test starts a rollout or a rollback for real."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from serving.deployments.models import Deployment
from serving.ops.models import Rollback, RollbackStatus, Rollout, RolloutStatus


def _served(world: Any) -> Deployment:
    return Deployment.objects.select_related("current_revision").get(
        tenant=world.tenant, name="assistant"
    )


def rollout_for_world(world: Any) -> Rollout:
    deployment = _served(world)
    revision = deployment.current_revision
    return Rollout.objects.create(
        tenant=world.tenant, deployment=deployment, canary_version_id=revision.stable_version_id,
        base_revision=revision, steps=[{"weight": 20, "pause_s": 0}],
        status=RolloutStatus.ABORTED, finished_at=timezone.now(),
    )  # fmt: skip


def rollback_for_world(world: Any) -> Rollback:
    deployment = _served(world)
    revision = deployment.current_revision
    now = timezone.now()
    return Rollback.objects.create(
        tenant=world.tenant, deployment=deployment, key=f"factory:{deployment.pk}",
        trigger="manual", from_revision=revision, to_revision=revision,
        status=RollbackStatus.DONE, detected_at=now, started_at=now, finished_at=now,
    )  # fmt: skip
