"""Remediation runs (reads): a deployment's runs with their steps, for the API."""

from __future__ import annotations

from django.db.models import QuerySet

from serving.deployments.models import Deployment
from serving.ops.remediation.models import RemediationRun
from tenants.models import Tenant

RUNS_SHOWN = 50


def remediation_run_list(*, tenant: Tenant, deployment: Deployment) -> QuerySet[RemediationRun]:
    """The newest RUNS_SHOWN runs of the deployment, their steps prefetched (two queries)."""
    return (
        RemediationRun.objects.filter(tenant=tenant, deployment=deployment)
        .prefetch_related("step_rows")
        .order_by("-created_at", "-pk")[:RUNS_SHOWN]
    )
