"""Writes of a version's golden prompts: a tenant adds prompts of its own (bounded), and the
validation worker records the version's greedy answers to them from the version's checkpoint,
checked against the checksum validation recorded, so the answers are the validated weights'."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from portal import ratelimit
from portal.exceptions import ConflictError, ValidationFailed
from serving.registry import artifacts, golden
from serving.registry.models import ModelVersion, VersionStatus
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

logger = logging.getLogger(__name__)

GOLDEN_REQUESTS_PER_HOUR = 10  # per tenant: each one loads the checkpoint in a worker


def version_golden_throttle(*, tenant: Tenant) -> float:
    """Charge one golden-prompt change to the tenant's bucket; seconds to wait, else 0."""
    rate = GOLDEN_REQUESTS_PER_HOUR / 3600
    bucket = ratelimit.Bucket(f"golden:{tenant.pk}", rate, burst=GOLDEN_REQUESTS_PER_HOUR)
    return ratelimit.throttle([bucket])


def version_golden_request(
    *, tenant: Tenant, actor: Actor, version: ModelVersion, prompts: Any
) -> ModelVersion:
    """Ask for the version's answers to the default golden prompts plus `prompts` (at most
    golden.MAX_TENANT_PROMPTS) to be recorded; the validation worker does it."""
    from serving.registry.tasks import record_golden

    clean = golden.clean_prompts(prompts)
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk, tenant=tenant)
        if locked.status != VersionStatus.READY:
            raise ConflictError(
                f"The version is {locked.status}; golden answers are recorded from a ready one.",
                field="version",
            )
        if "builtin" not in (locked.engines or ["builtin"]):
            raise ValidationFailed(
                "Golden answers are recorded with the built-in engine; this version is "
                "validated for vLLM only.",
                field="version",
            )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="version.golden_requested",
            obj=locked,
            before={"tenant_prompts": (locked.golden or {}).get("tenant_prompts", [])},
            after={"tenant_prompts": clean},
        )
        transaction.on_commit(lambda: record_golden.delay(locked.pk, clean))
    return locked


def version_golden_record(*, version_id: int, prompts: list[str]) -> ModelVersion | None:
    """Record the version's greedy answers to the default prompts plus `prompts`, from its
    checkpoint; a checkpoint that no longer matches the validated checksum records nothing
    (logged). Returns None if the version is gone."""
    from serving.engine.checkpoint import directory_sha256

    version = ModelVersion.objects.filter(pk=version_id, status=VersionStatus.READY).first()
    if version is None:
        return None
    clean = golden.clean_prompts(prompts)
    directory = artifacts.local_directory(version.artifact_uri)
    if version.sha256 and directory_sha256(directory) != version.sha256:
        logger.error(
            "version %s: its files changed since validation; no answers recorded", version_id
        )
        return version
    document = golden.record(directory, clean)
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().filter(pk=version_id).first()
        if locked is None or locked.status != VersionStatus.READY:
            return locked
        locked.golden = document
        locked.save(update_fields=["golden"])
    return locked
