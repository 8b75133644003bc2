"""A finished version check for the route matrices (tests.api_routes.OBJECT_FACTORIES): built
directly, so no matrix test loads an engine."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from serving.deployments.models import Deployment
from serving.ops.checks.models import CheckKind, CheckStatus, VersionCheck


def version_check_for_world(world: Any) -> VersionCheck:
    deployment = Deployment.objects.get(tenant=world.tenant, name="assistant")
    return VersionCheck.objects.create(
        tenant=world.tenant,
        version=deployment.current_revision.stable_version,
        kind=CheckKind.BENCHMARK,
        status=CheckStatus.DONE,
        params={"concurrencies": [1]},
        finished_at=timezone.now(),
    )
