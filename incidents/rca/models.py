"""What incidents learn (models): people's "right / wrong" on a hint, and the tenant's learned
weight of each cause that the votes add up to (incidents.rca.learning)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from tenants.scoping import TenantOwned


class Verdict(models.TextChoices):
    RIGHT = "right", "Right"
    WRONG = "wrong", "Wrong"


class HintFeedback(TenantOwned):
    """One person's verdict on one hint (a cause) of one incident; changeable, never two."""

    incident = models.ForeignKey(
        "incidents.Incident", on_delete=models.CASCADE, related_name="hint_feedback"
    )
    cause_key = models.CharField(max_length=200)  # the cause's name, case-folded
    cause = models.CharField(max_length=200)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    verdict = models.CharField(max_length=5, choices=Verdict.choices)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "incident", "cause_key", "user"], name="hint_one_vote_per_user"
            )
        ]
        indexes = [models.Index(fields=["tenant", "cause_key"], name="hint_feedback_by_cause")]

    def __str__(self) -> str:
        return f"{self.cause} on #{self.incident_id}: {self.verdict}"


class HintWeight(TenantOwned):
    """The tenant's learned weight of one cause: its votes and the multiplier they give."""

    cause_key = models.CharField(max_length=200)
    cause = models.CharField(max_length=200)
    right = models.PositiveIntegerField(default=0)
    wrong = models.PositiveIntegerField(default=0)
    multiplier = models.FloatField(default=1.0)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["cause_key"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "cause_key"], name="hint_weight_per_cause")
        ]

    def __str__(self) -> str:
        return f"{self.cause}: x{self.multiplier:.2f} ({self.right} right, {self.wrong} wrong)"
