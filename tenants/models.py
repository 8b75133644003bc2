"""Tenants, memberships, quotas, API tokens, invitations and the audit trail."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from tenants.scoping import TenantOwned


class Plan(models.TextChoices):
    FREE = "free", "Free"
    TEAM = "team", "Team"
    ENTERPRISE = "enterprise", "Enterprise"


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    OPERATOR = "operator", "Operator"
    VIEWER = "viewer", "Viewer"


class MembershipSource(models.TextChoices):
    # Signup, a new tenant, an invitation: only people in the portal change these.
    LOCAL = "local", "Granted in the portal"
    # Follows the identity provider's groups on every sign-in (tenants.services.sso).
    OIDC = "oidc", "Granted by single sign-on"


class Scope(models.TextChoices):
    READ = "read", "Read"
    WRITE = "write", "Write"
    DEPLOY = "deploy", "Deploy"
    ADMIN = "admin", "Admin"


ROLE_SCOPES: dict[str, frozenset[str]] = {
    Role.VIEWER: frozenset({Scope.READ}),
    Role.OPERATOR: frozenset({Scope.READ, Scope.WRITE, Scope.DEPLOY}),
    Role.OWNER: frozenset({Scope.READ, Scope.WRITE, Scope.DEPLOY, Scope.ADMIN}),
}


class Tenant(models.Model):
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=120)
    plan = models.CharField(max_length=20, choices=Plan.choices, default=Plan.FREE)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(TenantOwned):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=20, choices=Role.choices)
    source = models.CharField(
        max_length=10, choices=MembershipSource.choices, default=MembershipSource.LOCAL
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant_id} as {self.role}"

    @property
    def scopes(self) -> frozenset[str]:
        return ROLE_SCOPES[self.role]


class Quota(TenantOwned):
    max_deployments = models.PositiveIntegerField(default=3)
    max_replicas = models.PositiveIntegerField(default=4)
    max_gpus = models.PositiveIntegerField(default=1)
    max_kv_blocks = models.PositiveIntegerField(default=4096)
    requests_per_second = models.PositiveIntegerField(default=20, validators=[MinValueValidator(1)])
    # Bytes of model artifacts the tenant may keep, counted unpacked (an archive is charged
    # what it expands to, before it is written).
    max_storage_bytes = models.PositiveBigIntegerField(default=10 * 2**30)
    max_drills = models.PositiveIntegerField(default=10)
    max_concurrent_drill_runs = models.PositiveIntegerField(default=1)
    # GPU memory (MiB) one replica may use for the tenant: weights + KV cache + activations of
    # its own replica, its KV blocks and activations in a shared pool's (serving.engine.memory).
    max_gpu_memory_mb_per_replica = models.PositiveIntegerField(
        default=24576, validators=[MinValueValidator(1)]
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="quota_one_per_tenant")]

    def __str__(self) -> str:
        return f"quota of {self.tenant_id}"


class ApiToken(TenantOwned):
    name = models.CharField(max_length=80)
    prefix = models.CharField(max_length=16, unique=True)
    token_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    rate_limit_per_second = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name"],
                condition=models.Q(revoked_at__isnull=True),
                name="apitoken_unique_active_name",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()

    @property
    def status(self) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= timezone.now():
            return "expired"
        return "active"


class Invitation(TenantOwned):
    email = models.EmailField()
    role = models.CharField(max_length=20, choices=Role.choices)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "email"],
                condition=models.Q(
                    accepted_at__isnull=True, revoked_at__isnull=True, expired_at__isnull=True
                ),
                name="invitation_unique_pending_email",
            )
        ]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.tenant_id}"

    @property
    def status(self) -> str:
        if self.accepted_at is not None:
            return "accepted"
        if self.revoked_at is not None:
            return "revoked"
        if self.expired_at is not None or self.expires_at <= timezone.now():
            return "expired"
        return "pending"


class AuditEvent(TenantOwned):
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_token = models.ForeignKey(
        ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=200)
    action = models.CharField(max_length=80)
    object_type = models.CharField(max_length=80)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "-id"], name="audit_tenant_id_desc"),
            models.Index(fields=["tenant", "action"], name="audit_tenant_action"),
        ]

    def __str__(self) -> str:
        return f"{self.actor_label} {self.action} {self.object_type}:{self.object_id}"


class TotpDevice(models.Model):
    """A user's authenticator app (RFC 6238): one per user, in force once `confirmed_at` is
    set. `last_used_step` is the newest 30-second step a code was accepted for, so a code is
    never accepted twice (tenants.mfa.services)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="totp_device"
    )
    secret = models.CharField(max_length=64)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    last_used_step = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"authenticator of {self.user_id}"


class RecoveryCode(models.Model):
    """A single-use code that stands in for the authenticator; only its digest is kept."""

    device = models.ForeignKey(TotpDevice, on_delete=models.CASCADE, related_name="recovery_codes")
    code_hash = models.CharField(max_length=64)
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["device", "code_hash"], name="recovery_code_unique")
        ]

    def __str__(self) -> str:
        return f"recovery code {self.pk} of {self.device_id}"
