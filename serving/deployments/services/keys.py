"""Inference keys of a deployment: create (the raw key is shown once) and revoke. Each change
of a deployment's live keys is a new revision carrying their hashes, and which of them are of
priority "batch" (serving.engine.priority), so the router follows.
"""

from __future__ import annotations

import hashlib
import secrets

from django.db import transaction
from django.utils import timezone

from portal.exceptions import ValidationFailed
from serving.deployments.models import Deployment, InferenceKey, KeyPriority
from serving.deployments.services.revisions import deployment_change, locked_deployment
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

KEY_PREFIX = "ik_"


def new_inference_key() -> tuple[str, str]:
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    return raw, hashlib.sha256(raw.encode()).hexdigest()


def _keys_changed(tenant: Tenant, actor: Actor, deployment: Deployment, reason: str) -> None:
    live = InferenceKey.objects.filter(deployment=deployment, revoked_at__isnull=True)
    keys = sorted(live.values_list("key_hash", "priority"))
    deployment_change(
        tenant=tenant,
        actor=actor,
        deployment=deployment,
        changes={
            "key_hashes": [h for h, _ in keys],
            "batch_key_hashes": [h for h, p in keys if p == KeyPriority.BATCH],
        },
        reason=reason,
        action="deployment.keys_rotated",
    )


def inference_key_create(
    *,
    tenant: Tenant,
    actor: Actor,
    deployment: Deployment,
    name: str,
    probe: bool = False,
    priority: str = KeyPriority.REALTIME,
) -> tuple[InferenceKey, str]:
    """A new key (its raw value returned once). `priority`: realtime (the default) or batch,
    the engine's class for every request made with it."""
    name = (name or "").strip()
    if not name or len(name) > 80:
        raise ValidationFailed("give a name of 1-80 characters.", field="name")
    if priority not in KeyPriority.values:
        raise ValidationFailed(f"must be one of {', '.join(KeyPriority.values)}.", field="priority")
    raw, key_hash = new_inference_key()
    with transaction.atomic():
        locked_deployment(tenant=tenant, deployment=deployment)
        key = InferenceKey.objects.create(
            tenant=tenant,
            deployment=deployment,
            name=name,
            prefix=raw[:12],
            key_hash=key_hash,
            is_probe=probe,
            priority=priority,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="inference_key.created",
            obj=key,
            after={"name": name, "prefix": key.prefix, "priority": key.priority},
        )
        _keys_changed(tenant, actor, deployment, f"key {key.prefix} added")
    return key, raw


def inference_key_revoke(*, tenant: Tenant, actor: Actor, key: InferenceKey) -> InferenceKey:
    with transaction.atomic():
        locked = InferenceKey.objects.select_for_update().get(pk=key.pk, tenant=tenant)
        if locked.revoked_at is not None:
            return locked
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        audit_record(
            tenant=tenant,
            actor=actor,
            action="inference_key.revoked",
            obj=locked,
            before={"prefix": locked.prefix},
        )
        _keys_changed(tenant, actor, locked.deployment, f"key {locked.prefix} revoked")
    return locked
