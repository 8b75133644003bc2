"""Root-cause hints: the seeded graph against signal tables, tenant rules joining it, and the
comparison operators. Pure functions: no database."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from incidents.rca.evidence import SIGNAL_NAMES
from incidents.rca.hints import SEEDED, Symptom, graph, match, rank_hints


@dataclass
class Rule:
    symptom: str
    op: str
    threshold: float | None
    cause: str
    fix: str = ""
    weight: float = 1.0


# (name, signals, expected top cause, evidence line expected in the top hint)
CASES = [
    ("kv exhausted by usage", {"kv_usage": 0.97}, "KV cache exhausted", "kv_usage = 0.97 >= 0.95"),
    ("kv exhausted by preemptions", {"kv_usage": 0.5, "preemptions": 12.0}, "KV cache exhausted", "preemptions = 12 > 0"),
    ("gpu leak", {"gpu_memory_growth_mb_per_min": 35.0}, "GPU memory leak", "gpu_memory_growth_mb_per_min = 35 > 0"),
    ("canary regression", {"canary_involved": True, "canary_error_ratio_vs_stable": 8.0, "error_ratio_canary": 0.4}, "Canary regression", "canary_error_ratio_vs_stable = 8 >= 2"),
    ("canary slower", {"canary_involved": True, "canary_latency_p95_vs_stable": 4.0}, "Canary regression", "canary_involved = true"),
    ("crash loop", {"replica_restarts": 3.0, "kv_usage": 0.2}, "Replica crash loop", "replica_restarts = 3 >= 2"),
    ("control plane slow", {"reconcile_p95_ms": 7200.0}, "Control-plane delay", "reconcile_p95_ms = 7200 > 5000"),
    ("control plane failing", {"reconcile_failures": 2.0}, "Control-plane delay", "reconcile_failures = 2 > 0"),
    ("flood", {"request_rate_ratio": 5.5, "rejected_ratio": 0.4}, "Input flood", "request_rate_ratio = 5.5 >= 3"),
    ("flood beats a weak canary hint", {"request_rate_ratio": 3.0, "canary_involved": True}, "Input flood", "request_rate_ratio = 3 >= 3"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("signals", "cause", "evidence"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_seeded_graph_points_at_the_cause(signals: dict, cause: str, evidence: str) -> None:
    hints = rank_hints(signals)
    assert hints[0].cause == cause
    assert evidence in hints[0].evidence
    assert hints[0].fix
    assert [h.score for h in hints] == sorted((h.score for h in hints), reverse=True)


@pytest.mark.parametrize(
    "signals",
    [
        {},
        {"kv_usage": 0.5, "preemptions": 0.0, "canary_involved": False, "reconcile_p95_ms": 100.0},
    ],
    ids=["nothing measured", "all healthy"],
)
def test_no_symptom_no_hint(signals: dict) -> None:
    assert rank_hints(signals) == []


def test_symptoms_on_missing_signals_never_match() -> None:
    assert match(Symptom("gpu_memory_growth_mb_per_min", "gt", 0), {}) is None
    assert all(h.cause != "GPU memory leak" for h in rank_hints({"kv_usage": 0.99}))


def test_more_evidence_scores_higher() -> None:
    one = rank_hints({"kv_usage": 0.99})[0]
    three = rank_hints({"kv_usage": 0.99, "preemptions": 4.0, "evictions": 9.0})[0]
    assert three.cause == one.cause == "KV cache exhausted"
    assert three.score > one.score and len(three.evidence) == 3


# (op, threshold, value, holds)
OPS = [
    ("gt", 1, 2, True), ("gt", 2, 2, False),
    ("gte", 2, 2, True), ("gte", 2, 1.99, False),
    ("lt", 1, 0.5, True), ("lt", 1, 1, False),
    ("lte", 1, 1, True), ("lte", 1, 1.01, False),
    ("eq", 0.3, 0.1 + 0.2, True), ("eq", 1, 2, False),
    ("true", None, True, True), ("true", None, False, False), ("true", None, 2.0, True),
    ("gt", None, 5, False),  # a comparison without a threshold never holds
    ("gt", 0, float("nan"), False),
]  # fmt: skip


@pytest.mark.parametrize(("op", "threshold", "value", "holds"), OPS)
def test_operators(op: str, threshold: float | None, value: float, holds: bool) -> None:
    assert (match(Symptom("x", op, threshold), {"x": value}) is not None) is holds


def test_tenant_rules_join_the_graph() -> None:
    rules = [
        Rule("kv_usage", "gte", 0.8, "kv cache EXHAUSTED", "ask for a bigger pool", 2.0),
        Rule("rejected_ratio", "gt", 0.05, "Client bug", "tell the client team", 5.0),
    ]
    causes = {c.name: c for c in graph(rules)}
    assert len(causes) == len(SEEDED) + 1  # the first rule joined the seeded node
    kv = causes["KV cache exhausted"]
    assert len(kv.symptoms) == 5 and "ask for a bigger pool" in kv.fix
    hints = rank_hints({"kv_usage": 0.85, "rejected_ratio": 0.1}, rules)
    assert [h.cause for h in hints] == ["Client bug", "KV cache exhausted"]
    assert hints[0].evidence == ["rejected_ratio = 0.1 > 0.05"] and hints[0].score == 5.0
    assert hints[1].evidence == ["kv_usage = 0.85 >= 0.8"] and hints[1].score == 2.0


def test_every_seeded_symptom_names_a_signal() -> None:
    for cause in SEEDED:
        for symptom in cause.symptoms:
            assert symptom.signal in SIGNAL_NAMES, (cause.name, symptom.signal)
