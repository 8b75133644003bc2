"""The ops loop (models): SLA contracts, stored SLI windows, progressive rollouts with their
analysis runs, and rollbacks."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from tenants.scoping import TenantOwned

DEPLOYMENT = "serving.Deployment"
REVISION = "serving.DeploymentRevision"


class SlaContract(TenantOwned):
    """One version of a deployment's SLA contract: the YAML as written and the parsed document
    (`serving.slo.Contract.to_dict()`). Only a valid document is ever stored; the newest
    version is the one in force."""

    deployment = models.ForeignKey(DEPLOYMENT, on_delete=models.CASCADE, related_name="contracts")
    version = models.PositiveIntegerField()
    name = models.CharField(max_length=63)
    source = models.TextField()
    document = models.JSONField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "deployment", "version"], name="contract_unique_version"
            )
        ]
        ordering = ["-version"]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class Resolution(models.IntegerChoices):
    RAW = 1, "Raw (one row per health tick)"
    MINUTE = 60, "1 minute"


class SliSample(TenantOwned):
    """SLI counts of one deployment slot (`stable`, `canary`) over [start, end): the deltas of
    the replicas' cumulative counters, plus the slot's cumulative totals at `end` (so a window
    sum is one subtraction), plus the synthetic probe of that tick."""

    deployment = models.ForeignKey(DEPLOYMENT, on_delete=models.CASCADE, related_name="+")
    group = models.CharField(max_length=10)
    version = models.CharField(max_length=64, blank=True)
    resolution = models.PositiveSmallIntegerField(choices=Resolution.choices)
    start = models.DateTimeField()
    end = models.DateTimeField()
    requests = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)
    rejected = models.BigIntegerField(default=0)
    tokens_in = models.BigIntegerField(default=0)
    tokens_out = models.BigIntegerField(default=0)
    latency = models.JSONField(default=list)  # histogram deltas, bounds serving.dataplane.sli
    ttft = models.JSONField(default=list)
    itl = models.JSONField(default=list)
    cumulative = models.JSONField(default=dict)  # serving.slo.Counts.to_dict() at `end`
    probe_ok = models.BooleanField(null=True)
    probe_ms = models.FloatField(null=True)
    kv = models.JSONField(default=dict)  # KV stats of the slot's replicas (summed)

    class Meta:
        indexes = [
            models.Index(fields=["deployment", "group", "resolution", "-end"], name="sli_lookup"),
            models.Index(fields=["resolution", "end"], name="sli_retention"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id}/{self.group} {self.start:%H:%M:%S}"


class RolloutPolicy(TenantOwned):
    """How a canary progresses (Argo Rollouts' vocabulary): steps of weight and pause, an
    analysis every `analysis_interval_s`; the rollout fails when failed analyses exceed
    `failure_limit` (0: the first failure) or analyses that could not measure exceed
    `consecutive_error_limit` in a row; an Inconclusive analysis pauses for a human."""

    class OnFailure(models.TextChoices):
        ABORT = "abort", "Abort (roll back to stable)"
        PAUSE = "pause", "Pause where it stands"

    deployment = models.OneToOneField(
        DEPLOYMENT, on_delete=models.CASCADE, related_name="rollout_policy"
    )
    steps = models.JSONField(default=list)  # [{"weight": 20, "pause_s": 60}, ...]
    analysis_interval_s = models.PositiveIntegerField(
        default=10, validators=[MinValueValidator(1), MaxValueValidator(3600)]
    )
    failure_limit = models.PositiveIntegerField(default=0)
    consecutive_error_limit = models.PositiveIntegerField(default=4)
    min_requests = models.PositiveIntegerField(default=20)
    on_failure = models.CharField(max_length=8, choices=OnFailure.choices, default="abort")
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"rollout policy of {self.deployment_id}"


class RolloutStatus(models.TextChoices):
    PROGRESSING = "progressing", "Progressing"
    PAUSED = "paused", "Paused"  # by a human, by on_failure=pause, or Inconclusive
    NEEDS_REVIEW = "needs_review", "Needs review"  # the contract's gate asks a human
    SUCCESSFUL = "successful", "Successful (promoted)"
    FAILED = "failed", "Failed (rolled back)"
    ABORTED = "aborted", "Aborted"


class Rollout(TenantOwned):
    """One progressive rollout of a canary version through the policy's steps."""

    deployment = models.ForeignKey(DEPLOYMENT, on_delete=models.CASCADE, related_name="rollouts")
    canary_version = models.ForeignKey(
        "serving.ModelVersion", on_delete=models.PROTECT, related_name="+"
    )
    base_revision = models.ForeignKey(REVISION, on_delete=models.PROTECT, related_name="+")
    steps = models.JSONField(default=list)  # the policy's steps when the rollout began
    policy = models.JSONField(default=dict)  # the policy's limits when the rollout began
    status = models.CharField(
        max_length=16, choices=RolloutStatus.choices, default=RolloutStatus.PROGRESSING
    )
    step_index = models.PositiveIntegerField(default=0)
    step_started_at = models.DateTimeField(default=timezone.now)
    last_analysis_at = models.DateTimeField(null=True, blank=True)
    failures = models.PositiveIntegerField(default=0)
    consecutive_errors = models.PositiveIntegerField(default=0)
    message = models.TextField(blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "deployment"],
                condition=models.Q(status__in=["progressing", "paused", "needs_review"]),
                name="rollout_one_active",
            )
        ]

    def __str__(self) -> str:
        return f"rollout of {self.deployment_id} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in (
            RolloutStatus.PROGRESSING,
            RolloutStatus.PAUSED,
            RolloutStatus.NEEDS_REVIEW,
        )


class AnalysisResult(models.TextChoices):
    SUCCESSFUL = "successful", "Successful"
    FAILED = "failed", "Failed"
    INCONCLUSIVE = "inconclusive", "Inconclusive"
    ERROR = "error", "Error (could not measure)"


class AnalysisRun(TenantOwned):
    """One analysis of a rollout step: canary against stable and against the contract."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="analyses")
    step_index = models.PositiveIntegerField()
    at = models.DateTimeField(default=timezone.now)
    result = models.CharField(max_length=12, choices=AnalysisResult.choices)
    summary = models.TextField(blank=True)
    measurements = models.JSONField(default=dict)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"analysis {self.result} at step {self.step_index}"


class RollbackStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SWITCHING = "switching", "Switching traffic"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class Rollback(TenantOwned):
    """Traffic put back on the last good revision: a new revision with its spec (weights only,
    so live replicas reconfigure). `key` (deployment + target revision) makes it exactly
    once: concurrent triggers and a re-delivered task find the same row."""

    deployment = models.ForeignKey(DEPLOYMENT, on_delete=models.CASCADE, related_name="rollbacks")
    key = models.CharField(max_length=80)
    trigger = models.CharField(max_length=20)  # breach, analysis, manual, burn
    reason = models.TextField(blank=True)
    from_revision = models.ForeignKey(REVISION, on_delete=models.PROTECT, related_name="+")
    to_revision = models.ForeignKey(REVISION, on_delete=models.PROTECT, related_name="+")
    new_revision = models.ForeignKey(
        REVISION, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    rollout = models.ForeignKey(
        Rollout, null=True, blank=True, on_delete=models.SET_NULL, related_name="rollbacks"
    )
    status = models.CharField(
        max_length=10, choices=RollbackStatus.choices, default=RollbackStatus.PENDING
    )
    error = models.TextField(blank=True)
    detected_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    traffic_switched_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="rollback_unique_key"),
        ]

    def __str__(self) -> str:
        return f"rollback {self.key} ({self.status})"
