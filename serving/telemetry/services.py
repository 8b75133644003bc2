"""The writes of GPU telemetry: the agent stores the 1 s / 1 min rows of the spans that ended,
and a beat task prunes them (1 s rows after an hour, 1 min rows after 30 days). Both are the
platform's own rows, written by the system, so there is nothing to audit."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from serving.telemetry.models import GpuDeviceSample, GpuProcessSample, GpuResolution

SECOND_RETENTION_S = 3600 + 600  # 1 s rows: an hour (and a margin)
MINUTE_RETENTION_S = 30 * 86400


def store_samples(
    *, devices: Sequence[GpuDeviceSample], processes: Sequence[GpuProcessSample]
) -> None:
    """Insert the rows of the spans that ended (one batch per table)."""
    if devices:
        GpuDeviceSample.objects.bulk_create(devices)
    if processes:
        GpuProcessSample.objects.bulk_create(processes)


def prune_samples(*, now: float) -> dict[str, int]:
    """Drop 1 s rows older than an hour and 1 min rows older than 30 days."""
    out = {}
    models: tuple[tuple[type[GpuDeviceSample] | type[GpuProcessSample], str], ...] = (
        (GpuDeviceSample, "gpu_devices"),
        (GpuProcessSample, "gpu_processes"),
    )
    for model, name in models:
        seconds, _ = model.objects.filter(
            resolution=GpuResolution.SECOND,
            at__lt=datetime.fromtimestamp(now - SECOND_RETENTION_S, tz=UTC),
        ).delete()
        minutes, _ = model.objects.filter(
            resolution=GpuResolution.MINUTE,
            at__lt=datetime.fromtimestamp(now - MINUTE_RETENTION_S, tz=UTC),
        ).delete()
        out[name] = seconds + minutes
    return out
