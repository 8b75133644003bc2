"""Deployments (models): a tenant's serving endpoints and their immutable, numbered revisions of
desired state; the reconcile loop's bookkeeping."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from serving.control.names import deployment_app, pool_app, slot_app
from tenants.scoping import TenantOwned


def builtin_engine() -> dict[str, Any]:
    """The default engine choice (serving.engine.choice)."""
    return {"name": "builtin"}


# "serving.ModelVersion" by name: serving.models imports this module at its end.
MODEL_VERSION = "serving.ModelVersion"

DEPLOYMENT_NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"


class KvMode(models.TextChoices):
    DEDICATED = "dedicated", "Dedicated replicas"
    SHARED = "shared", "Shared pool"


class DeploymentStatus(models.TextChoices):
    PENDING = "pending", "Pending"  # desired state written, not applied yet
    DEPLOYING = "deploying", "Deploying"
    RUNNING = "running", "Running"
    UNHEALTHY = "unhealthy", "Unhealthy"
    FAILED = "failed", "Failed"
    DELETING = "deleting", "Deleting"
    DELETED = "deleted", "Deleted"


class SharedPool(models.Model):
    """A platform-run model serving many tenants from one KV pool (per-tenant block quotas).
    Platform-owned, not tenant-owned: tenants only reference it by name."""

    name = models.SlugField(max_length=40, unique=True)
    model_version = models.ForeignKey(MODEL_VERSION, on_delete=models.PROTECT, related_name="+")
    num_replicas = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    num_cpus = models.FloatField(default=1.0, validators=[MinValueValidator(0)])
    num_gpus = models.FloatField(default=0.0, validators=[MinValueValidator(0)])
    kv_blocks = models.PositiveIntegerField(default=1024, validators=[MinValueValidator(16)])
    block_size = models.PositiveIntegerField(default=16, validators=[MinValueValidator(1)])
    is_active = models.BooleanField(default=True)
    # Platform decides who shares a pool: a tenant joins only if it is listed here.
    allowed_tenants = models.ManyToManyField("tenants.Tenant", blank=True, related_name="+")
    # Fair share: no pool tenant's block quota exceeds kv_blocks / min_tenants, and no tenant
    # runs more than max_num_seqs / min_tenants sequences at once.
    min_tenants = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1)])
    max_num_seqs = models.PositiveIntegerField(default=32, validators=[MinValueValidator(1)])
    engine = models.JSONField(default=builtin_engine, blank=True)  # serving.engine.choice
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class Deployment(TenantOwned):
    name = models.CharField(
        max_length=40,
        validators=[
            RegexValidator(
                DEPLOYMENT_NAME_RE, "Use lower-case letters, digits and '-' (DNS label style)."
            )
        ],
    )
    description = models.TextField(blank=True, max_length=2000)
    status = models.CharField(
        max_length=20, choices=DeploymentStatus.choices, default=DeploymentStatus.PENDING
    )
    status_message = models.TextField(blank=True)
    status_at = models.DateTimeField(null=True, blank=True)
    current_revision = models.ForeignKey(
        "DeploymentRevision",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="current_of",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # The health check: probe + Serve status + the replicas' SLI windows, every N seconds.
    health_interval_s = models.FloatField(
        default=2.0, validators=[MinValueValidator(1.0), MaxValueValidator(300.0)]
    )
    # The revision traffic goes back to on a rollback (the last one that ran healthy).
    last_good_revision = models.ForeignKey(
        "DeploymentRevision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name"],
                condition=models.Q(deleted_at__isnull=True),
                name="deployment_unique_live_name",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_live(self) -> bool:
        return self.deleted_at is None

    @property
    def serve_app(self) -> str:
        """The Serve application of the router (every slot's replicas publish under it);
        raises names.BadName for a tenant slug the naming scheme cannot carry."""
        return deployment_app(self.tenant.slug, self.name)

    def serve_apps(self, revision: DeploymentRevision) -> tuple[list[str], list[str]]:
        """(the deployment's own applications, the shared ones it uses) under `revision`:
        the router, which serves a dedicated stable slot in-process, and the canary; or a
        shared pool's application."""
        base = self.serve_app
        if revision.kv_mode == KvMode.SHARED and revision.pool is not None:
            return [base], [pool_app(revision.pool.name)]
        canary = [slot_app(self.tenant.slug, self.name, "canary")]
        own = [base] + (canary if revision.canary_version_id else [])
        own += [slot_app(self.tenant.slug, self.name, t["name"]) for t in tier_levels(revision)]
        if (revision.engine or {}).get("name") == "vllm":  # serving.control.compile
            own.insert(1, slot_app(self.tenant.slug, self.name, "stable"))
        return own, []


# Fields of a revision that are desired state (copied into the next revision, never edited).
SPEC_FIELDS = (
    "stable_version_id",
    "canary_version_id",
    "canary_percent",
    "num_replicas",
    "autoscaling",
    "num_cpus",
    "num_gpus",
    "max_ongoing_requests",
    "kv_mode",
    "pool_id",
    "kv_blocks",
    "block_size",
    "guard",
    "breaker",
    "faults",
    "key_hashes",
    "batch_key_hashes",
    "engine",
    "canary_engine",
    "tiers",
    "traffic",
    "kv_cache",
)


def tier_levels(revision: DeploymentRevision) -> list[dict[str, Any]]:
    """A revision's degraded tiers (serving.deployments.services.tiers), each its own app."""
    return list((revision.tiers or {}).get("levels") or [])


class DeploymentRevision(TenantOwned):
    """One immutable, numbered revision of a deployment's desired state."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    reason = models.CharField(max_length=200)
    stable_version = models.ForeignKey(MODEL_VERSION, on_delete=models.PROTECT, related_name="+")
    canary_version = models.ForeignKey(
        MODEL_VERSION, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    canary_percent = models.FloatField(
        default=0, validators=[MinValueValidator(0), MaxValueValidator(100)]
    )
    num_replicas = models.PositiveIntegerField(null=True, blank=True)
    autoscaling = models.JSONField(null=True, blank=True)
    num_cpus = models.FloatField(default=1.0)
    num_gpus = models.FloatField(default=0.0)
    max_ongoing_requests = models.PositiveIntegerField(default=16)
    kv_mode = models.CharField(max_length=10, choices=KvMode.choices, default=KvMode.DEDICATED)
    pool = models.ForeignKey(
        SharedPool, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    kv_blocks = models.PositiveIntegerField(default=256)
    block_size = models.PositiveIntegerField(default=16)
    guard = models.JSONField(default=dict, blank=True)
    breaker = models.JSONField(default=dict, blank=True)
    faults = models.JSONField(default=dict, blank=True)
    key_hashes = models.JSONField(default=list, blank=True)  # SHA-256 of the live inference keys
    batch_key_hashes = models.JSONField(default=list, blank=True)  # those of priority "batch"
    # The stable slot's engine and its knobs (serving.engine.choice); the canary's, while
    # there is one (a canary may change the engine: built-in -> vLLM).
    engine = models.JSONField(default=builtin_engine, blank=True)
    canary_engine = models.JSONField(null=True, blank=True)
    # Degraded tiers and their policy (serving.deployments.services.tiers); {}: none.
    tiers = models.JSONField(default=dict, blank=True)
    # Sticky A/B by client key (serving.deployments.traffic_specs); {}: the random split.
    traffic = models.JSONField(default=dict, blank=True)
    # KV cache lifetime: prefix caching on/off, max age (serving.deployments.kv_specs); {}: on.
    kv_cache = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    # What happened to it in the data plane (written by reconcile, not desired state).
    applied_at = models.DateTimeField(null=True, blank=True)
    converged_at = models.DateTimeField(null=True, blank=True)
    serve_status = models.CharField(max_length=20, blank=True)
    serve_message = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "deployment", "number"], name="revision_unique_number"
            ),
        ]
        ordering = ["-number"]

    def __str__(self) -> str:
        return f"{self.deployment.name}#{self.number}"

    def spec(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SPEC_FIELDS}

    def replicas_max(self) -> int:
        if self.autoscaling:
            return int(self.autoscaling.get("max_replicas", 1))
        return int(self.num_replicas or 1)

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and kwargs.get("update_fields") is None:
            raise ValueError("a revision is immutable: save(update_fields=...) status only")
        fields = kwargs.get("update_fields")
        if fields is not None and set(fields) - {
            "applied_at",
            "converged_at",
            "serve_status",
            "serve_message",
        }:
            raise ValueError("only the data-plane status of a revision may change")
        super().save(*args, **kwargs)


class KeyPriority(models.TextChoices):
    """The engine's priority class of a key's requests (serving.engine.priority)."""

    REALTIME = "realtime", "realtime"
    BATCH = "batch", "batch"


class InferenceKey(TenantOwned):
    """A key clients send to a deployment's route (`Authorization: Bearer ik_...`); only its
    hash is kept, and the router receives only hashes."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="keys")
    name = models.CharField(max_length=80)
    prefix = models.CharField(max_length=12)
    key_hash = models.CharField(max_length=64, unique=True)
    is_probe = models.BooleanField(default=False)  # the health checker's own key
    priority = models.CharField(
        max_length=10, choices=KeyPriority.choices, default=KeyPriority.REALTIME
    )
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}...)"


class ReconcileRun(models.Model):
    """One apply of the compiled config to Serve (platform-wide, not tenant-owned)."""

    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    ok = models.BooleanField(default=False)
    skipped = models.BooleanField(default=False)  # config identical to what Serve runs
    config_digest = models.CharField(max_length=64, blank=True)
    applications = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    duration_ms = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["-started_at"], name="reconcile_recent")]

    def __str__(self) -> str:
        return f"reconcile {self.started_at:%H:%M:%S} {'ok' if self.ok else 'failed'}"


class ReconcileLock(models.Model):
    """A single row locked (SELECT ... FOR UPDATE) for the duration of one reconcile."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_digest = models.CharField(max_length=64, blank=True)
    last_applied_at = models.DateTimeField(null=True, blank=True)
    # What Serve was last given, application by application: an application Serve refuses
    # keeps this (its last good) config while every other change applies.
    applied_config = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return "reconcile lock"
