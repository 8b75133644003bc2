"""Celery tasks of the registry: validating a version."""

from __future__ import annotations

from portal.celery import task
from serving.registry import services
from serving.registry.models import ModelVersion

# Checksumming, loading and one forward pass of a multi-GiB checkpoint on CPU take minutes.
VALIDATION_TIME_LIMIT_S = 1800


# Its own queue and worker (`up` runs one): a long validation never holds up a reconcile or a
# health tick, and they never hold it up.
@task(
    name="serving.validate_version",
    queue="validation",
    time_limit=VALIDATION_TIME_LIMIT_S,
    idempotent=True,
)
def validate_version(version_id: int) -> str | None:
    """Validate one model version; a missing or already finished version is left alone.

    Acknowledged late, so a worker killed mid-validation hands it to another; the service
    counts the runs and fails the version after MODEL_VALIDATION_MAX_ATTEMPTS instead of
    letting one poisonous checkpoint kill worker after worker."""
    version = ModelVersion.objects.select_related("tenant").filter(pk=version_id).first()
    if version is None or version.is_final:
        return None
    result = services.version_validate(tenant=version.tenant, version_id=version_id)
    return None if result is None else result.status


@task(name="serving.record_golden", queue="validation", time_limit=600, idempotent=True)
def record_golden(version_id: int, prompts: list[str]) -> int | None:
    """Record a ready version's answers to its golden prompts (the defaults and `prompts`);
    a gone version is left alone. Returns how many were recorded."""
    from serving.registry.services.golden import version_golden_record

    version = version_golden_record(version_id=version_id, prompts=prompts)
    return None if version is None else len((version.golden or {}).get("prompts", []))
