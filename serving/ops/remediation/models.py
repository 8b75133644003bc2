"""Remediation runs (models): one row per chain started for an incident, one row per step run.

`RemediationRun.key` (deployment + incident + chain) makes a chain start once, whatever the
number of ticks or alerts that ask; `RemediationStep` (run, index) makes each step run once.
A run is advanced by whoever holds its lease (`lease_until`), so two workers never act at once.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from tenants.scoping import TenantOwned


class RunStatus(models.TextChoices):
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting"
    DONE = "done", "Done (every step ran)"
    RECOVERED = "recovered", "Ended: the condition did not hold"
    FAILED = "failed", "Failed"


ACTIVE = (RunStatus.RUNNING, RunStatus.WAITING)


class StepStatus(models.TextChoices):
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    SKIPPED = "skipped", "Skipped"
    FAILED = "failed", "Failed"


class RemediationRun(TenantOwned):
    deployment = models.ForeignKey(
        "serving.Deployment", on_delete=models.CASCADE, related_name="remediation_runs"
    )
    key = models.CharField(max_length=160)
    chain = models.CharField(max_length=63)
    group = models.CharField(max_length=10)  # the slot whose alert started it
    alert = models.CharField(max_length=120)  # the alert (fast rule or objective) that started it
    # The incident it acts for (incidents owns it; serving keeps only its id).
    incident_id = models.PositiveBigIntegerField(null=True, blank=True)
    contract_version = models.PositiveIntegerField(null=True, blank=True)
    steps = models.JSONField()  # the chain's steps as written, frozen when it started
    status = models.CharField(max_length=10, choices=RunStatus.choices, default=RunStatus.RUNNING)
    next_step = models.PositiveSmallIntegerField(default=0)
    due_at = models.DateTimeField(null=True, blank=True)  # a wait step's end
    lease_until = models.DateTimeField(null=True, blank=True)
    message = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="remediation_run_unique_key"),
        ]
        indexes = [models.Index(fields=["status", "due_at"], name="remediation_run_due")]

    def __str__(self) -> str:
        return f"remediation {self.chain} ({self.status})"


class RemediationStep(TenantOwned):
    run = models.ForeignKey(RemediationRun, on_delete=models.CASCADE, related_name="step_rows")
    index = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=20)  # the action, or "wait"
    status = models.CharField(max_length=10, choices=StepStatus.choices)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)  # the outcome; restart progress
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "run", "index"], name="remediation_step_once"
            ),
        ]

    def __str__(self) -> str:
        return f"step {self.index} {self.kind} ({self.status})"
