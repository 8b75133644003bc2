"""A check of one ready version before it becomes a canary: a verification against a
deployment's contract, or a benchmark that drafts a contract from measured figures."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from tenants.scoping import TenantOwned


class CheckKind(models.TextChoices):
    VERIFY = "verify", "Verify against the contract"
    BENCHMARK = "benchmark", "Benchmark"


class CheckStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class Verdict(models.TextChoices):
    PASS = "pass", "Pass"
    REVIEW = "review", "Needs review"
    BLOCK = "block", "Blocked"


ACTIVE_STATUSES = (CheckStatus.QUEUED, CheckStatus.RUNNING)


class VersionCheck(TenantOwned):
    version = models.ForeignKey(
        "serving.ModelVersion", on_delete=models.CASCADE, related_name="checks"
    )
    # verify: the deployment whose contract the version is checked against.
    deployment = models.ForeignKey(
        "serving.Deployment", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    kind = models.CharField(max_length=10, choices=CheckKind.choices)
    status = models.CharField(
        max_length=10, choices=CheckStatus.choices, default=CheckStatus.QUEUED
    )
    params = models.JSONField(default=dict, blank=True)  # what was asked, bounds applied
    result = models.JSONField(default=dict, blank=True)  # measurements and per-objective rows
    verdict = models.CharField(max_length=10, choices=Verdict.choices, blank=True)
    draft = models.TextField(blank=True)  # benchmark: a contract draft (YAML)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "status"], name="versioncheck_tenant_status")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=CheckStatus.values), name="versioncheck_status"
            ),
            models.CheckConstraint(
                condition=models.Q(kind__in=CheckKind.values), name="versioncheck_kind"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} of version {self.version_id} ({self.status})"
