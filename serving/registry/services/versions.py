"""Models and versions of the registry: create, update and delete a model; register a version
by path; delete a version; and `set_status`, the one place a version changes status.

Every change writes its AuditEvent in the same transaction, and validation is enqueued on
commit (serving.registry.tasks.validate_version).
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.deletion import ProtectedError
from django.utils import timezone

from portal.exceptions import ConflictError, ValidationFailed
from serving.registry import artifacts
from serving.registry.checks import (
    check_label_free,
    clean_engines,
    clean_label,
    clean_sha256,
    full_clean,
)
from serving.registry.models import (
    STATUS_TRANSITIONS,
    ArtifactSource,
    Model,
    ModelTask,
    ModelVersion,
    VersionStatus,
)
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

MODEL_FIELDS = ("name", "task", "description")
VERSION_FIELDS = ("label", "source", "artifact_uri", "status")
FILES_DELETED = "its uploaded files were deleted"


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
    full_clean(model)
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
        full_clean(locked)
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
    engines: Any = None,
) -> ModelVersion:
    """Register a Hugging Face-layout directory on this machine; validation runs on commit.

    `sha256`, if given, is the expected directory checksum (see `directory_sha256`);
    `engines`, the engines to validate it for (default: the built-in one)."""
    if model.tenant_id != tenant.pk:
        raise ValidationFailed("No such model in this tenant.", field="model")
    label = clean_label(label)
    expected = clean_sha256(sha256)
    wanted = clean_engines(engines)
    directory = artifacts.check_local_path(path)
    check_label_free(model, label)
    version = ModelVersion(
        tenant=tenant,
        model=model,
        label=label,
        source=ArtifactSource.PATH,
        artifact_uri=artifacts.file_uri(directory),
        expected_sha256=expected,
        engines=wanted,
        created_by_id=actor.user_id,
    )
    full_clean(version)
    save_new_version(tenant=tenant, actor=actor, version=version)
    return version


def save_new_version(
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
                    "engines": version.engines,
                    **(extra or {}),
                },
            )
            if validate:
                _enqueue_validation(version)
    except IntegrityError:
        raise ConflictError(
            f"{version.model.name} already has a version {version.label!r}.", field="label"
        ) from None


_STATUS_ACTIONS: dict[str, str] = {
    VersionStatus.VALIDATING: "model_version.validation_started",
    VersionStatus.READY: "model_version.ready",
    VersionStatus.FAILED: "model_version.failed",
}


def set_status(
    *,
    version: ModelVersion,
    status: str,
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
