"""`token_starvation`: a flood of long-context requests while other tenants' deployments are
probed."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

from incidents.drills.faults.base import (
    BYSTANDER_EVERY_S,
    FLOOD_STEP_S,
    MAX_BYSTANDERS,
    PROBE_BODY,
    REQUEST_TIMEOUT_S,
    ActiveFault,
    completions_url,
    fault_state,
    fresh_prompt,
    record_event,
    remaining_s,
    require_whole,
    store_fault_state,
)
from incidents.drills.models import ChaosDrill, DrillRun
from incidents.drills.replay import filler as replay_filler

logger = logging.getLogger(__name__)


def _context_positions(run: DrillRun) -> int | None:
    """The stable version's context length, from its config as the registry read it."""
    revision = run.deployment.current_revision
    version = revision.stable_version if revision is not None else None
    summary = (version.config_summary or {}) if version is not None else {}
    value = summary.get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


class TokenStarvation(ActiveFault):
    control_side = True

    def check(self, drill: ChaosDrill) -> None:
        require_whole(drill, "concurrency", "prompt_chars", "max_tokens")

    def _bystanders(self, run: DrillRun) -> list[tuple[int, str]]:
        """Other tenants' running deployments beside this one: its shared pool's other
        tenants, or (dedicated) others on the same cluster; (id, probe URL)."""
        from serving.deployments.models import Deployment, DeploymentStatus, KvMode

        revision = run.deployment.current_revision
        others = Deployment.objects.filter(
            deleted_at__isnull=True, status=DeploymentStatus.RUNNING
        ).exclude(tenant_id=run.tenant_id)
        if revision is not None and revision.kv_mode == KvMode.SHARED and revision.pool_id:
            others = others.filter(current_revision__pool_id=revision.pool_id)
        chosen = others.select_related("tenant").order_by("pk")[:MAX_BYSTANDERS]
        return [(d.pk, completions_url(d)) for d in chosen]

    def inject(self, run: DrillRun, now: float) -> str | None:
        try:
            url = completions_url(run.deployment)
            bystanders = self._bystanders(run)
        except Exception as exc:  # no cluster configured
            return f"aborted: no Serve proxy to flood: {exc}"
        shared = bool(run.deployment.current_revision and run.deployment.current_revision.pool_id)
        params = run.snapshot["parameters"]
        chars = int(params["prompt_chars"])
        context = _context_positions(run)
        if context is not None:
            # A prompt beyond the model's context is refused (a 400) and never loads anything:
            # the flood is cut to what fits (one position per character at worst).
            fits = max(16, context - int(params["max_tokens"]) - 16)
            if chars > fits:
                record_event(
                    run,
                    "prompt_clamped",
                    f"flood prompts cut from {chars} to {fits} "
                    f"characters: the model's context is {context} positions",
                    prompt_chars=fits,
                    context=context,
                )
                chars = fits
        store_fault_state(
            run,
            {
                "url": url,
                "bystander_count": len(bystanders),
                "shared_pool": shared,
                "prompt_chars": chars,
                "flood": {},
                "bystanders": {},
            },
        )
        if not bystanders:
            record_event(
                run,
                "no_bystanders",
                "no other tenant's deployment runs beside this one: "
                "only the flooding tenant's own steady state is judged",
            )
        return None

    def observe(self, run: DrillRun, now: float) -> str | None:
        from serving.deployments.keys import probe_key

        budget = min(FLOOD_STEP_S, remaining_s(run, now))
        if budget <= 0.2:
            return None
        state = fault_state(run)
        params = run.snapshot["parameters"]
        targets = [(url, probe_key(pk)) for pk, url in self._bystanders(run)]
        flood, watch = asyncio.run(
            _flood(
                url=completions_url(run.deployment),
                key=probe_key(run.deployment_id),
                concurrency=int(params["concurrency"]),
                prompt_chars=int(state.get("prompt_chars") or params["prompt_chars"]),
                max_tokens=int(params["max_tokens"]),
                seconds=budget,
                bystanders=targets,
                filler=replay_filler(run, state),  # the tenant's own prompts, if it opted in
            )
        )
        state["flood"] = _add(state.get("flood") or {}, flood)
        before = state.get("bystanders") or {}
        merged = _add(before, {k: v for k, v in watch.items() if k != "max_ms"})
        merged["max_ms"] = max(float(before.get("max_ms", 0.0)), float(watch.get("max_ms", 0.0)))
        state["bystanders"] = merged
        store_fault_state(run, state)
        return None

    def revert(self, run: DrillRun, now: float) -> str:
        flood = fault_state(run).get("flood") or {}
        return f"flood stopped after {flood.get('sent', 0)} requests"

    def effect(self, run: DrillRun, now: float) -> str | None:
        flood = fault_state(run).get("flood") or {}
        reached = int(flood.get("ok", 0)) + int(flood.get("refused_quota", 0))
        return f"{reached} flood requests reached the engine" if reached else None

    def detect(self, run: DrillRun) -> str | None:
        """Admission noticed the flood: requests refused for KV quota (429) or for a batch
        that cannot fit (413)."""
        flood = fault_state(run).get("flood") or {}
        statuses = flood.get("statuses") or {}
        refused = int(flood.get("refused_quota", 0)) + int(statuses.get("413", 0))
        return f"admission refused {refused} flood requests (429/413)" if refused else None

    def failure(self, run: DrillRun) -> str | None:
        state = fault_state(run)
        flood, watch = state.get("flood") or {}, state.get("bystanders") or {}
        if not flood.get("ok") and not flood.get("refused_quota"):
            return (
                "inconclusive: no flood request reached the engine (sent "
                f"{flood.get('sent', 0)}, statuses {flood.get('statuses') or {}})"
            )
        probes, failed = int(watch.get("probes", 0)), int(watch.get("failed", 0))
        limit = float(run.snapshot["parameters"]["bystander_max_error_rate"])
        if probes and failed / probes > limit:
            return (
                f"quotas did not protect other tenants: {failed} of {probes} probes of their "
                f"deployments failed during the flood (allowed {limit:.1%})"
            )
        return None


def _add(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Counters added up, nested `statuses` too."""
    out = dict(total)
    for key, value in more.items():
        if isinstance(value, dict):
            out[key] = _add(out.get(key) or {}, value)
        else:
            out[key] = round(out.get(key, 0) + value, 3)
    return out


async def _flood(
    *,
    url: str,
    key: str,
    concurrency: int,
    prompt_chars: int,
    max_tokens: int,
    seconds: float,
    bystanders: list[tuple[str, str]],
    filler: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`concurrency` long-context requests in flight for `seconds` (those in flight then are
    waited for), while each bystander gets a one-token probe every BYSTANDER_EVERY_S. Prompt
    lengths vary between a quarter of `prompt_chars` and all of it, as a real flood's do: the
    longest may never fit the tenant's KV quota, the shorter ones queue for it."""
    import httpx

    flood: dict[str, Any] = {
        "sent": 0,
        "ok": 0,
        "refused_quota": 0,
        "errors": 0,
        "timeouts": 0,
        "statuses": {},
    }
    watch: dict[str, Any] = {"probes": 0, "failed": 0, "total_ms": 0.0, "max_ms": 0.0}
    end = time.monotonic() + seconds
    auth = {"authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=concurrency + len(bystanders) + 2)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, trust_env=False, limits=limits) as http:

        async def flooder() -> None:
            while time.monotonic() < end:
                chars = random.randint(max(16, prompt_chars // 4), prompt_chars)  # noqa: S311
                body = {
                    "prompt": fresh_prompt(chars, filler),
                    "max_tokens": max_tokens,
                    "temperature": 0,
                }
                flood["sent"] += 1
                try:
                    answer = await http.post(url, json=body, headers=auth)
                except httpx.TimeoutException:
                    flood["timeouts"] += 1
                    continue
                except httpx.HTTPError:
                    flood["errors"] += 1
                    await asyncio.sleep(0.1)
                    continue
                code = answer.status_code
                flood["statuses"][str(code)] = flood["statuses"].get(str(code), 0) + 1
                if code == 200:
                    flood["ok"] += 1
                elif code == 429 and "kv_quota_exceeded" in answer.text:
                    flood["refused_quota"] += 1
                elif code >= 500:
                    flood["errors"] += 1

        async def probe(target: str, probe_key: str) -> None:
            started = time.perf_counter()
            try:
                answer = await http.post(
                    target,
                    json={**PROBE_BODY, "prompt": "drill bystander probe"},
                    headers={"authorization": f"Bearer {probe_key}", "x-portal-probe": "1"},
                )
                ok = answer.status_code == 200
            except httpx.HTTPError:
                ok = False
            ms = (time.perf_counter() - started) * 1000
            watch["probes"] += 1
            watch["failed"] += 0 if ok else 1
            watch["total_ms"] += ms
            watch["max_ms"] = max(watch["max_ms"], ms)

        async def watcher() -> None:
            while bystanders and time.monotonic() < end:
                await asyncio.gather(*(probe(t, k) for t, k in bystanders))
                await asyncio.sleep(BYSTANDER_EVERY_S)

        await asyncio.gather(watcher(), *(flooder() for _ in range(concurrency)))
    watch["total_ms"] = round(watch["total_ms"], 1)
    watch["max_ms"] = round(watch["max_ms"], 1)
    return flood, watch
