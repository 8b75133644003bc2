"""Hint feedback (services): a member's "right / wrong" on a hint of an incident, and the
tenant's learned weight of that cause recounted from the votes (incidents.rca.learning)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from incidents.models import CauseRule, EventKind, Incident
from incidents.rca import learning
from incidents.rca.hints import graph
from incidents.rca.models import HintFeedback, HintWeight, Verdict
from incidents.rca.selectors import voter_id
from incidents.services.incidents import incident_locked, timeline_append
from portal.exceptions import ValidationFailed
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record


def _voter_id(actor: Actor) -> int:
    user_id = voter_id(actor)
    if user_id is None:
        raise ValidationFailed("a vote needs a person: this token has no owner.", field="verdict")
    return user_id


def _cause_name(tenant: Tenant, cause: str) -> str:
    """The cause as the tenant's hint graph names it; any other name is refused."""
    key = learning.cause_key(cause or "")
    rules = CauseRule.objects.filter(tenant=tenant, is_active=True).order_by("id")
    for node in graph(rules):
        if learning.cause_key(node.name) == key:
            return node.name
    raise ValidationFailed("is not a cause of this tenant's hints.", field="cause")


def _recount(*, tenant: Tenant, key: str, name: str) -> HintWeight:
    """The cause's weight from its votes (the caller holds the weight row's lock)."""
    votes = HintFeedback.objects.filter(tenant=tenant, cause_key=key)
    right = votes.filter(verdict=Verdict.RIGHT).count()
    wrong = votes.filter(verdict=Verdict.WRONG).count()
    weight, _ = HintWeight.objects.select_for_update().get_or_create(
        tenant=tenant, cause_key=key, defaults={"cause": name}
    )
    weight.cause, weight.right, weight.wrong = name, right, wrong
    weight.multiplier = learning.multiplier(right, wrong)
    weight.updated_at = timezone.now()
    weight.save()
    return weight


def hint_feedback_set(
    *, tenant: Tenant, actor: Actor, incident: Incident, cause: str, verdict: str
) -> HintWeight:
    """Record (or change) the actor's verdict on `cause` for `incident`; `verdict` "" takes
    the vote back. Returns the cause's recounted weight for the tenant."""
    if verdict not in (*Verdict.values, ""):
        message = "must be 'right', 'wrong' or '' (take the vote back)."
        raise ValidationFailed(message, field="verdict")
    user_id = _voter_id(actor)
    name = _cause_name(tenant, cause)
    key = learning.cause_key(name)
    with transaction.atomic():
        locked = incident_locked(tenant=tenant, incident=incident)
        # One weight row per cause, locked: concurrent votes recount one after the other.
        HintWeight.objects.get_or_create(tenant=tenant, cause_key=key, defaults={"cause": name})
        HintWeight.objects.select_for_update().filter(tenant=tenant, cause_key=key).first()
        existing = HintFeedback.objects.filter(
            tenant=tenant, incident=locked, cause_key=key, user_id=user_id
        ).first()
        before = existing.verdict if existing else ""
        if verdict == before:
            return _recount(tenant=tenant, key=key, name=name)
        if not verdict and existing is not None:
            existing.delete()
        elif existing is not None:
            existing.verdict, existing.updated_at = verdict, timezone.now()
            existing.save(update_fields=["verdict", "updated_at"])
        else:
            HintFeedback.objects.create(
                tenant=tenant,
                incident=locked,
                cause_key=key,
                cause=name,
                user_id=user_id,
                verdict=verdict,
            )
        weight = _recount(tenant=tenant, key=key, name=name)
        said = f"marked {name!r} {verdict}" if verdict else f"took back their vote on {name!r}"
        timeline_append(
            tenant=tenant,
            incident=locked,
            kind=EventKind.HINT,
            message=f"{said}; the tenant's weight of this cause is now x{weight.multiplier:.2f}",
            data={"cause": name, "verdict": verdict, "before": before},
            actor=actor,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="hint_feedback.set",
            obj=locked,
            before={"cause": name, "verdict": before},
            after={"cause": name, "verdict": verdict, "multiplier": weight.multiplier},
        )
    return weight
