"""The audit trail of every service: `audit_record` (one AuditEvent row, written inside the
caller's transaction), `snapshot` (a row's fields as JSON for before/after) and
`acting_member_id` (the member behind an actor, so their automation is offboarded with them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models

from tenants.actors import Actor
from tenants.models import AuditEvent, Tenant


def snapshot(*, obj: models.Model, fields: tuple[str, ...]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in fields:
        value = getattr(obj, name)
        data[name] = value.isoformat() if isinstance(value, datetime) else value
    return data


def acting_member_id(*, actor: Actor) -> int | None:
    """The member behind an action: the user, or the member who created the acting token, so
    what a member's automation creates is offboarded with them."""
    if actor.user_id is not None:
        return actor.user_id
    return actor.token.created_by_id if actor.token is not None else None


def audit_record(
    *,
    tenant: Tenant,
    actor: Actor,
    action: str,
    obj: models.Model,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one audit row; called by every service inside its own transaction."""
    return AuditEvent.objects.create(
        tenant=tenant,
        actor_id=actor.user_id,
        actor_token=actor.token,
        actor_label=actor.label[:200],
        action=action,
        object_type=obj._meta.label_lower,
        object_id=str(obj.pk),
        object_repr=str(obj)[:200],
        before=before,
        after=after,
    )
