"""Writes of the version checks: start one (bounded, tenant-scoped, enqueued on commit), run
it (queued -> running -> done | failed), and the per-tenant throttle on starting them.

A check runs the version's own engine in the validation worker, loaded the way a replica loads
it, never a Serve app: it takes no capacity from what serves, and its figures are the
version's, not a neighbour's (docs/architecture.md, "Checks before a canary")."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal import ratelimit
from portal.exceptions import ConflictError, QuotaExceeded, ValidationFailed
from portal.validation import clean_or_fail
from serving.deployments.selectors import deployment_get
from serving.ops.checks import judge, limits, load
from serving.ops.checks.models import ACTIVE_STATUSES, CheckKind, CheckStatus, VersionCheck
from serving.ops.contracts import contract_current
from serving.registry import artifacts
from serving.registry.models import ModelVersion, VersionStatus
from serving.slo.model import Contract
from tenants.actors import Actor
from tenants.models import Tenant
from tenants.services import audit_record

logger = logging.getLogger(__name__)


def version_check_throttle(*, tenant: Tenant) -> float:
    """Charge one check to the tenant's bucket (CHECKS_PER_HOUR); seconds to wait, else 0."""
    rate = limits.CHECKS_PER_HOUR / 3600
    bucket = ratelimit.Bucket(f"version-checks:{tenant.pk}", rate, burst=limits.CHECKS_PER_HOUR)
    return ratelimit.throttle([bucket])


def version_check_start(
    *, tenant: Tenant, actor: Actor, version: ModelVersion, kind: str, params: Any
) -> VersionCheck:
    """Queue a `verify` (against a deployment's contract) or `benchmark` of a ready version
    of `tenant`; runs in the background (serving.run_version_check)."""
    from serving.ops.checks.tasks import run_version_check

    if kind not in CheckKind.values:
        raise ValidationFailed(f"Unknown check {kind!r}.", field="kind")
    clean = limits.clean_params(kind, params)
    if version.tenant_id != tenant.pk:
        raise ValidationFailed("Unknown version.", field="version")
    if version.status != VersionStatus.READY:
        raise ConflictError(
            f"The version is {version.status}; only a ready version is checked.", field="version"
        )
    if "builtin" not in (version.engines or ["builtin"]):
        raise ValidationFailed(
            "Checks run the built-in engine; this version is validated for vLLM only.",
            field="version",
        )
    deployment = None
    if kind == CheckKind.VERIFY:
        if "deployment_id" not in params:
            raise ValidationFailed(
                "Name the deployment whose contract applies.", field="deployment_id"
            )
        deployment = deployment_get(tenant=tenant, pk=params["deployment_id"])
        if contract_current(tenant=tenant, deployment=deployment) is None:
            raise ValidationFailed("This deployment has no contract yet.", field="deployment_id")
    with transaction.atomic():
        # One tenant's checks queue one after another on its row lock: the count is exact.
        Tenant.objects.select_for_update().get(pk=tenant.pk)
        active = VersionCheck.objects.filter(tenant=tenant, status__in=ACTIVE_STATUSES).count()
        if active >= limits.MAX_ACTIVE_PER_TENANT:
            raise QuotaExceeded(
                f"{active} checks are already queued or running (at most "
                f"{limits.MAX_ACTIVE_PER_TENANT}); wait for one to finish.",
                field="kind",
            )
        check = VersionCheck(
            tenant=tenant,
            version=version,
            deployment=deployment,
            kind=kind,
            params=clean,
            created_by_id=actor.user_id,
        )
        clean_or_fail(check)
        check.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action=f"version.{kind}_requested",
            obj=version,
            after={"check": check.pk, "deployment": deployment.pk if deployment else None},
        )
        transaction.on_commit(lambda: run_version_check.delay(check.pk))
    return check


def _claim(check_id: int) -> VersionCheck | None:
    with transaction.atomic():
        check = (
            VersionCheck.objects.select_for_update(of=("self",))
            .select_related("version__model", "deployment", "tenant")
            .filter(pk=check_id)
            .first()
        )
        if check is None or check.status not in ACTIVE_STATUSES:
            return None
        # RUNNING again after a dead worker (acks_late): the run starts over.
        check.status, check.started_at = CheckStatus.RUNNING, timezone.now()
        check.save(update_fields=["status", "started_at"])
        return check


def _finish(check_id: int, **fields: Any) -> VersionCheck | None:
    with transaction.atomic():
        check = VersionCheck.objects.select_for_update().filter(pk=check_id).first()
        if check is None or check.status != CheckStatus.RUNNING:
            return check
        for name, value in fields.items():
            setattr(check, name, value)
        check.finished_at = timezone.now()
        check.save()
        return check


def _public(level: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in level.items() if not k.startswith("_")}


def version_check_run(*, check_id: int) -> VersionCheck | None:
    """Run one queued check to its end: done with its figures (verify: rows and verdict;
    benchmark: levels and a contract draft), or failed with the reason."""
    check = _claim(check_id)
    if check is None:
        return VersionCheck.objects.filter(pk=check_id).first()
    params, version = check.params, check.version
    try:
        contract = None
        if check.kind == CheckKind.VERIFY:
            current = contract_current(tenant=check.tenant, deployment=check.deployment)
            if current is None:
                raise ValidationFailed(
                    "the deployment's contract was removed", field="deployment_id"
                )
            contract = Contract.from_dict(current.document)
        directory = artifacts.local_directory(version.artifact_uri)
        started = time.perf_counter()
        engine, tokenizer = load.load_engine(directory, version.sha256 or version.artifact_uri)
        try:
            load_s = round(time.perf_counter() - started, 3)
            levels = load.run_levels(
                engine,
                tokenizer,
                params["prompts"],
                concurrencies=params.get("concurrencies") or [params["concurrency"]],
                requests=params["requests"],
                max_tokens=params["max_tokens"],
                max_duration_s=params["duration_s"],
            )
        finally:
            engine.stop()
    except Exception as exc:  # the check ends failed with the cause, never half-written
        logger.warning("version check %s failed: %s", check_id, exc)
        return _finish(check_id, status=CheckStatus.FAILED, error=str(exc)[:500])
    result: dict[str, Any] = {
        "engine": "builtin (in-process, CPU)",
        "load_s": load_s,
        "levels": [_public(lv) for lv in levels],
    }
    if contract is not None:
        rows, verdict = judge.judge(
            contract, levels[0], drift=params.get("drift_sample"), gates=params.get("gates", {})
        )
        result["objectives"] = rows
        return _finish(check_id, status=CheckStatus.DONE, result=result, verdict=verdict)
    label = re.sub(r"[^a-z0-9-]+", "-", f"{version.model.name}-{version.label}".lower())
    name = label.strip("-")[:63].strip("-") or "draft"
    draft = judge.draft_contract(name, levels)
    return _finish(check_id, status=CheckStatus.DONE, result=result, draft=draft)
