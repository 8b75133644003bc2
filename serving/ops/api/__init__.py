"""The ops loop in the API: contracts (YAML, OpenSLO), health, SLI history, rollbacks,
rollout policy and rollouts of a deployment. By capability: `serializers`, `deployment` (the
routes under deployments/{id}/), `rollouts` (the tenant's rollouts and rollbacks); this package
re-exports their public names (serving/api/urls.py registers the viewsets from here)."""

from __future__ import annotations

from serving.ops.api.deployment import DeploymentOpsViewSet
from serving.ops.api.rollouts import RollbackViewSet, RolloutViewSet
from serving.ops.api.serializers import (
    ContractInSerializer,
    ContractSerializer,
    FeaturesSerializer,
    PolicySerializer,
    RollbackInSerializer,
    RollbackSerializer,
    RolloutSerializer,
    RolloutStartSerializer,
    SliPointSerializer,
    StepSerializer,
)

__all__ = [
    "ContractInSerializer",
    "ContractSerializer",
    "DeploymentOpsViewSet",
    "FeaturesSerializer",
    "PolicySerializer",
    "RollbackInSerializer",
    "RollbackSerializer",
    "RollbackViewSet",
    "RolloutSerializer",
    "RolloutStartSerializer",
    "RolloutViewSet",
    "SliPointSerializer",
    "StepSerializer",
]
