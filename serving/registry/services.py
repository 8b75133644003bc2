"""All writes of the model registry: models, versions (by path or upload), validation.

Status moves only through `_set_status` (registered -> validating -> ready | failed); every
change writes its AuditEvent in the same transaction, and validation is enqueued on commit.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models.deletion import ProtectedError
from django.utils import timezone

from portal.exceptions import ConflictError, QuotaExceeded, ValidationFailed
from serving.engine.config import ConfigLimits, human_bytes
from serving.registry import artifacts, selectors
from serving.registry.models import (
    LABEL_RE,
    SHA256_RE,
    STATUS_TRANSITIONS,
    ArtifactSource,
    Model,
    ModelTask,
    ModelVersion,
    VersionStatus,
)
from tenants.actors import Actor
from tenants.models import Quota, Tenant
from tenants.services import audit_record

logger = logging.getLogger(__name__)

VALIDATOR = Actor(system="version_validate")
MODEL_FIELDS = ("name", "task", "description")
VERSION_FIELDS = ("label", "source", "artifact_uri", "status")
FILES_DELETED = "its uploaded files were deleted"
DEFAULT_VALIDATION_MAX_ATTEMPTS = 3
# ConfigLimits field -> the setting that overrides its default.
LIMIT_SETTINGS = {
    "max_vocab_size": "ENGINE_MAX_VOCAB_SIZE",
    "max_hidden_size": "ENGINE_MAX_HIDDEN_SIZE",
    "max_intermediate_size": "ENGINE_MAX_INTERMEDIATE_SIZE",
    "max_hidden_layers": "ENGINE_MAX_HIDDEN_LAYERS",
    "max_attention_heads": "ENGINE_MAX_ATTENTION_HEADS",
    "max_head_dim": "ENGINE_MAX_HEAD_DIM",
    "max_position_embeddings": "ENGINE_MAX_POSITION_EMBEDDINGS",
    "max_validation_bytes": "ENGINE_VALIDATION_MAX_BYTES",
    "max_tokenizer_bytes": "ENGINE_MAX_TOKENIZER_BYTES",
    "max_header_bytes": "ENGINE_MAX_SAFETENSORS_HEADER_BYTES",
    "max_tensors": "ENGINE_MAX_TENSORS",
}


def _full_clean(obj: models.Model) -> None:
    """full_clean() as a ValidationFailed naming the first bad field (uniqueness is checked
    by the callers, who answer 409)."""
    try:
        obj.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        field, messages = next(iter(exc.message_dict.items()))
        raise ValidationFailed(
            " ".join(messages), field=None if field == "__all__" else field
        ) from None


def _clean_sha256(value: str | None) -> str:
    sha = (value or "").strip().lower()
    if sha and not re.fullmatch(SHA256_RE, sha):
        raise ValidationFailed("Give the SHA-256 as 64 hex digits.", field="sha256")
    return sha


def _clean_label(label: str) -> str:
    label = (label or "").strip()
    if not label:
        raise ValidationFailed("A version label is required.", field="label")
    if len(label) > 64 or not re.fullmatch(LABEL_RE, label):
        raise ValidationFailed(
            "Use up to 64 letters, digits, '.', '_', '+' and '-', starting alphanumeric.",
            field="label",
        )
    return label


def _check_label_free(model: Model, label: str) -> None:
    if ModelVersion.objects.filter(tenant_id=model.tenant_id, model=model, label=label).exists():
        raise ConflictError(f"{model.name} already has a version {label!r}.", field="label")


# --- models --------------------------------------------------------------------------------


def model_create(
    *,
    tenant: Tenant,
    actor: Actor,
    name: str,
    task: str = ModelTask.TEXT_GENERATION,
    description: str = "",
) -> Model:
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("A model name is required.", field="name")
    if task not in ModelTask.values:
        raise ValidationFailed(f"Task must be one of {', '.join(ModelTask.values)}.", field="task")
    model = Model(
        tenant=tenant,
        name=name,
        task=task,
        description=(description or "").strip(),
        created_by_id=actor.user_id,
    )
    _full_clean(model)
    if Model.objects.filter(tenant=tenant, name=name).exists():
        raise ConflictError(f"A model named {name!r} exists.", field="name")
    try:
        with transaction.atomic():
            model.save()
            audit_record(
                tenant=tenant,
                actor=actor,
                action="model.created",
                obj=model,
                after={"name": name, "task": task, "description": model.description},
            )
    except IntegrityError:
        raise ConflictError(f"A model named {name!r} exists.", field="name") from None
    return model


def model_update(*, tenant: Tenant, actor: Actor, model: Model, description: str) -> Model:
    """Change a model's description (name and task are fixed once versions refer to them)."""
    with transaction.atomic():
        locked = Model.objects.select_for_update().get(pk=model.pk, tenant=tenant)
        before = {"description": locked.description}
        locked.description = (description or "").strip()
        _full_clean(locked)
        if locked.description == before["description"]:
            return locked
        locked.save(update_fields=["description"])
        audit_record(
            tenant=tenant,
            actor=actor,
            action="model.updated",
            obj=locked,
            before=before,
            after={"description": locked.description},
        )
    return locked


def model_delete(*, tenant: Tenant, actor: Actor, model: Model) -> None:
    """Delete a model and all its versions (uploaded artifacts leave the store on commit)."""
    with transaction.atomic():
        locked = Model.objects.select_for_update().get(pk=model.pk, tenant=tenant)
        for version in ModelVersion.objects.filter(tenant=tenant, model=locked).order_by("id"):
            _version_delete_locked(tenant=tenant, actor=actor, version=version)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="model.deleted",
            obj=locked,
            before={"name": locked.name, "task": locked.task},
        )
        try:
            with transaction.atomic():
                locked.delete()
        except ProtectedError:
            raise ConflictError(
                f"{locked.name} is still in use (deployed); remove its deployments first.",
                field="model",
            ) from None


# --- versions ------------------------------------------------------------------------------


def _enqueue_validation(version: ModelVersion) -> None:
    from serving.registry.tasks import validate_version

    version_id = version.pk
    transaction.on_commit(lambda: validate_version.delay(version_id))


def version_register_path(
    *,
    tenant: Tenant,
    actor: Actor,
    model: Model,
    label: str,
    path: str,
    sha256: str | None = None,
) -> ModelVersion:
    """Register a Hugging Face-layout directory on this machine; validation runs on commit.

    `sha256`, if given, is the expected directory checksum (see `directory_sha256`)."""
    if model.tenant_id != tenant.pk:
        raise ValidationFailed("No such model in this tenant.", field="model")
    label = _clean_label(label)
    expected = _clean_sha256(sha256)
    directory = artifacts.check_local_path(path)
    _check_label_free(model, label)
    version = ModelVersion(
        tenant=tenant,
        model=model,
        label=label,
        source=ArtifactSource.PATH,
        artifact_uri=artifacts.file_uri(directory),
        expected_sha256=expected,
        created_by_id=actor.user_id,
    )
    _full_clean(version)
    _save_new_version(tenant=tenant, actor=actor, version=version)
    return version


def _save_new_version(
    *,
    tenant: Tenant,
    actor: Actor,
    version: ModelVersion,
    extra: dict[str, Any] | None = None,
    validate: bool = True,
) -> None:
    try:
        with transaction.atomic():
            version.save()
            audit_record(
                tenant=tenant,
                actor=actor,
                action="model_version.registered",
                obj=version,
                after={
                    "label": version.label,
                    "source": version.source,
                    "artifact_uri": version.artifact_uri,
                    "expected_sha256": version.expected_sha256 or None,
                    **(extra or {}),
                },
            )
            if validate:
                _enqueue_validation(version)
    except IntegrityError:
        raise ConflictError(
            f"{version.model.name} already has a version {version.label!r}.", field="label"
        ) from None


def version_register_upload(
    *,
    tenant: Tenant,
    actor: Actor,
    model: Model,
    label: str,
    stream: artifacts.Readable,
    content_length: int | None = None,
    sha256: str | None = None,
) -> ModelVersion:
    """Register a version from an uploaded tar / tar.gz, streamed to the store under the size
    limit (PayloadTooLarge, 413). An archive that cannot be unpacked safely gives a version
    that is `failed` at once with the reason; nothing of it stays in the store."""
    if model.tenant_id != tenant.pk:
        raise ValidationFailed("No such model in this tenant.", field="model")
    label = _clean_label(label)
    expected = _clean_sha256(sha256)
    _check_label_free(model, label)
    received = artifacts.receive_upload(stream, content_length=content_length)
    version = ModelVersion(
        tenant=tenant,
        model=model,
        label=label,
        source=ArtifactSource.UPLOAD,
        expected_sha256=expected,
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
                step={"step": "unpack", "state": "failed", "seconds": _since(started)},
            )
            return version
        try:
            with transaction.atomic():
                # The quota row lock serialises a tenant's uploads from here to commit: two
                # concurrent uploads cannot both fit in the space that is left for one.
                _check_storage_quota(tenant=tenant, needed=contents.unpacked_bytes, lock=True)
                version.stored_bytes = contents.unpacked_bytes
                version.artifact_uri, installed = artifacts.install(unpacked, tenant_id=tenant.pk)
                _full_clean(version)
                _save_new_version(tenant=tenant, actor=actor, version=version, extra=extra)
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
        _full_clean(version)
        _save_new_version(tenant=tenant, actor=actor, version=version, extra=extra, validate=False)
        _set_status(version, VersionStatus.FAILED, actor=actor, reason=reason, steps=[step])


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


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 4)


_STATUS_ACTIONS: dict[str, str] = {
    VersionStatus.VALIDATING: "model_version.validation_started",
    VersionStatus.READY: "model_version.ready",
    VersionStatus.FAILED: "model_version.failed",
}


def _set_status(
    version: ModelVersion,
    status: str,
    *,
    actor: Actor,
    reason: str = "",
    steps: list[dict[str, Any]] | None = None,
    extra_fields: dict[str, Any] | None = None,
) -> None:
    """The one place a version changes status; refuses moves STATUS_TRANSITIONS lacks.

    Call inside a transaction, with `version` locked (or just created)."""
    old = version.status
    if status not in STATUS_TRANSITIONS[old]:
        raise ConflictError(f"A {old} version cannot become {status}.", field="status")
    now = timezone.now()
    version.status = status
    fields = ["status"]
    if status == VersionStatus.VALIDATING:
        version.validation_started_at = now
        version.failure_reason = ""
        fields += ["validation_started_at", "failure_reason"]
    elif status == VersionStatus.READY:
        version.ready_at = now
        fields.append("ready_at")
    elif status == VersionStatus.FAILED:
        version.failed_at = now
        version.failure_reason = reason[:2000]
        fields += ["failed_at", "failure_reason"]
    if steps is not None:
        version.validation_steps = steps
        fields.append("validation_steps")
    for name, value in (extra_fields or {}).items():
        setattr(version, name, value)
        fields.append(name)
    version.save(update_fields=fields)
    action = _STATUS_ACTIONS[status]
    after: dict[str, Any] = {"status": status}
    if reason:
        after["failure_reason"] = version.failure_reason
    if status == VersionStatus.READY:
        after["sha256"] = version.sha256
    audit_record(
        tenant=version.tenant,
        actor=actor,
        action=action,
        obj=version,
        before={"status": old},
        after=after,
    )


class _Progress:
    """Records each validation step in the row as it starts and ends (the pages poll it)."""

    def __init__(self, version_id: int) -> None:
        self.version_id = version_id
        self.steps: list[dict[str, Any]] = []
        self.started = time.perf_counter()

    def _close_running(self, state: str) -> None:
        if self.steps and self.steps[-1]["state"] == "running":
            self.steps[-1].update(state=state, seconds=_since(self.started))

    def _write(self) -> None:
        ModelVersion.objects.filter(pk=self.version_id, status=VersionStatus.VALIDATING).update(
            validation_steps=self.steps
        )

    def __call__(self, step: str) -> None:
        self._close_running("ok")
        self.started = time.perf_counter()
        self.steps.append({"step": step, "state": "running", "seconds": None})
        self._write()

    def finish(self, *, ok: bool) -> list[dict[str, Any]]:
        self._close_running("ok" if ok else "failed")
        return self.steps


def _failure_reason(exc: BaseException) -> str:
    from celery.exceptions import SoftTimeLimitExceeded

    if isinstance(exc, SoftTimeLimitExceeded):
        return "validation took longer than its time limit"
    return f"validation error: {type(exc).__name__}: {exc}"[:500]


def version_validate(*, tenant: Tenant, version_id: int) -> ModelVersion | None:
    """Validate a registered version: registered -> validating -> ready | failed.

    Runs the engine's checks (checksum, config, architecture, weights and shapes, tokenizer,
    one forward pass), recording each step as it goes. Returns None if the version is gone;
    a version already ready or failed is left as it is."""
    from serving.engine.checkpoint import validate_checkpoint
    from serving.engine.config import CheckpointError

    max_attempts = int(
        getattr(settings, "MODEL_VALIDATION_MAX_ATTEMPTS", DEFAULT_VALIDATION_MAX_ATTEMPTS)
    )
    with transaction.atomic():
        version = (
            ModelVersion.objects.select_for_update()
            .select_related("tenant", "model")
            .filter(pk=version_id, tenant=tenant)
            .first()
        )
        if version is None or version.is_final:
            return version
        if version.validation_attempts >= max_attempts:
            # Each earlier run was cut off (the worker died: out of memory, killed) and the
            # task came back (acks_late): running it again would only kill the next worker.
            _fail_version(
                version,
                reason=f"validation was interrupted {version.validation_attempts} times (the "
                "worker died); the checkpoint is refused",
                steps=[
                    {**step, "state": "failed"} if step.get("state") == "running" else step
                    for step in version.validation_steps
                ],
            )
            return version
        _set_status(
            version,
            VersionStatus.VALIDATING,
            actor=VALIDATOR,
            steps=[],
            extra_fields={"validation_attempts": version.validation_attempts + 1},
        )
        uri, expected = version.artifact_uri, version.expected_sha256 or None

    progress = _Progress(version_id)
    report = None
    reason = ""
    try:
        directory = artifacts.local_directory(uri)
        report = validate_checkpoint(
            directory, expected_sha256=expected, progress=progress, limits=config_limits()
        )
    except (CheckpointError, artifacts.ArtifactRejected) as exc:
        reason = exc.reason
    except Exception as exc:  # a crash must still end the version as failed, with the cause
        logger.exception("validation of model version %s crashed", version_id)
        reason = _failure_reason(exc)
    steps = progress.finish(ok=report is not None)

    with transaction.atomic():
        version = (
            ModelVersion.objects.select_for_update()
            .select_related("tenant", "model")
            .filter(pk=version_id, tenant=tenant)
            .first()
        )
        if version is None or version.status != VersionStatus.VALIDATING:
            return version
        if report is None:
            _fail_version(version, reason=reason, steps=steps)
        else:
            fields = {
                "sha256": report.sha256,
                "size_bytes": report.size_bytes,
                "format": report.format,
                "config_summary": report.summary(),
            }
            _set_status(
                version, VersionStatus.READY, actor=VALIDATOR, steps=steps, extra_fields=fields
            )
    return version


def config_limits() -> ConfigLimits:
    """The engine's checkpoint bounds, each overridable by its setting (LIMIT_SETTINGS)."""
    defaults = ConfigLimits()
    values = {
        name: int(getattr(settings, setting, getattr(defaults, name)))
        for name, setting in LIMIT_SETTINGS.items()
    }
    return ConfigLimits(**values)


def _fail_version(version: ModelVersion, *, reason: str, steps: list[dict[str, Any]]) -> None:
    """Fail a locked version; an upload's files leave the store once that commits (the
    reason says so) and stop counting against the storage quota. A registered local
    directory is the client's and is never touched."""
    uri = version.artifact_uri if version.source == ArtifactSource.UPLOAD else ""
    if uri:
        reason = f"{reason} ({FILES_DELETED})"
    _set_status(
        version,
        VersionStatus.FAILED,
        actor=VALIDATOR,
        reason=reason,
        steps=steps,
        extra_fields={"stored_bytes": 0},
    )
    if uri:
        transaction.on_commit(lambda: artifacts.remove_stored(uri))


def _version_delete_locked(*, tenant: Tenant, actor: Actor, version: ModelVersion) -> None:
    uri = version.artifact_uri
    audit_record(
        tenant=tenant,
        actor=actor,
        action="model_version.deleted",
        obj=version,
        before={"label": version.label, "status": version.status, "artifact_uri": uri},
    )
    try:
        with transaction.atomic():
            version.delete()
    except ProtectedError:
        raise ConflictError(
            f"Version {version.label} is still in use (deployed); remove its deployments first.",
            field="version",
        ) from None
    if version.source == ArtifactSource.UPLOAD:
        transaction.on_commit(lambda: artifacts.remove_stored(uri))


def version_delete(*, tenant: Tenant, actor: Actor, version: ModelVersion) -> None:
    """Delete a version; an uploaded artifact leaves the store once the delete commits (a
    registered local directory is the client's and is never touched)."""
    with transaction.atomic():
        locked = (
            ModelVersion.objects.select_for_update()
            .select_related("model")
            .get(pk=version.pk, tenant=tenant)
        )
        _version_delete_locked(tenant=tenant, actor=actor, version=locked)
