"""Symptoms in what Serve and the replicas said: out of memory, tokenizer errors, load
failures (and CUDA errors, unplaceable replicas), classified by pattern from the messages the
portal stores, each an evidence item of an incident.

Sources, all of the incident's own deployment and tenant: the deployment's status message
(Serve's application and deployment messages, copied by the reconcile's status refresh) when it
changed inside the incident's window, the failed or unhealthy revisions' `serve_message`, and
the failed hot reloads the replicas reported (the incident's `reload` breaches). Reconcile runs
are platform-wide (their errors may name other tenants' applications), so they are not read.
The portal stores no replica log files; `classify` takes any text, so a log source can join.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from incidents.models import BreachKind, Incident, SlaBreach
from serving.deployments.models import Deployment, DeploymentRevision
from tenants.models import Tenant

EXCERPT_CHARS = 300
MAX_TEXT_CHARS = 20_000  # of one message: a tenant-made message cannot make this slow
MAX_ITEMS = 20

# (symptom, label, pattern): the first pattern that matches a line names its symptom.
PATTERNS: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    (
        "out_of_memory",
        "Out of memory",
        re.compile(
            r"out of memory|OutOfMemoryError|\bOOM\b|oom[-_ ]?kill|MemoryError|"
            r"memory limit|running low on memory|Cannot allocate memory|CUBLAS_STATUS_ALLOC_FAILED",
            re.IGNORECASE,
        ),
    ),
    (
        "tokenizer_error",
        "Tokenizer error",
        re.compile(
            r"tokeni[sz]er|sentencepiece|tokenizer\.json|vocab(ulary)?\b|special[_ ]tokens|"
            r"chat[_ ]template",
            re.IGNORECASE,
        ),
    ),
    (
        "load_failure",
        "Model load failure",
        re.compile(
            r"safetensors|checkpoint|state_dict|failed to load|could not load|cannot load|"
            r"unable to load|error loading|load(ing)? (the )?(model|weights)|weights? .*(missing|"
            r"not found|corrupt)|No such file or directory|config\.json|"
            r"(replica|deployment) .*failed to (start|initiali[sz]e)|constructor",
            re.IGNORECASE,
        ),
    ),
    (
        "cuda_error",
        "CUDA error",
        re.compile(r"CUDA error|cudaError|device-side assert|NCCL error|illegal memory access"),
    ),
    (
        "unplaceable",
        "Replicas cannot be placed",
        re.compile(r"cannot place|insufficient resources|no available node", re.IGNORECASE),
    ),
)
SYMPTOM_LABELS = {name: label for name, label, _ in PATTERNS}


@dataclass(frozen=True)
class SymptomItem:
    symptom: str
    label: str
    source: str
    at: datetime | None
    excerpt: str


def classify(text: str) -> list[tuple[str, str]]:
    """(symptom, the line that shows it) for each symptom found in `text`, once each."""
    found: dict[str, str] = {}
    for line in text[:MAX_TEXT_CHARS].splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        for name, _, pattern in PATTERNS:
            if name not in found and pattern.search(stripped):
                found[name] = stripped[:EXCERPT_CHARS]
                break
    return list(found.items())


def items_of(messages: Iterable[tuple[str, datetime | None, str]]) -> list[SymptomItem]:
    """Evidence items of (source, at, text) messages; one per symptom and source."""
    items: list[SymptomItem] = []
    for source, at, text in messages:
        for name, excerpt in classify(text or ""):
            items.append(SymptomItem(name, SYMPTOM_LABELS[name], source, at, excerpt))
    return items[:MAX_ITEMS]


def serve_messages(
    *,
    tenant: Tenant,
    incident: Incident,
    start: datetime,
    end: datetime,
    breaches: Sequence[SlaBreach] | None = None,
) -> list[tuple[str, datetime | None, str]]:
    """What Serve and the replicas said about the incident's deployment in [start, end]
    (`breaches`: the incident's, when the caller has read them)."""
    out: list[tuple[str, datetime | None, str]] = []
    if incident.deployment_id is not None:
        deployment: Deployment | None = None
        if Incident.deployment.is_cached(incident):  # type: ignore[attr-defined]
            deployment = incident.deployment
        if deployment is None or deployment.tenant_id != tenant.pk:
            deployment = (
                Deployment.objects.filter(tenant=tenant, pk=incident.deployment_id)
                .only("status", "status_message", "status_at")
                .first()
            )
        if deployment is not None and deployment.status_message:
            at = deployment.status_at
            if at is None or start <= at <= end or (incident.is_open and at <= end):
                source = f"deployment status ({deployment.status})"
                out.append((source, at, deployment.status_message))
        revisions = (
            DeploymentRevision.objects.filter(tenant=tenant, deployment_id=incident.deployment_id)
            .exclude(serve_message="")
            .filter(created_at__lte=end)
            .order_by("-number")
            .only("number", "serve_status", "serve_message", "applied_at", "created_at")[:5]
        )
        for revision in revisions:
            at = revision.applied_at or revision.created_at
            source = f"revision r{revision.number} ({revision.serve_status.lower() or 'serve'})"
            out.append((source, at, revision.serve_message))
    if breaches is None:
        breaches = list(
            SlaBreach.objects.filter(tenant=tenant, incident=incident, kind=BreachKind.RELOAD)
            .only("kind", "detail", "observed", "detected_at")
            .order_by("detected_at")[:10]
        )
    reloads = [b for b in breaches if b.kind == BreachKind.RELOAD and b.tenant_id == tenant.pk]
    for breach in reloads[:10]:
        observed: Any = breach.observed if isinstance(breach.observed, dict) else {}
        text = "\n".join(str(part) for part in (observed.get("error"), breach.detail) if part)
        source = f"replica {observed.get('replica', '?')} (hot reload)"
        out.append((source, breach.detected_at, text))
    return out


def symptom_counts(items: Iterable[SymptomItem]) -> dict[str, float]:
    """Signals of the symptoms (`serve_<symptom>`: how many sources show it)."""
    counts: dict[str, float] = {}
    for item in items:
        counts[f"serve_{item.symptom}"] = counts.get(f"serve_{item.symptom}", 0.0) + 1.0
    return counts
