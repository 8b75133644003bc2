"""What other apps add to the GPU dashboard's deployments panel, without serving importing them.

An app registers a per-deployment count in its AppConfig.ready() (incidents: open incidents);
the panel shows each registered count under its name."""

from __future__ import annotations

from collections.abc import Callable

from tenants.models import Tenant

DeploymentCounts = Callable[[Tenant], dict[int, int]]
_counts: dict[str, DeploymentCounts] = {}


def register_deployment_counts(name: str, counts: DeploymentCounts) -> None:
    _counts[name] = counts


def deployment_counts(tenant: Tenant) -> dict[str, dict[int, int]]:
    """Every registered count for the tenant's deployments: {name: {deployment id: n}}."""
    return {name: counts(tenant) for name, counts in _counts.items()}
