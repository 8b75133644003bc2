"""The fault catalogue and the validation of a drill's settings (each error names its field)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any

from incidents.drills.models import FaultKind
from incidents.drills.not_offered import check_offered
from portal.exceptions import ValidationFailed


@dataclass(frozen=True)
class Fault:
    title: str
    description: str
    # parameter -> (low, high, default) for numbers, or a tuple of allowed strings
    parameters: dict[str, Any]
    # "traffic": traffic_share is the share of requests; "replicas": replica_share the share
    # of replicas; "slot": the whole slot (no share applies); "control": the control plane.
    blast: str
    _: KW_ONLY
    # What should notice it (incidents.drills.detection.SIGNALS), in the order tried: every
    # fault must name one, or its runs could only prove survival, never detection.
    detectors: tuple[str, ...]


BLAST_RADIUS = {
    "traffic": "traffic_share",
    "replicas": "replica_share",
    "slot": "the whole slot (no share applies)",
    "control": "the control plane: every Serve API call of the portal (all reconciles)",
}


CATALOGUE: dict[str, Fault] = {
    FaultKind.ERROR_BURST: Fault(
        "Error burst",
        "A share of the slot's requests fail with a 5xx. The contract's error-rate and "
        "availability objectives should catch it; a rollback fixes it.",
        {"status": (500, 599, 503)},
        "traffic",
        detectors=("error_ratio", "contract"),
    ),
    FaultKind.LATENCY_SPIKE: Fault(
        "Latency spike",
        "Added delay (fixed, uniform with jitter, or exponential) on a share of requests. "
        "Latency objectives should catch it.",
        {
            "delay_ms": (1, 600_000, 500),
            "jitter_ms": (0, 600_000, 0),
            "distribution": ("fixed", "uniform", "exponential"),
        },
        "traffic",
        detectors=("latency_p95", "contract"),
    ),
    FaultKind.GPU_MEMORY_LEAK: Fault(
        "GPU memory leak",
        "The replicas allocate device memory at N MB/s without freeing it, up to a cap (at "
        "most half the replica's own memory share); a replica without a GPU leaks simulated "
        "device memory (counted, not allocated; labelled simulated). GPU memory or the "
        "replicas' reported memory must notice it.",
        {"mb_per_s": (1, 10_000, 50), "max_mb": (1, 1_000_000, 256)},
        "replicas",
        detectors=("gpu_memory", "replica_memory"),
    ),
    FaultKind.REPLICA_CRASH: Fault(
        "Replica crash",
        "A share of the slot's replicas exit; Ray Serve restarts them. Requests in flight on "
        "them fail; clients with retries should not notice.",
        {"after_s": (0, 3600, 0)},
        "replicas",
        detectors=("replica_restarts", "contract"),
    ),
    FaultKind.REPLICA_HANG: Fault(
        "Replica hang",
        "A share of the slot's replicas stop answering Serve's health check; Serve replaces them.",
        {},
        "replicas",
        detectors=("replica_restarts", "contract"),
    ),
    FaultKind.KV_POLLUTION_PROBE: Fault(
        "KV cache pollution probe",
        "Another tenant's identity replays the tenant's prompts and must see 0 prefix-cache "
        "hits: a synthetic drill tenant (its own server-derived salt, its key accepted only "
        "while the fault is in) replays fresh prompts the tenant just sent twice, on the "
        "stable slot of a dedicated deployment. A cross-tenant hit fails the run at once; "
        "the tenant's own repeat hits prove the probe could have seen one.",
        {"replays_per_step": (1, 10, 2), "prompt_chars": (64, 8000, 400)},
        "slot",
        detectors=("probe",),
    ),
    FaultKind.TOKEN_STARVATION: Fault(
        "Token starvation",
        "A flood of long-context requests as the tenant (concurrency in flight for the whole "
        "duration); KV block quotas, admission (429 kv_quota_exceeded) and the guard must "
        "keep it the flooding tenant's problem: other tenants' deployments beside it (its "
        "shared pool's, or its neighbours on the cluster) are probed throughout.",
        {
            "concurrency": (1, 64, 8),
            "prompt_chars": (16, 60_000, 2000),
            "max_tokens": (1, 4096, 32),
            "bystander_max_error_rate": (0, 1, 0),
        },
        "slot",
        detectors=("kv_use", "probe"),
    ),
    FaultKind.WEIGHT_SWAP_JITTER: Fault(
        "Weight swap jitter",
        "Repeated hot reloads under traffic: every interval_s a revision makes the slot's "
        "replicas reload their weights (the old ones serve until the new ones are ready), "
        "`reloads` times in all. Not one request may fail.",
        {"reloads": (1, 100, 3), "interval_s": (1, 600, 5)},
        "slot",
        detectors=("reloads",),
    ),
    FaultKind.CONTROL_PLANE_DELAY: Fault(
        "Control plane delay",
        "Every call of the portal's Serve API client (reconciles, status refreshes) waits "
        "delay_ms while the fault is in (a Redis key with the fault's TTL); the data plane "
        "must keep serving. The control plane is shared: every deployment's changes slow, "
        "so only platform staff may run it.",
        {"delay_ms": (1, 10_000, 2000)},
        "control",
        detectors=("probe",),
    ),
    FaultKind.PROMPT_INJECTION: Fault(
        "Prompt injection",
        "The project's injection corpus (instruction overrides, system-prompt extraction, "
        "role-play jailbreaks, encoded and indirect instructions) sent through the deployment "
        "under a system prompt holding a canary secret; the guard must refuse each item or the "
        "answer keep to the system prompt (no canary, no injected payload). One leak fails.",
        {"prompts_per_step": (1, 30, 10), "max_tokens": (1, 256, 48)},
        "slot",
        detectors=("probe",),
    ),
}


def catalogue() -> list[dict[str, Any]]:
    """The catalogue for pages and the API: each fault, what it does, its parameters."""
    out = []
    for kind, fault in CATALOGUE.items():
        params = {}
        for name, rule in fault.parameters.items():
            if isinstance(rule[0], str):
                params[name] = {"choices": list(rule), "default": rule[0]}
            else:
                params[name] = {"min": rule[0], "max": rule[1], "default": rule[2]}
        out.append(
            {
                "fault": str(kind),
                "title": fault.title,
                "description": fault.description,
                "parameters": params,
                "blast_radius": BLAST_RADIUS[fault.blast],
                "detectors": list(fault.detectors),
            }
        )
    return out


PROBE_SLIS = {"error_rate": "max", "availability": "min", "latency_p95_ms": "max", "rps": "min"}


def check_parameters(fault: str, raw: Any) -> dict[str, Any]:
    check_offered(fault)  # a fault the seeds name that is not offered: its reason
    if fault not in CATALOGUE:
        raise ValidationFailed(f"must be one of {', '.join(CATALOGUE)}.", field="fault")
    spec = CATALOGUE[fault].parameters
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValidationFailed("give an object of parameters.", field="parameters")
    unknown = set(raw) - set(spec)
    if unknown:
        raise ValidationFailed(
            f"unknown parameter {sorted(unknown)[0]!r} for {fault}; known: "
            f"{', '.join(spec) or 'none'}.",
            field=f"parameters.{sorted(unknown)[0]}",
        )
    out: dict[str, Any] = {}
    for name, rule in spec.items():
        value = raw.get(name)
        field = f"parameters.{name}"
        if isinstance(rule[0], str):  # a choice
            value = rule[0] if value is None else value
            if value not in rule:
                raise ValidationFailed(f"must be one of {', '.join(rule)}.", field=field)
        else:
            low, high, default = rule
            value = default if value is None else value
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationFailed("must be a number.", field=field)
            if not low <= value <= high:
                raise ValidationFailed(f"must be between {low} and {high}.", field=field)
        out[name] = value
    return out


def check_steady_state(raw: Any) -> dict[str, Any]:
    raw = raw or {}
    if not isinstance(raw, dict) or set(raw) - {"contract", "probes"}:
        raise ValidationFailed("give {contract: bool, probes: [...]}.", field="steady_state")
    probes = []
    for index, probe in enumerate(raw.get("probes") or []):
        field = f"steady_state.probes[{index}]"
        if not isinstance(probe, dict):
            raise ValidationFailed("each probe is an object.", field=field)
        sli = probe.get("sli")
        if sli not in PROBE_SLIS:
            raise ValidationFailed(f"sli: one of {', '.join(PROBE_SLIS)}.", field=f"{field}.sli")
        bound = PROBE_SLIS[sli]
        value = probe.get(bound)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValidationFailed(
                f"{sli} needs `{bound}`, a number >= 0.", field=f"{field}.{bound}"
            )
        weight = probe.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ValidationFailed("must be a number > 0.", field=f"{field}.weight")
        name = str(probe.get("name") or f"{sli} {'<=' if bound == 'max' else '>='} {value}")
        probes.append({"name": name[:80], "sli": sli, bound: value, "weight": weight})
    contract = raw.get("contract", not probes)
    if not isinstance(contract, bool):
        raise ValidationFailed("true or false.", field="steady_state.contract")
    return {"contract": contract, "probes": probes}


def check_abort(raw: Any) -> dict[str, Any]:
    raw = raw or {}
    if not isinstance(raw, dict) or set(raw) - {"burn_rate_above", "error_rate_above"}:
        raise ValidationFailed(
            "give {burn_rate_above: x, error_rate_above: y}.", field="abort_conditions"
        )
    out = {}
    for name, (low, high) in {"burn_rate_above": (0, 10_000), "error_rate_above": (0, 1)}.items():
        value = raw.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
            raise ValidationFailed(
                f"a number in ({low}, {high}].", field=f"abort_conditions.{name}"
            )
        out[name] = value
    return out


def check_schedule(raw: Any) -> str:
    schedule = " ".join(str(raw or "").split())
    if not schedule:
        return ""
    parts = schedule.split(" ")
    if len(parts) != 5:
        raise ValidationFailed(
            "a cron expression of 5 fields: minute hour day-of-month month day-of-week.",
            field="schedule",
        )
    from celery.schedules import crontab

    try:
        crontab(*parts)
    except (ValueError, TypeError) as exc:
        raise ValidationFailed(f"not a valid cron expression: {exc}", field="schedule") from exc
    return schedule
