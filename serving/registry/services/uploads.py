"""Versions registered from an uploaded tar / tar.gz: streamed to the store under the size
limit, scanned, checked against the tenant's storage quota, unpacked and installed; an archive
that cannot be unpacked safely gives a version that is `failed` at once with the reason.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.db import transaction

from portal.exceptions import QuotaExceeded, ValidationFailed
from serving.engine.config import human_bytes
from serving.registry import artifacts, selectors
from serving.registry.checks import (
    check_label_free,
    clean_engines,
    clean_label,
    clean_sha256,
    full_clean,
    since,
)
from serving.registry.models import ArtifactSource, Model, ModelVersion, VersionStatus
from serving.registry.services.versions import FILES_DELETED, save_new_version, set_status
from tenants.actors import Actor
from tenants.models import Quota, Tenant


def version_register_upload(
    *,
    tenant: Tenant,
    actor: Actor,
    model: Model,
    label: str,
    stream: artifacts.Readable,
    content_length: int | None = None,
    sha256: str | None = None,
    engines: Any = None,
) -> ModelVersion:
    """Register a version from an uploaded tar / tar.gz, streamed to the store under the size
    limit (PayloadTooLarge, 413). An archive that cannot be unpacked safely gives a version
    that is `failed` at once with the reason; nothing of it stays in the store."""
    if model.tenant_id != tenant.pk:
        raise ValidationFailed("No such model in this tenant.", field="model")
    label = clean_label(label)
    expected = clean_sha256(sha256)
    wanted = clean_engines(engines)
    check_label_free(model, label)
    received = artifacts.receive_upload(stream, content_length=content_length)
    version = ModelVersion(
        tenant=tenant,
        model=model,
        label=label,
        source=ArtifactSource.UPLOAD,
        expected_sha256=expected,
        engines=wanted,
        size_bytes=received.size_bytes,
        created_by_id=actor.user_id,
    )
    extra: dict[str, Any] = {
        "archive_bytes": received.size_bytes,
        "archive_sha256": received.sha256,
    }
    installed: Path | None = None
    try:
        started = time.perf_counter()
        try:
            # Headers only, nothing written: what the archive would unpack to.
            contents = artifacts.scan_archive(received.path)
            extra["unpacked_bytes"] = contents.unpacked_bytes
            # Refused before a byte is extracted (re-checked under the lock below).
            _check_storage_quota(tenant=tenant, needed=contents.unpacked_bytes, lock=False)
            unpacked = artifacts.unpack_upload(received.path)
        except artifacts.ArtifactRejected as exc:
            artifacts.discard(received.path)  # unpack_upload already removed its folder
            _save_failed_upload(
                tenant=tenant,
                actor=actor,
                version=version,
                extra=extra,
                reason=f"{exc.reason} ({FILES_DELETED})",
                step={"step": "unpack", "state": "failed", "seconds": since(started)},
            )
            return version
        try:
            with transaction.atomic():
                # The quota row lock serialises a tenant's uploads from here to commit: two
                # concurrent uploads cannot both fit in the space that is left for one.
                _check_storage_quota(tenant=tenant, needed=contents.unpacked_bytes, lock=True)
                version.stored_bytes = contents.unpacked_bytes
                version.artifact_uri, installed = artifacts.install(unpacked, tenant_id=tenant.pk)
                full_clean(version)
                save_new_version(tenant=tenant, actor=actor, version=version, extra=extra)
        finally:
            artifacts.discard(unpacked.workdir)
    except BaseException:
        if installed is not None:
            artifacts.discard(installed)
        raise
    finally:
        artifacts.discard(received.path)
    return version


def _save_failed_upload(
    *,
    tenant: Tenant,
    actor: Actor,
    version: ModelVersion,
    extra: dict[str, Any],
    reason: str,
    step: dict[str, Any],
) -> None:
    with transaction.atomic():
        full_clean(version)
        save_new_version(tenant=tenant, actor=actor, version=version, extra=extra, validate=False)
        set_status(
            version=version, status=VersionStatus.FAILED, actor=actor, reason=reason, steps=[step]
        )


def _check_storage_quota(*, tenant: Tenant, needed: int, lock: bool) -> None:
    """QuotaExceeded naming `artifact` when `needed` more bytes would take the tenant past
    its storage quota. With `lock`, the tenant's Quota row stays locked until the caller's
    transaction ends, so the bytes it then records cannot be promised twice."""
    quotas = Quota.objects.select_for_update() if lock else Quota.objects.all()
    quota = quotas.get(tenant=tenant)
    used = selectors.storage_used_bytes(tenant=tenant)
    if used + needed > quota.max_storage_bytes:
        raise QuotaExceeded(
            f"The archive unpacks to {human_bytes(needed)}; the tenant's storage quota is "
            f"{human_bytes(quota.max_storage_bytes)} with {human_bytes(used)} used "
            "(max_storage_bytes). Delete versions you no longer need, or ask the platform "
            "team for more.",
            field="artifact",
        )
