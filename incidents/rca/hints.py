"""Root-cause hints: a small causal graph (symptom -> likely cause -> suggested fix), seeded
with the failure modes of GPU serving, matched against an incident's signals.

Pure functions: `rank_hints(signals, tenant_rules)` takes the signals of
`incidents.signals.incident_signals` and the tenant's active rules. A tenant rule whose cause
names a seeded cause (case-insensitive) adds a symptom to that cause; any other cause is a
new node. A cause scores the summed weights of its matched symptoms; a symptom on a missing
signal never matches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol


class RuleLike(Protocol):
    """What a symptom edge needs; `incidents.models.CauseRule` has these attributes."""

    symptom: str
    op: str
    threshold: float | None
    cause: str
    fix: str
    weight: float


@dataclass(frozen=True)
class Symptom:
    signal: str
    op: str  # gt | gte | lt | lte | eq | true
    threshold: float | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class Cause:
    name: str
    fix: str
    symptoms: tuple[Symptom, ...]


@dataclass
class Hint:
    cause: str
    fix: str
    score: float
    evidence: list[str] = field(default_factory=list)
    # What the tenant's votes made of it (incidents.rca.learning): the score before them.
    base_score: float | None = None
    multiplier: float = 1.0
    right: int = 0
    wrong: int = 0


OP_SIGNS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<=", "eq": "=="}

SEEDED: tuple[Cause, ...] = (
    Cause(
        "KV cache exhausted",
        "Raise kv_blocks or lower max_num_seqs / max_tokens; check for long-context floods.",
        (
            Symptom("kv_usage", "gte", 0.95, 3.0),
            Symptom("preemptions", "gt", 0, 2.0),
            Symptom("evictions", "gt", 0, 1.0),
            Symptom("fragmentation", "gte", 0.5, 1.0),
        ),
    ),
    Cause(
        "GPU memory leak",
        "Restart the replicas one by one to reclaim memory, then find what grows "
        "(caches without bounds, tensors kept alive); compare with the previous version.",
        (Symptom("gpu_memory_growth_mb_per_min", "gt", 0, 3.0),),
    ),
    Cause(
        "Canary regression",
        "Roll back the canary, then compare the two versions (weights, config, engine).",
        (
            Symptom("canary_involved", "true", None, 1.0),
            Symptom("canary_error_ratio_vs_stable", "gte", 2.0, 3.0),
            Symptom("canary_latency_p95_vs_stable", "gte", 1.5, 2.0),
        ),
    ),
    Cause(
        "Replica crash loop",
        "Read the replicas' logs for the crash (OOM, CUDA errors, bad weights); roll back "
        "to the last good revision if it started with a change.",
        (Symptom("replica_restarts", "gte", 2, 4.0),),
    ),
    Cause(
        "Control-plane delay",
        "Check the reconcile runs (Ray Serve API, head node load); changes reach the data "
        "plane late or not at all while it lags.",
        (
            Symptom("reconcile_p95_ms", "gt", 5000, 2.0),
            Symptom("reconcile_failures", "gt", 0, 2.0),
        ),
    ),
    Cause(
        "Input flood",
        "Rate-limit or shed the flood (guard limits, per-key quotas), scale out if it is "
        "real demand.",
        (
            Symptom("request_rate_ratio", "gte", 3.0, 3.0),
            Symptom("rejected_ratio", "gte", 0.2, 2.0),
        ),
    ),
    # What Serve and the replicas said (incidents.rca.symptoms).
    Cause(
        "Out of GPU memory",
        "Lower max_num_seqs / kv_blocks or the batch, or give each replica more GPU memory; "
        "check for a leak if it grew over time.",
        (Symptom("serve_out_of_memory", "gt", 0, 4.0), Symptom("serve_cuda_error", "gt", 0, 1.0)),
    ),
    Cause(
        "Tokenizer mismatch",
        "Ship the tokenizer files with the weights and check that they belong to this model "
        "(vocabulary size, special tokens, chat template).",
        (Symptom("serve_tokenizer_error", "gt", 0, 4.0),),
    ),
    Cause(
        "Model fails to load",
        "Check the artifact (files present, safetensors intact, config.json) and the replica's "
        "resources; roll back to the last good version.",
        (Symptom("serve_load_failure", "gt", 0, 4.0), Symptom("serve_unplaceable", "gt", 0, 1.0)),
    ),
)


def _fmt(value: float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:.4g}"


def match(symptom: Symptom, signals: Mapping[str, float | bool]) -> str | None:
    """The evidence line when `symptom` holds for `signals`, else None."""
    if symptom.signal not in signals:
        return None
    value = signals[symptom.signal]
    if symptom.op == "true":
        return f"{symptom.signal} = {_fmt(value)}" if bool(value) else None
    if symptom.threshold is None or symptom.op not in OP_SIGNS:
        return None
    number, threshold = float(value), float(symptom.threshold)
    if math.isnan(number):
        return None
    holds = {
        "gt": number > threshold,
        "gte": number >= threshold,
        "lt": number < threshold,
        "lte": number <= threshold,
        "eq": math.isclose(number, threshold, rel_tol=1e-9, abs_tol=1e-12),
    }[symptom.op]
    if not holds:
        return None
    return f"{symptom.signal} = {_fmt(number)} {OP_SIGNS[symptom.op]} {_fmt(threshold)}"


def graph(tenant_rules: Iterable[RuleLike] = ()) -> list[Cause]:
    """The seeded causes with the tenant's rules joined in."""
    causes = {cause.name.casefold(): cause for cause in SEEDED}
    for rule in tenant_rules:
        symptom = Symptom(rule.symptom, rule.op, rule.threshold, float(rule.weight))
        key = rule.cause.strip().casefold()
        known = causes.get(key)
        if known is None:
            causes[key] = Cause(rule.cause.strip(), rule.fix, (symptom,))
        else:
            fix = known.fix if not rule.fix or rule.fix in known.fix else f"{known.fix} {rule.fix}"
            causes[key] = Cause(known.name, fix, (*known.symptoms, symptom))
    return list(causes.values())


def rank_hints(
    signals: Mapping[str, float | bool], tenant_rules: Iterable[RuleLike] = ()
) -> list[Hint]:
    """Causes with at least one matched symptom, best first (ties by name)."""
    hints = []
    for cause in graph(tenant_rules):
        evidence, score = [], 0.0
        for symptom in cause.symptoms:
            line = match(symptom, signals)
            if line is not None:
                evidence.append(line)
                score += symptom.weight
        if evidence and score > 0:
            hints.append(Hint(cause.name, cause.fix, round(score, 3), evidence))
    return sorted(hints, key=lambda h: (-h.score, h.cause))
