"""Cause rules (services): the tenant's own root-cause rules. The one check of a rule's fields
(`_check_rule`), which the API and the cause-rules page both go through."""

from __future__ import annotations

import math
from typing import Any

from django.db import transaction

from incidents.models import CauseRule, RuleOp
from incidents.rca.evidence import SIGNAL_NAMES
from portal.exceptions import ConflictError, ValidationFailed
from portal.validation import clean_or_fail
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

RULE_FIELDS = ("symptom", "op", "threshold", "cause", "fix", "weight", "is_active")


MAX_RULES = 200
FIX_MAX = 2000


def _check_rule(rule: CauseRule) -> None:
    if rule.symptom not in SIGNAL_NAMES:
        raise ValidationFailed(f"must be one of {', '.join(SIGNAL_NAMES)}.", field="symptom")
    if rule.op not in RuleOp.values:
        raise ValidationFailed(f"must be one of {', '.join(RuleOp.values)}.", field="op")
    if rule.op != RuleOp.TRUE and rule.threshold is None:
        raise ValidationFailed(f"the {rule.op!r} rule needs a threshold.", field="threshold")
    if rule.op == RuleOp.TRUE:
        rule.threshold = None
    if rule.threshold is not None and not math.isfinite(rule.threshold):
        raise ValidationFailed("must be a finite number.", field="threshold")
    rule.cause = (rule.cause or "").strip()
    if not rule.cause:
        raise ValidationFailed("name the likely cause.", field="cause")
    rule.fix = (rule.fix or "").strip()
    if len(rule.fix) > FIX_MAX:
        raise ValidationFailed(f"at most {FIX_MAX} characters.", field="fix")
    if rule.weight is None or not math.isfinite(rule.weight):
        raise ValidationFailed("must be a finite number from 0 to 10.", field="weight")
    clean_or_fail(rule, exclude=["tenant"])


def _rule_snapshot(rule: CauseRule) -> dict[str, Any]:
    return {name: getattr(rule, name) for name in RULE_FIELDS}


def cause_rule_create(
    *,
    tenant: Tenant,
    actor: Actor,
    symptom: str,
    op: str,
    cause: str,
    threshold: float | None = None,
    fix: str = "",
    weight: float = 1.0,
    is_active: bool = True,
) -> CauseRule:
    """A tenant's own symptom -> cause edge of the hint graph."""
    rule = CauseRule(
        tenant=tenant,
        symptom=symptom,
        op=op,
        threshold=threshold,
        cause=cause,
        fix=fix,
        weight=weight,
        is_active=is_active,
    )
    _check_rule(rule)
    with transaction.atomic():
        if CauseRule.objects.filter(tenant=tenant).count() >= MAX_RULES:
            raise ConflictError(f"a tenant keeps at most {MAX_RULES} rules.", field="symptom")
        rule.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="cause_rule.created",
            obj=rule,
            after=_rule_snapshot(rule),
        )
    return rule


def cause_rule_update(
    *, tenant: Tenant, actor: Actor, rule: CauseRule, changes: dict[str, Any]
) -> CauseRule:
    unknown = sorted(set(changes) - set(RULE_FIELDS))
    if unknown:
        raise ValidationFailed("cannot be changed.", field=unknown[0])
    with transaction.atomic():
        locked = CauseRule.objects.select_for_update().get(pk=rule.pk, tenant=tenant)
        before = _rule_snapshot(locked)
        for name, value in changes.items():
            setattr(locked, name, value)
        _check_rule(locked)
        locked.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="cause_rule.changed",
            obj=locked,
            before=before,
            after=_rule_snapshot(locked),
        )
    return locked


def cause_rule_delete(*, tenant: Tenant, actor: Actor, rule: CauseRule) -> None:
    with transaction.atomic():
        locked = CauseRule.objects.select_for_update().get(pk=rule.pk, tenant=tenant)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="cause_rule.deleted",
            obj=locked,
            before=_rule_snapshot(locked),
        )
        locked.delete()
