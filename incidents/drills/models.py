"""Chaos drills (models): a drill is a rehearsed fault on one deployment with a steady-state
hypothesis and abort conditions; each run of it injects the fault through the reconcile path,
observes the ops loop catch it, reverts, and scores the deployment's resilience."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from tenants.scoping import TenantOwned

DEPLOYMENT = "serving.Deployment"
REVISION = "serving.DeploymentRevision"


class FaultKind(models.TextChoices):
    GPU_MEMORY_LEAK = "gpu_memory_leak", "GPU memory leak"
    LATENCY_SPIKE = "latency_spike", "Latency spike"
    ERROR_BURST = "error_burst", "Error burst"
    REPLICA_CRASH = "replica_crash", "Replica crash"
    REPLICA_HANG = "replica_hang", "Replica hang"
    KV_POLLUTION_PROBE = "kv_pollution_probe", "KV cache pollution probe"
    TOKEN_STARVATION = "token_starvation", "Token starvation"
    WEIGHT_SWAP_JITTER = "weight_swap_jitter", "Weight swap jitter"
    CONTROL_PLANE_DELAY = "control_plane_delay", "Control plane delay"
    PROMPT_INJECTION = "prompt_injection", "Prompt injection"


class DrillSlot(models.TextChoices):
    STABLE = "stable", "Stable"
    CANARY = "canary", "Canary"


class RevertStrategy(models.TextChoices):
    ALWAYS = "always", "Always revert"
    DEVIATED = "deviated", "Revert only if the steady state deviated (else the TTL ends it)"


class DrillStatus(models.TextChoices):
    SCHEDULED = "scheduled", "Scheduled"
    CHECKING = "checking", "Checking steady state"
    INJECTING = "injecting", "Injecting"
    OBSERVING = "observing", "Observing"
    REVERTING = "reverting", "Reverting"
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"
    ABORTED = "aborted", "Aborted"


ACTIVE_STATUSES = (
    DrillStatus.SCHEDULED,
    DrillStatus.CHECKING,
    DrillStatus.INJECTING,
    DrillStatus.OBSERVING,
    DrillStatus.REVERTING,
)


class ChaosDrill(TenantOwned):
    """What to break, where, for how long, what must hold, and when to stop early."""

    deployment = models.ForeignKey(DEPLOYMENT, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True, max_length=2000)
    fault = models.CharField(max_length=32, choices=FaultKind.choices)
    parameters = models.JSONField(default=dict, blank=True)
    group = models.CharField(max_length=10, default=DrillSlot.STABLE, choices=DrillSlot.choices)
    # Blast radius: the share of the slot's replicas the fault may hit (replica faults) and
    # the share of requests (request faults); both folded into the fault's parameters.
    replica_share = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.01), MaxValueValidator(1.0)]
    )
    traffic_share = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.01), MaxValueValidator(1.0)]
    )
    duration_s = models.PositiveIntegerField(
        default=60, validators=[MinValueValidator(5), MaxValueValidator(3600)]
    )
    # {"contract": bool, "probes": [{"name", "sli", "max" | "min", "weight"}]}
    steady_state = models.JSONField(default=dict, blank=True)
    # {"burn_rate_above": float, "error_rate_above": float}
    abort_conditions = models.JSONField(default=dict, blank=True)
    schedule = models.CharField(max_length=100, blank=True)  # cron: "m h dom mon dow"
    periodic_task = models.OneToOneField(
        "django_celery_beat.PeriodicTask",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    revert = models.CharField(
        max_length=10, choices=RevertStrategy.choices, default=RevertStrategy.ALWAYS
    )
    # Opt-in: the fault's own prompts are built from a sample of the tenant's recent prompts,
    # recorded for the run only (incidents.drills.replay), instead of synthetic filler.
    replay_prompts = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="drill_unique_name"),
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.fault})"


class DrillRun(TenantOwned):
    """One run of a drill, advanced step by step by the `advance_drill_run` task (queue
    `chaos`); every step is idempotent, so a worker killed mid-run resumes where it was."""

    drill = models.ForeignKey(ChaosDrill, on_delete=models.CASCADE, related_name="runs")
    deployment = models.ForeignKey(DEPLOYMENT, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(
        max_length=12, choices=DrillStatus.choices, default=DrillStatus.SCHEDULED
    )
    trigger = models.CharField(max_length=20, default="manual")
    fault = models.CharField(max_length=32, choices=FaultKind.choices)
    snapshot = models.JSONField(default=dict)  # the drill as it was when the run started
    created_at = models.DateTimeField(default=timezone.now)
    stepped_at = models.DateTimeField(default=timezone.now)  # the last step (resume sweep)
    previous_step_at: float | None = None  # not stored: the step before this one (run_advance)
    started_at = models.DateTimeField(null=True, blank=True)
    injected_at = models.DateTimeField(null=True, blank=True)
    # The fault took effect (the replicas' own reports, or the drill's for control faults).
    effect_at = models.DateTimeField(null=True, blank=True)
    # The first declared signal that moved beyond its baseline (incidents.drills.detection).
    detected_at = models.DateTimeField(null=True, blank=True)
    detected_by = models.CharField(max_length=32, blank=True)
    # {"signals", "baseline", "values", "effect", "effect_since", "simulated",
    #  "replicas_at_injection"}
    detection = models.JSONField(default=dict, blank=True)
    mitigated_at = models.DateTimeField(null=True, blank=True)  # rollback done or recovered
    reverted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    fault_revision = models.ForeignKey(
        REVISION, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revert_revision = models.ForeignKey(
        REVISION, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    incident = models.ForeignKey(
        "incidents.Incident", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # {"checks": n, "held": weight held, "total": ..., "fault": what an active fault measured}
    probes = models.JSONField(default=dict)
    deviated = models.BooleanField(default=False)
    stop_requested = models.BooleanField(default=False)
    verdict = models.TextField(blank=True)
    resilience_score = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "deployment"],
                condition=models.Q(status__in=[str(s) for s in ACTIVE_STATUSES]),
                name="drill_one_active_run_per_deployment",
            )
        ]

    def __str__(self) -> str:
        return f"run #{self.pk} of {self.drill_id} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def mttd_s(self) -> float | None:
        """First detection - the fault effective (its injection until a replica reports it)."""
        start = self.effect_at or self.injected_at
        if start and self.detected_at:
            return max(0.0, (self.detected_at - start).total_seconds())
        return None

    @property
    def detected(self) -> bool | None:
        """None until the run has injected; then whether a declared signal noticed it."""
        return None if self.injected_at is None else bool(self.detected_by)

    @property
    def mttr_s(self) -> float | None:
        if self.injected_at and self.mitigated_at:
            return max(0.0, (self.mitigated_at - self.injected_at).total_seconds())
        return None


class DrillEvent(TenantOwned):
    """The run's timeline, appended only."""

    run = models.ForeignKey(DrillRun, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=30)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} at {self.at:%H:%M:%S}"
