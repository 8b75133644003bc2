"""SLA contracts (services and selectors): a versioned YAML document per deployment, validated
against the JSON Schema in serving/slo; an invalid document is refused whole (400 naming the
line and field) and the contract in force stays as it was."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction

from portal.exceptions import ConflictError, ValidationFailed
from serving.deployments.models import Deployment
from serving.ops.models import SlaContract
from serving.slo.model import Contract
from serving.slo.parse import ContractError, parse_contract
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record


class ContractInvalid(ValidationFailed):
    """Every problem of a refused document, each under its field path with its line."""

    def __init__(self, error: ContractError) -> None:
        first = error.errors[0] if error.errors else None
        where = f"line {first.line}: " if first and first.line else ""
        summary = f"{where}{first.message}" if first else str(error)
        super().__init__(
            f"invalid contract: {summary}",
            field=(first.field or "document") if first else "document",
        )
        self.errors = error.errors

    @property
    def fields(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for item in self.errors:
            where = f"line {item.line}: " if item.line else ""
            out.setdefault(item.field or "document", []).append(f"{where}{item.message}")
        return out


def contract_current(*, tenant: Tenant, deployment: Deployment) -> SlaContract | None:
    return (
        SlaContract.objects.filter(tenant=tenant, deployment=deployment)
        .order_by("-version")
        .first()
    )


def contract_list(*, tenant: Tenant, deployment: Deployment) -> Any:
    return SlaContract.objects.filter(tenant=tenant, deployment=deployment).order_by("-version")


def contract_parse(source: str) -> Contract:
    if not isinstance(source, str) or not source.strip():
        raise ValidationFailed("send the contract's YAML.", field="source")
    try:
        return parse_contract(source)
    except ContractError as exc:
        raise ContractInvalid(exc) from exc


def contract_set(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, source: str
) -> SlaContract:
    """A new version of the deployment's contract, in force from the next health tick."""
    contract = contract_parse(source)
    if deployment.deleted_at is not None:
        raise ConflictError("this deployment is deleted.", field="deployment")
    with transaction.atomic():
        Deployment.objects.select_for_update(of=("self",)).get(pk=deployment.pk, tenant=tenant)
        current = contract_current(tenant=tenant, deployment=deployment)
        if current is not None and current.source == source:
            return current
        row = SlaContract(
            tenant=tenant,
            deployment=deployment,
            version=(current.version + 1) if current else 1,
            name=contract.name,
            source=source,
            document=contract.to_dict(),
            created_by_id=actor.user_id,
        )
        row.full_clean()
        try:
            row.save()
        except IntegrityError:
            raise ConflictError("the contract changed meanwhile; retry.", field="source") from None
        audit_record(
            tenant=tenant,
            actor=actor,
            action="contract.set",
            obj=deployment,
            after={"contract": contract.name, "version": row.version},
        )
    return row


def contract_import_openslo(
    *, tenant: Tenant, actor: Actor, deployment: Deployment, text: str
) -> tuple[SlaContract, list[str]]:
    """An OpenSLO v1 document stream as the deployment's new contract; the warnings list what
    did not map."""
    import yaml

    from serving.slo.openslo import import_openslo

    if not isinstance(text, str) or not text.strip():
        raise ValidationFailed("send the OpenSLO YAML.", field="source")
    try:
        contract, warnings = import_openslo(text)
    except ContractError as exc:
        raise ContractInvalid(exc) from exc
    source = yaml.safe_dump(contract.to_dict(), sort_keys=False)
    return contract_set(tenant=tenant, actor=actor, deployment=deployment, source=source), warnings


def contract_export_openslo(*, contract: SlaContract, service: str) -> str:
    from serving.slo.openslo import export_openslo

    return export_openslo(Contract.from_dict(contract.document), service=service)


def contracts_in_force() -> list[tuple[str, str, SlaContract]]:
    """(tenant slug, deployment name, contract in force) of every live deployment that has a
    contract: platform-wide, for /metrics/rules (one query)."""
    rows = (
        SlaContract.objects.filter(deployment__deleted_at__isnull=True)
        .select_related("tenant", "deployment")
        .order_by("deployment_id", "-version")
        .distinct("deployment_id")
    )
    return [(row.tenant.slug, row.deployment.name, row) for row in rows]


def contract_export_rules(*, entries: Iterable[tuple[str, str, SlaContract]]) -> str:
    """Prometheus rules (YAML `groups:`) of contracts, each given with the tenant slug and
    deployment name that its series carry on /metrics (serving.slo.rules)."""
    from serving.slo.rules import RuleTarget, rules_yaml

    return rules_yaml(
        RuleTarget(tenant=slug, deployment=name, contract=Contract.from_dict(row.document))
        for slug, name, row in entries
    )


def features_report(
    *, tenant: Tenant, deployment: Deployment, drift: Any = None, freshness: Any = None
) -> dict[str, Any]:
    """What the tenant reports about its features, for the contract's drift (PSI) and feature
    freshness objectives: `drift` {feature: counts per reference bin}, `freshness` {feature:
    when it was last updated, epoch seconds}. Kept in Redis (merged with earlier reports) and
    evaluated by the next health tick."""
    import json
    import time

    from serving.ops.health.state import health_keys, health_redis

    current = contract_current(tenant=tenant, deployment=deployment)
    if current is None:
        raise ConflictError(
            "set an SLA contract with drift or freshness objectives first.", field="contract"
        )
    contract = Contract.from_dict(current.document)
    references = {
        o.feature: o.reference
        for o in contract.objectives
        if o.sli == "drift_psi" and o.feature and o.reference
    }
    fresh_features = {o.feature for o in contract.objectives if o.sli == "feature_freshness"}
    clean: dict[str, dict[str, Any]] = {"drift": {}, "freshness": {}}
    for feature, counts in (drift or {}).items():
        field = f"drift.{feature}"
        if feature not in references:
            raise ValidationFailed(
                "no drift objective of the contract watches this feature.", field=field
            )
        bins = len(references[feature].counts)
        if (
            not isinstance(counts, list)
            or len(counts) != bins
            or not all(isinstance(c, int | float) and c >= 0 for c in counts)
        ):
            raise ValidationFailed(
                f"give {bins} non-negative counts, one per reference bin.", field=field
            )
        clean["drift"][feature] = [float(c) for c in counts]
    for feature, updated in (freshness or {}).items():
        field = f"freshness.{feature}"
        if feature not in fresh_features:
            raise ValidationFailed(
                "no freshness objective of the contract watches this feature.", field=field
            )
        if not isinstance(updated, int | float) or updated <= 0 or updated > time.time() + 60:
            raise ValidationFailed(
                "epoch seconds of the last update, not in the future.", field=field
            )
        clean["freshness"][feature] = float(updated)
    r = health_redis()
    key = health_keys()["features"]
    old = json.loads(r.hget(key, str(deployment.pk)) or "{}")
    merged = {kind: {**old.get(kind, {}), **clean[kind]} for kind in ("drift", "freshness")}
    r.hset(key, str(deployment.pk), json.dumps(merged, separators=(",", ":")))
    return merged
