"""Similar past incidents of the same tenant: the same symptoms (breach kinds, breached SLIs,
what Serve said, causes people confirmed) on the same deployment or model version, ranked.

Score (higher is more alike): 2 x Jaccard of the breach kinds + 2 x Jaccard of the breached
objectives + 2 x Jaccard of the Serve symptoms + 3 x the share of this incident's likely causes
that people marked right on the other one, + 1.5 for the same deployment + 1.5 for a shared
model version (the revision in force when each was triggered). An incident with no symptom in
common is never listed, however close its deployment. Four queries whatever the history: the
newest CANDIDATES incidents with the revision in force at each (a subquery per row, so a long
revision history is never read whole), this incident's, their breaches, the confirmed causes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from incidents.models import Incident, SlaBreach
from incidents.rca import learning
from incidents.rca.models import HintFeedback, Verdict
from incidents.rca.symptoms import classify
from serving.deployments.models import DeploymentRevision
from tenants.models import Tenant

CANDIDATES = 300  # the newest incidents compared
MAX_SIMILAR = 5
MIN_SCORE = 1.0


@dataclass
class Similar:
    id: int
    title: str
    severity: str
    status: str
    is_drill: bool
    triggered_at: datetime
    deployment_name: str | None
    score: float
    reasons: list[str] = field(default_factory=list)


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


REVISION_FIELDS = ("stable_version_id", "canary_version_id", "serve_message")


def _with_revision(incidents: QuerySet[Incident], tenant: Tenant) -> QuerySet[Incident]:
    """`incidents` annotated with the fields of the revision in force when each was
    triggered (the newest applied, or else created, by then): `rev_<field>`."""
    in_force = (
        DeploymentRevision.objects.filter(tenant=tenant, deployment_id=OuterRef("deployment_id"))
        .annotate(since=Coalesce("applied_at", "created_at"))
        .filter(since__lte=OuterRef("triggered_at"))
        .order_by("-number")
    )
    return incidents.annotate(
        **{f"rev_{name}": Subquery(in_force.values(name)[:1]) for name in REVISION_FIELDS}
    )


def _features(
    rows: Iterable[dict[str, Any]], breaches: dict[int, list[tuple[str, str]]]
) -> dict[int, dict[str, Any]]:
    out = {}
    for row in rows:
        pair = (row["rev_stable_version_id"], row["rev_canary_version_id"])
        versions = {v for v in pair if v}
        symptoms = {name for name, _ in classify(row["rev_serve_message"] or "")}
        out[row["id"]] = {
            "kinds": {kind for kind, _ in breaches.get(row["id"], [])},
            "objectives": {objective for _, objective in breaches.get(row["id"], [])},
            "versions": versions,
            "symptoms": symptoms,
        }
    return out


def _score(
    mine: dict[str, Any], other: dict[str, Any], causes: set[str], confirmed: set[str]
) -> tuple[float, list[str]]:
    reasons, symptom_score = [], 0.0
    for name, label in (
        ("kinds", "breach kinds"),
        ("objectives", "breached SLIs"),
        ("symptoms", "Serve symptoms"),
    ):
        common = mine[name] & other[name]
        if common:
            symptom_score += 2.0 * jaccard(mine[name], other[name])
            reasons.append(f"same {label}: {', '.join(sorted(common))}")
    shared_causes = causes & confirmed
    if shared_causes:
        symptom_score += 3.0 * len(shared_causes) / len(causes)
        reasons.append(f"confirmed cause: {', '.join(sorted(shared_causes))}")
    if symptom_score == 0:
        return 0.0, []
    score = symptom_score
    if mine["deployment_id"] is not None and mine["deployment_id"] == other["deployment_id"]:
        score += 1.5
        reasons.append("same deployment")
    if mine["versions"] & other["versions"]:
        score += 1.5
        reasons.append("same model version")
    return round(score, 3), reasons


def similar_incidents(
    *, tenant: Tenant, incident: Incident, causes: Iterable[str] = ()
) -> list[Similar]:
    """The tenant's past incidents most like `incident` (`causes`: its likely causes)."""
    fields = ("id", "title", "severity", "status", "is_drill", "triggered_at", "deployment_id")
    revision = [f"rev_{name}" for name in REVISION_FIELDS]
    mine_and_past = _with_revision(
        Incident.objects.filter(tenant=tenant, triggered_at__lte=incident.triggered_at), tenant
    )
    rows = list(
        mine_and_past.exclude(pk=incident.pk)
        .order_by("-triggered_at", "-id")
        .values(*fields, *revision, "deployment__name")[:CANDIDATES]
    )
    if not rows:
        return []
    me = {f: getattr(incident, f) for f in fields} | (
        mine_and_past.filter(pk=incident.pk).values(*revision).first() or dict.fromkeys(revision)
    )
    ids = [r["id"] for r in rows] + [incident.pk]
    breaches: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for incident_id, kind, objective in SlaBreach.objects.filter(
        tenant=tenant, incident_id__in=ids
    ).values_list("incident_id", "kind", "objective"):
        breaches[incident_id].append((kind, objective))
    confirmed: dict[int, set[str]] = defaultdict(set)
    for incident_id, key in HintFeedback.objects.filter(
        tenant=tenant, incident_id__in=ids, verdict=Verdict.RIGHT
    ).values_list("incident_id", "cause_key"):
        confirmed[incident_id].add(key)
    features = _features([*rows, me], breaches)
    for row in [*rows, me]:
        features[row["id"]]["deployment_id"] = row["deployment_id"]
    mine = features[incident.pk]
    keys = {learning.cause_key(c) for c in causes} | confirmed[incident.pk]
    found = []
    for row in rows:
        score, reasons = _score(mine, features[row["id"]], keys, confirmed[row["id"]])
        if score >= MIN_SCORE:
            found.append(
                Similar(
                    id=row["id"],
                    title=row["title"],
                    severity=row["severity"],
                    status=row["status"],
                    is_drill=row["is_drill"],
                    triggered_at=row["triggered_at"],
                    deployment_name=row["deployment__name"],
                    score=score,
                    reasons=reasons,
                )
            )
    found.sort(key=lambda s: (-s.score, -s.triggered_at.timestamp(), -s.id))
    return found[:MAX_SIMILAR]
