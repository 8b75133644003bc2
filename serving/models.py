"""The serving app's models, for Django only: each room owns its models (import them from
serving.<room>.models; a convention test keeps everything else off this module)."""

from serving.deployments.models import (  # noqa: F401
    Deployment,
    DeploymentRevision,
    DeploymentStatus,
    InferenceKey,
    KvMode,
    ReconcileLock,
    ReconcileRun,
    SharedPool,
)
from serving.ops.checks.models import VersionCheck  # noqa: F401
from serving.ops.models import (  # noqa: F401
    AnalysisResult,
    AnalysisRun,
    Resolution,
    Rollback,
    RollbackStatus,
    Rollout,
    RolloutPolicy,
    RolloutStatus,
    SlaContract,
    SliSample,
)
from serving.ops.remediation.models import RemediationRun, RemediationStep  # noqa: F401
from serving.registry.models import (  # noqa: F401
    ArtifactSource,
    Model,
    ModelTask,
    ModelVersion,
    VersionStatus,
)
from serving.telemetry.models import (  # noqa: F401
    GpuDeviceSample,
    GpuProcessSample,
    GpuResolution,
)

__all__ = [
    "AnalysisResult",
    "AnalysisRun",
    "ArtifactSource",
    "Deployment",
    "DeploymentRevision",
    "DeploymentStatus",
    "GpuDeviceSample",
    "GpuProcessSample",
    "GpuResolution",
    "InferenceKey",
    "KvMode",
    "Model",
    "ModelTask",
    "ModelVersion",
    "ReconcileLock",
    "ReconcileRun",
    "Resolution",
    "RemediationRun",
    "RemediationStep",
    "Rollback",
    "RollbackStatus",
    "Rollout",
    "RolloutPolicy",
    "RolloutStatus",
    "SharedPool",
    "SlaContract",
    "SliSample",
    "VersionCheck",
    "VersionStatus",
]
