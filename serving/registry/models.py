"""The model registry: a tenant's models and their versions (artifacts and validation state)."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from tenants.scoping import TenantOwned

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
LABEL_RE = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"
SHA256_RE = r"^[0-9a-f]{64}$"


def default_engines() -> list[str]:
    return ["builtin"]


class ModelTask(models.TextChoices):
    TEXT_GENERATION = "text-generation", "Text generation"
    CHAT = "chat", "Chat"


class VersionStatus(models.TextChoices):
    REGISTERED = "registered", "Registered"
    VALIDATING = "validating", "Validating"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class ArtifactSource(models.TextChoices):
    PATH = "path", "Local path"
    UPLOAD = "upload", "Upload"


# The only moves a version's status may make (services check it). validating -> validating is
# a restart: a worker that died mid-validation hands the task to another one (acks_late).
STATUS_TRANSITIONS: dict[str, frozenset[str]] = {
    VersionStatus.REGISTERED: frozenset({VersionStatus.VALIDATING, VersionStatus.FAILED}),
    VersionStatus.VALIDATING: frozenset(
        {VersionStatus.VALIDATING, VersionStatus.READY, VersionStatus.FAILED}
    ),
    VersionStatus.READY: frozenset(),
    VersionStatus.FAILED: frozenset(),
}


class Model(TenantOwned):
    name = models.CharField(
        max_length=100,
        validators=[
            RegexValidator(NAME_RE, "Use letters, digits, '.', '_' and '-'; start alphanumeric.")
        ],
    )
    task = models.CharField(
        max_length=40, choices=ModelTask.choices, default=ModelTask.TEXT_GENERATION
    )
    description = models.TextField(blank=True, max_length=2000)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="model_unique_name")]

    def __str__(self) -> str:
        return self.name


class ModelVersion(TenantOwned):
    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="versions")
    label = models.CharField(
        max_length=64,
        validators=[
            RegexValidator(
                LABEL_RE, "Use letters, digits, '.', '_', '+' and '-'; start alphanumeric."
            )
        ],
    )
    source = models.CharField(max_length=10, choices=ArtifactSource.choices)
    # file:///abs/path for a registered local directory, store://<rel> for an upload; empty
    # for an upload refused before anything was stored.
    artifact_uri = models.CharField(max_length=1024, blank=True)
    expected_sha256 = models.CharField(
        max_length=64,
        blank=True,
        validators=[RegexValidator(SHA256_RE, "Give 64 lower-case hex digits.")],
    )
    sha256 = models.CharField(max_length=64, blank=True)
    size_bytes = models.BigIntegerField(null=True, blank=True)
    # Bytes this version holds in the artifact store, charged to the tenant's storage quota:
    # an upload's unpacked size from the moment it is accepted, 0 for a registered local
    # directory and once a failed version's files are deleted.
    stored_bytes = models.PositiveBigIntegerField(default=0)
    # Validation runs started; a worker killed mid-validation (acks_late) restarts it, and
    # MODEL_VALIDATION_MAX_ATTEMPTS of them fail the version instead of looping.
    validation_attempts = models.PositiveSmallIntegerField(default=0)
    format = models.CharField(max_length=40, blank=True)
    config_summary = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=20, choices=VersionStatus.choices, default=VersionStatus.REGISTERED
    )
    failure_reason = models.TextField(blank=True)
    validation_steps = models.JSONField(default=list, blank=True)
    # The engines this version is validated for (serving.engine.choice.ENGINES): asked at
    # registration, each checked by validation; a deployment may run it only on these.
    engines = models.JSONField(default=default_engines, blank=True)
    # Golden prompts and the greedy answers this version gave at validation
    # (serving.registry.golden): the output-consistency probe replays them.
    golden = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    validation_started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "model", "label"], name="modelversion_unique_label"
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=VersionStatus.values),
                name="modelversion_status_valid",
            ),
        ]
        indexes = [models.Index(fields=["tenant", "status"], name="modelversion_tenant_status")]

    def __str__(self) -> str:
        return f"{self.model.name}:{self.label}" if self.model_id else self.label

    @property
    def is_deployable(self) -> bool:
        return self.status == VersionStatus.READY

    @property
    def is_final(self) -> bool:
        return self.status in (VersionStatus.READY, VersionStatus.FAILED)
