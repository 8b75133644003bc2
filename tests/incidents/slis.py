"""A small factory of stored SLI samples (what the health tick writes) for the incidents tests."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from serving.dataplane.sli import BOUNDS_MS
from serving.deployments.models import Deployment
from serving.ops.models import SliSample


def latency(ms: float, count: int) -> list[int]:
    """A histogram with `count` observations in the bucket of `ms`."""
    hist = [0] * (len(BOUNDS_MS) + 1)
    index = next((i for i, bound in enumerate(BOUNDS_MS) if ms <= bound), len(BOUNDS_MS))
    hist[index] = count
    return hist


def sample(
    deployment: Deployment,
    end: datetime,
    *,
    group: str = "stable",
    seconds: int = 10,
    requests: int = 100,
    errors: int = 0,
    rejected: int = 0,
    latency_ms: float = 40,
    kv: dict[str, Any] | None = None,
    resolution: int = 1,
) -> SliSample:
    return SliSample.objects.create(
        tenant=deployment.tenant,
        deployment=deployment,
        group=group,
        resolution=resolution,
        start=end - timedelta(seconds=seconds),
        end=end,
        requests=requests,
        errors=errors,
        rejected=rejected,
        latency=latency(latency_ms, requests),
        kv=kv or {},
    )
