"""The golden-prompt probe behind the `output_consistency` SLI.

Each slot's version recorded greedy answers to a few golden prompts at validation
(serving.registry.golden). The probe replays them through the real router with the
deployment's probe key, pinned to the slot (`x-ab-group`): once each alone, then all at once
among filler requests, so they share batches with other sequences. The score is the fraction of
replies equal to the recorded answers; a version whose answers drift under batching, after a
bad reload or from a polluted KV cache scores below 1. It is written per slot to the Redis hash
`consistency_key()` (field `<deployment>:<group>`), which the health tick reads.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from serving.ops.health.state import consistency_field, consistency_key, health_redis
from serving.ops.health.targets import PROBE_STATUSES, Target, health_targets
from serving.registry.models import ModelVersion

SLI = "output_consistency"
# Requests sent beside the golden prompts in the mixed batch: other prompts, longer answers,
# so the golden sequences are decoded in batches of different shapes than when alone.
FILLER_PROMPTS: tuple[str, ...] = (
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
    "Tenants must never see each other's prompts",
    "def main():\n    return",
    "The lazy dog sleeps while the",
)
FILLER_MAX_TOKENS = 16
DEFAULT_MAX_DEPLOYMENTS = 20  # per run: the probe costs the tenant's capacity, so it is bounded
DEFAULT_TIMEOUT_S = 10.0  # per request
RUN_BUDGET_S = 80.0  # per run (the task's limit is 120 s): slots left over go first next run
SLOT_BUDGET_S = 20.0  # per slot: a slow deployment cannot take a run's time from the others
DETAIL_CHARS = 400


@dataclass(frozen=True)
class SlotProbe:
    deployment_id: int
    group: str
    url: str
    key: str
    golden: Mapping[str, Any]
    version: str  # the slot's version label (Target.version): a score is that version's only


def _names_consistency(target: Target) -> bool:
    contract = target.contract
    return contract is not None and any(o.sli == SLI for o in contract.objectives)


def _slot_version(target: Target, group: str) -> ModelVersion | None:
    revision = target.revision
    return revision.canary_version if group == "canary" else revision.stable_version


def slot_probes(
    serve_url: str, *, deployment_ids: list[int] | None = None, limit: int | None = None
) -> list[SlotProbe]:
    """The slots to probe: those of `deployment_ids`, or else of every serving deployment whose
    contract names `output_consistency`, round-robin over the tenants (each tenant's least
    recently probed first, the tenant whose deployment waited longest first), at most `limit`
    deployments (CONSISTENCY_PROBE_MAX_DEPLOYMENTS): a tenant with many deployments gets one
    turn per round like any other. A slot whose version recorded no golden answers
    (validated for vLLM only) is skipped."""
    from serving.deployments.keys import probe_key

    targets = [
        t
        for t in health_targets(deployment_ids=deployment_ids)
        if t.deployment.status in PROBE_STATUSES
        and (deployment_ids is not None or _names_consistency(t))
    ]
    limit = limit or int(
        getattr(settings, "CONSISTENCY_PROBE_MAX_DEPLOYMENTS", DEFAULT_MAX_DEPLOYMENTS)
    )
    last = _last_probed([t.deployment.pk for t in targets])
    slots: list[SlotProbe] = []
    for target in fair_order(targets, last)[:limit]:
        dep = target.deployment
        url = f"{serve_url.rstrip('/')}/{dep.tenant.slug}/{dep.name}/v1/completions"
        groups = ["stable"] + (["canary"] if target.revision.canary_version_id else [])
        for group in groups:
            version = _slot_version(target, group)
            golden = (version.golden or {}) if version is not None else {}
            if golden.get("prompts"):
                key = probe_key(dep.pk)
                slots.append(SlotProbe(dep.pk, group, url, key, golden, target.version(group)))
    return slots


def fair_order(targets: list[Target], last: Mapping[int, float]) -> list[Target]:
    """One deployment per tenant per round, each tenant's least recently probed first."""
    queues: dict[int, list[Target]] = {}
    for target in sorted(targets, key=lambda t: (last.get(t.deployment.pk, 0.0), t.deployment.pk)):
        queues.setdefault(target.deployment.tenant_id, []).append(target)
    rounds = list(queues.values())  # in the order of each tenant's most overdue deployment
    order: list[Target] = []
    while rounds:
        order.extend(queue.pop(0) for queue in rounds)
        rounds = [queue for queue in rounds if queue]
    return order


def _last_probed(deployment_ids: list[int]) -> dict[int, float]:
    if not deployment_ids:
        return {}
    r = health_redis()
    try:
        fields = [consistency_field(d, "stable") for d in deployment_ids]
        raw = r.hmget(consistency_key(), fields)
    finally:
        r.close()
    return {d: float(json.loads(v)["at"]) for d, v in zip(deployment_ids, raw, strict=True) if v}


async def _ask(session: Any, slot: SlotProbe, prompt: str, max_tokens: int) -> tuple[str, str]:
    """(text, problem): the reply's text, or why there is none to compare."""
    import aiohttp

    headers = {
        "authorization": f"Bearer {slot.key}",
        "x-portal-probe": "consistency",
        "x-ab-group": slot.group,
    }
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    try:
        async with session.post(slot.url, json=body, headers=headers) as response:
            data = await response.json(content_type=None)
            if response.status != 200:
                return "", f"HTTP {response.status}"
            answered = response.headers.get("x-ab-group", "")
            if answered != slot.group:
                return "", f"answered by the {answered or 'unknown'} slot"
            return str(data["choices"][0]["text"]), ""
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError) as exc:
        return "", f"no answer ({type(exc).__name__})"


async def _replay(session: Any, slot: SlotProbe) -> dict[str, Any]:
    prompts = list(slot.golden["prompts"])
    max_tokens = int(slot.golden.get("max_tokens") or 8)
    alone = [await _ask(session, slot, p["prompt"], max_tokens) for p in prompts]
    batch = await asyncio.gather(
        *(_ask(session, slot, p["prompt"], max_tokens) for p in prompts),
        *(_ask(session, slot, f, FILLER_MAX_TOKENS) for f in FILLER_PROMPTS),
    )
    mixed = list(batch[: len(prompts)])
    matched, problems = 0, []
    for mode, replies in (("alone", alone), ("batched", mixed)):
        for golden, (text, problem) in zip(prompts, replies, strict=True):
            if not problem and text == golden["answer"]:
                matched += 1
            elif len(problems) < 3:
                got = problem or f"got {text!r}, recorded {golden['answer']!r}"
                problems.append(f"{mode} {golden['prompt'][:30]!r}: {got}")
    total = 2 * len(prompts)
    detail = f"{matched}/{total} replies equal the recorded answers"
    if problems:
        detail += "; " + "; ".join(problems)
    return {
        "score": round(matched / total, 6),
        "at": time.time(),
        "detail": detail[:DETAIL_CHARS],
        "version": slot.version,
    }


async def _replay_all(
    slots: list[SlotProbe],
    timeout_s: float,
    budget_s: float,
    store: Callable[[SlotProbe, dict[str, Any]], None],
) -> list[dict[str, Any]]:
    import aiohttp

    deadline = time.monotonic() + budget_s
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    results: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=timeout) as session:
        # One slot after another: two slots' batches in one engine would blur which one drifts.
        for slot in slots:
            if time.monotonic() > deadline:
                break
            budget = asyncio.timeout(SLOT_BUDGET_S)
            try:
                async with budget:
                    result = await _replay(session, slot)
            except TimeoutError:  # over its budget: counted as probed, the next run moves on
                if not budget.expired():
                    raise
                result = {
                    "score": 0.0,
                    "at": time.time(),
                    "detail": f"no complete reply within the slot's {SLOT_BUDGET_S:g} s budget",
                    "version": slot.version,
                }
            # Stored at once: a run cut off by the task's time limit keeps what it measured,
            # so the next run starts after those slots instead of replaying them for ever.
            store(slot, result)
            results.append(result)
    return results


def consistency_probe(
    *,
    serve_url: str,
    deployment_ids: list[int] | None = None,
    limit: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[tuple[int, str], dict[str, Any]]:
    """Replay the golden prompts of each due slot (see `slot_probes`) and store each slot's
    score for the health tick; returns {(deployment id, group): {score, at, detail}}."""
    slots = slot_probes(serve_url, deployment_ids=deployment_ids, limit=limit)
    if not slots:
        return {}
    r = health_redis()

    def store(slot: SlotProbe, result: dict[str, Any]) -> None:
        field = consistency_field(slot.deployment_id, slot.group)
        r.hset(consistency_key(), field, json.dumps(result))

    try:
        results = asyncio.run(_replay_all(slots, timeout_s, RUN_BUDGET_S, store))
    finally:
        r.close()
    return {(s.deployment_id, s.group): found for s, found in zip(slots, results, strict=False)}


def consistency_scores(deployment_id: int) -> dict[str, dict[str, Any]]:
    """The last stored score of each slot of one deployment (group -> {score, at, detail})."""
    r = health_redis()
    try:
        raw = r.hmget(consistency_key(), [consistency_field(deployment_id, g) for g in GROUPS])
    finally:
        r.close()
    return {g: json.loads(v) for g, v in zip(GROUPS, raw, strict=True) if v}


GROUPS = ("stable", "canary")
