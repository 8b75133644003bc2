"""Chaos drills (active faults): the faults a run drives from its own steps rather than leaving
to the replicas alone. Each hook does one bounded, idempotent piece of work under the run's row
lock (a worker killed mid-step leaves the run to the next one, which carries on from what was
committed); what a fault measures lives in `run.probes["fault"]` and its timeline.

* `kv_pollution_probe`: a synthetic tenant ("drill-probe:<run>", key and salt derived on the
  server, accepted only while the fault's TTL runs) replays the tenant's fresh prompts on the
  stable slot; the replicas' per-tenant prefix-cache counters must show 0 hits for it while the
  tenant's own repeats hit. One cross-tenant hit fails the run at once.
* `token_starvation`: a flood of long-context requests as the tenant (bounded concurrency, a
  few seconds per step) while other tenants' deployments beside it are probed: quotas and the
  guard must keep the flood the flooding tenant's problem.
* `weight_swap_jitter`: every `interval_s` a revision with a new reload nonce: the slot's
  replicas hot-reload their weights under traffic; not one request may fail.
* `control_plane_delay`: a TTL'd Redis key makes the portal's Serve API client hold every call;
  reconciles and status refreshes slow down while the data plane keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings
from django.db import DatabaseError

from incidents.drill_models import ChaosDrill, DrillEvent, DrillRun, FaultKind
from portal.exceptions import ValidationFailed

if TYPE_CHECKING:
    from serving.deployment_models import Deployment

T = TypeVar("T")

logger = logging.getLogger(__name__)
REQUEST_TIMEOUT_S = 10.0
FLOOD_STEP_S = 3.0  # each observing step floods this long at most
REPLAY_STEP_S = 5.0  # each observing step starts replays for this long at most
REPLAY_MARGIN_S = 3.0  # no replays this close to the end: their counters must reach Redis
MAX_BYSTANDERS = 3
BYSTANDER_EVERY_S = 0.5
DELAY_MEASURE_EVERY_S = 5.0
PROBE_BODY = {"max_tokens": 1, "temperature": 0}
_FILLER = "tenants must never see each other's prompts, tokens or cache blocks. "


def guarded(run: DrillRun, what: str, call: Callable[[], T], default: T) -> T:
    """An active fault's hook. When what it talks to fails (Redis, the Serve proxy or API) the
    failure goes in the timeline and the run goes on: the fault's TTL still ends it, and a
    fault that measured nothing fails as inconclusive. Database errors are not caught: the
    step rolls back and is tried again."""
    try:
        return call()
    except DatabaseError:
        raise
    except Exception as exc:
        logger.warning("drill run %s: %s failed: %s", run.pk, what, exc)
        _event(run, "fault_error", f"{what} failed: {exc}"[:500], hook=what)
        return default


def _state(run: DrillRun) -> dict[str, Any]:
    return dict((run.probes or {}).get("fault") or {})


def _store(run: DrillRun, state: dict[str, Any]) -> None:
    run.probes = {**(run.probes or {}), "fault": state}


def _event(run: DrillRun, kind: str, message: str, **data: Any) -> None:
    DrillEvent.objects.create(
        tenant_id=run.tenant_id, run=run, kind=kind, message=message, data=data
    )


def _whole(drill: ChaosDrill, *names: str) -> None:
    for name in names:
        value = drill.parameters[name]
        if int(value) != value:
            raise ValidationFailed("must be a whole number.", field=f"parameters.{name}")


def _remaining(run: DrillRun, now: float) -> float:
    if run.injected_at is None:
        return 0.0
    return run.injected_at.timestamp() + int(run.snapshot["duration_s"]) - now


def _completions_url(deployment: Deployment) -> str:
    from serving.control.cluster import ray_target_from_env

    serve = ray_target_from_env().serve_url.rstrip("/")
    return f"{serve}/{deployment.tenant.slug}/{deployment.name}/v1/completions"


def _prompt(chars: int) -> str:
    """A fresh prompt of `chars` ASCII characters: the random nonce comes first, so no two
    prompts share even their first KV block."""
    text = f"{secrets.token_hex(16)} "
    return (text + _FILLER * (chars // len(_FILLER) + 1))[:chars]


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)


def _replica_snapshots(deployment: Deployment, group: str) -> list[dict[str, Any]]:
    """What the slot's replicas published last (serving.dataplane.sli), one per replica."""
    from serving.dataplane.sli import sli_key

    app = f"{deployment.tenant.slug}--{deployment.name}"
    raw = _redis().hgetall(sli_key(settings.SLI_KEY_PREFIX, app, group))
    return [json.loads(value) for value in raw.values()]


class ActiveFault:
    """No-op defaults: a fault overrides what it needs."""

    control_side = False  # True: no revision, the fault is the drill's traffic or a key
    lingers = False  # control side: stays in by itself until its TTL (revert may leave it)

    def check(self, drill: ChaosDrill) -> None:
        """Rules beyond the parameters' ranges (ValidationFailed names the field)."""

    def data_plane(self, run: DrillRun, params: dict[str, Any]) -> dict[str, Any]:
        """The fault's settings in the slot's `faults` (serving.dataplane.faults)."""
        return params

    def precheck(self, run: DrillRun) -> str | None:
        """Why the fault cannot go into this deployment now (the run aborts), or None."""
        return None

    def inject(self, run: DrillRun, now: float) -> str | None:
        """Control side only: put the fault in; an abort reason, or None when it is in."""
        return None

    def injected(self, run: DrillRun, now: float) -> None:
        """Just after the injection, in the same step: baselines."""

    def observe(self, run: DrillRun, now: float) -> str | None:
        """One bounded piece of work while observing; a failure seen at once, or None."""
        return None

    def revert(self, run: DrillRun, now: float) -> str:
        """Control side only: take the fault out; what happened, for the timeline."""
        return "nothing to revert"

    def wind_down(self, run: DrillRun, now: float) -> None:
        """Each step of the reverting phase, from the revert on: the last reads."""

    def failure(self, run: DrillRun) -> str | None:
        """The run's failed verdict from this fault's own measurements, or None."""
        return None


# --- kv_pollution_probe ---------------------------------------------------------------------


def drill_probe_key(run_id: int) -> str:
    """The probe identity's inference key, derived (never stored): only its hash travels."""
    secret = settings.KV_CACHE_SECRET.encode()
    digest = hmac.new(secret, f"drill-probe:{run_id}".encode(), hashlib.sha256).hexdigest()
    return f"ik_drill_{digest[:40]}"


class KvPollutionProbe(ActiveFault):
    def check(self, drill: ChaosDrill) -> None:
        _whole(drill, "replays_per_step", "prompt_chars")
        if drill.group != "stable":
            raise ValidationFailed(
                "kv_pollution_probe runs on the stable slot (the router, which takes the probe "
                "key, serves it in-process).",
                field="group",
            )

    def data_plane(self, run: DrillRun, params: dict[str, Any]) -> dict[str, Any]:
        from serving.dataplane.keys import hash_key

        revision = run.deployment.current_revision
        block = revision.block_size if revision is not None else 16
        # One replay at a time: its prompt (bytes >= tokens) and one token, plus one block.
        quota = -(-(int(params["prompt_chars"]) + 1) // block) + 1
        return {
            "identity": f"drill-probe:{run.pk}",
            "key_hash": hash_key(drill_probe_key(run.pk)),
            "quota_blocks": quota,
        }

    def precheck(self, run: DrillRun) -> str | None:
        revision = run.deployment.current_revision
        if revision is not None and revision.kv_mode == "shared":
            return (
                "aborted: kv_pollution_probe needs a dedicated deployment (a shared pool's "
                "application takes no faults)"
            )
        if not settings.REDIS_URL:
            return "aborted: kv_pollution_probe reads the replicas' KV counters from Redis"
        return None

    def injected(self, run: DrillRun, now: float) -> None:
        # The tenant's cumulative hits before the first replay: later ones are the drill's.
        tenant = str(run.tenant_id)
        base = {
            str(r.get("replica")): int(((r.get("kv") or {}).get("tenants") or {})
                                      .get(tenant, {}).get("prefix_hits", 0))
            for r in _replica_snapshots(run.deployment, "stable")
        }  # fmt: skip
        _store(run, {"own_base": base, "replicas": {}, "replays_sent": 0, "replays_ok": 0,
                     "replays_refused": {}, "tenant_requests": 0})  # fmt: skip

    def _read(self, run: DrillRun, state: dict[str, Any]) -> None:
        """Merge the replicas' counters: cumulative, so a value only ever grows (a replica
        that dropped the identity after the revert must not erase what it reported)."""
        tenant, identity = str(run.tenant_id), f"drill-probe:{run.pk}"
        replicas = dict(state.get("replicas") or {})
        base = state.get("own_base") or {}
        for snapshot in _replica_snapshots(run.deployment, "stable"):
            name = str(snapshot.get("replica"))
            tenants = (snapshot.get("kv") or {}).get("tenants") or {}
            probe, own = tenants.get(identity) or {}, tenants.get(tenant) or {}
            seen = replicas.get(name) or {}
            replicas[name] = {
                "cross_tenant_hits": max(int(seen.get("cross_tenant_hits", 0)),
                                         int(probe.get("prefix_hits", 0))),
                "replay_queries": max(int(seen.get("replay_queries", 0)),
                                      int(probe.get("prefix_queries", 0))),
                "own_repeat_hits": max(int(seen.get("own_repeat_hits", 0)),
                                       int(own.get("prefix_hits", 0)) - int(base.get(name, 0))),
            }  # fmt: skip
        state["replicas"] = replicas
        for key in ("cross_tenant_hits", "replay_queries", "own_repeat_hits"):
            state[key] = sum(r[key] for r in replicas.values())
        # A replica proves something when the tenant's repeats hit there and replays looked.
        state["replicas_checked"] = sum(
            1 for r in replicas.values() if r["own_repeat_hits"] > 0 and r["replay_queries"] > 0
        )

    def _replay(self, run: DrillRun, state: dict[str, Any]) -> None:
        """Fresh prompts: the tenant sends each twice (the repeat must hit its own blocks),
        then the probe identity sends it once (it must not find them)."""
        import httpx

        from serving.control.reconcile import probe_key

        params = run.snapshot["parameters"]
        url = _completions_url(run.deployment)
        tenant_key, identity_key = probe_key(run.deployment_id), drill_probe_key(run.pk)
        refused = dict(state.get("replays_refused") or {})
        deadline = time.monotonic() + REPLAY_STEP_S
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as http:
            for _ in range(int(params["replays_per_step"])):
                if time.monotonic() > deadline:  # a slow data plane: the next step goes on
                    break
                body = {**PROBE_BODY, "prompt": _prompt(int(params["prompt_chars"]))}
                for _ in range(2):
                    http.post(url, json=body, headers={"authorization": f"Bearer {tenant_key}"})
                    state["tenant_requests"] = int(state.get("tenant_requests", 0)) + 1
                answer = http.post(
                    url, json=body, headers={"authorization": f"Bearer {identity_key}"}
                )
                state["replays_sent"] = int(state.get("replays_sent", 0)) + 1
                if answer.status_code == 200:
                    state["replays_ok"] = int(state.get("replays_ok", 0)) + 1
                else:  # 401 until the replicas have the fault: the next step tries again
                    code = str(answer.status_code)
                    refused[code] = refused.get(code, 0) + 1
        state["replays_refused"] = refused

    def observe(self, run: DrillRun, now: float) -> str | None:
        import httpx

        state = _state(run)
        self._read(run, state)
        if _remaining(run, now) > REPLAY_MARGIN_S:
            try:
                self._replay(run, state)
            except httpx.HTTPError as exc:
                state["transport_errors"] = int(state.get("transport_errors", 0)) + 1
                state["last_error"] = str(exc)[:200]
        _store(run, state)
        return self._broken(run, state)

    def _broken(self, run: DrillRun, state: dict[str, Any]) -> str | None:
        hits = int(state.get("cross_tenant_hits", 0))
        if not hits:
            return None
        return (
            f"KV cache isolation broken: the synthetic tenant drill-probe:{run.pk} found "
            f"{hits} prompt tokens of tenant {run.tenant_id} in the prefix cache"
        )

    def wind_down(self, run: DrillRun, now: float) -> None:
        state = _state(run)
        self._read(run, state)
        _store(run, state)

    def failure(self, run: DrillRun) -> str | None:
        state = _state(run)
        broken = self._broken(run, state)
        if broken:
            return broken
        if not state.get("replay_queries"):
            errors = int(state.get("transport_errors", 0))
            why = f"; {errors} steps broke off: {state.get('last_error')}" if errors else ""
            return (
                f"inconclusive: no replay reached the KV cache ({state.get('replays_sent', 0)} "
                f"sent, refused {state.get('replays_refused') or {}}{why})"
            )
        if not state.get("replicas_checked"):
            return (
                "inconclusive: the tenant's own repeats never hit the cache of a replica the "
                "replays reached, so a cross-tenant hit could not have been seen either"
            )
        return None


# --- token_starvation -----------------------------------------------------------------------


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
        _whole(drill, "concurrency", "prompt_chars", "max_tokens")

    def _bystanders(self, run: DrillRun) -> list[tuple[int, str]]:
        """Other tenants' running deployments beside this one: its shared pool's other
        tenants, or (dedicated) others on the same cluster; (id, probe URL)."""
        from serving.deployment_models import Deployment, DeploymentStatus, KvMode

        revision = run.deployment.current_revision
        others = Deployment.objects.filter(
            deleted_at__isnull=True, status=DeploymentStatus.RUNNING
        ).exclude(tenant_id=run.tenant_id)
        if revision is not None and revision.kv_mode == KvMode.SHARED and revision.pool_id:
            others = others.filter(current_revision__pool_id=revision.pool_id)
        chosen = others.select_related("tenant").order_by("pk")[:MAX_BYSTANDERS]
        return [(d.pk, _completions_url(d)) for d in chosen]

    def inject(self, run: DrillRun, now: float) -> str | None:
        try:
            url = _completions_url(run.deployment)
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
                _event(run, "prompt_clamped", f"flood prompts cut from {chars} to {fits} "
                       f"characters: the model's context is {context} positions",
                       prompt_chars=fits, context=context)  # fmt: skip
                chars = fits
        _store(run, {"url": url, "bystander_count": len(bystanders), "shared_pool": shared,
                     "prompt_chars": chars, "flood": {}, "bystanders": {}})  # fmt: skip
        if not bystanders:
            _event(run, "no_bystanders", "no other tenant's deployment runs beside this one: "
                   "only the flooding tenant's own steady state is judged")  # fmt: skip
        return None

    def observe(self, run: DrillRun, now: float) -> str | None:
        from serving.control.reconcile import probe_key

        budget = min(FLOOD_STEP_S, _remaining(run, now))
        if budget <= 0.2:
            return None
        state = _state(run)
        params = run.snapshot["parameters"]
        targets = [(url, probe_key(pk)) for pk, url in self._bystanders(run)]
        flood, watch = asyncio.run(
            _flood(
                url=_completions_url(run.deployment), key=probe_key(run.deployment_id),
                concurrency=int(params["concurrency"]),
                prompt_chars=int(state.get("prompt_chars") or params["prompt_chars"]),
                max_tokens=int(params["max_tokens"]), seconds=budget, bystanders=targets,
            )
        )  # fmt: skip
        state["flood"] = _add(state.get("flood") or {}, flood)
        before = state.get("bystanders") or {}
        merged = _add(before, {k: v for k, v in watch.items() if k != "max_ms"})
        merged["max_ms"] = max(float(before.get("max_ms", 0.0)), float(watch.get("max_ms", 0.0)))
        state["bystanders"] = merged
        _store(run, state)
        return None

    def revert(self, run: DrillRun, now: float) -> str:
        flood = _state(run).get("flood") or {}
        return f"flood stopped after {flood.get('sent', 0)} requests"

    def failure(self, run: DrillRun) -> str | None:
        state = _state(run)
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
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`concurrency` long-context requests in flight for `seconds` (those in flight then are
    waited for), while each bystander gets a one-token probe every BYSTANDER_EVERY_S. Prompt
    lengths vary between a quarter of `prompt_chars` and all of it, as a real flood's do: the
    longest may never fit the tenant's KV quota, the shorter ones queue for it."""
    import httpx

    flood: dict[str, Any] = {"sent": 0, "ok": 0, "refused_quota": 0, "errors": 0,
                             "timeouts": 0, "statuses": {}}  # fmt: skip
    watch: dict[str, Any] = {"probes": 0, "failed": 0, "total_ms": 0.0, "max_ms": 0.0}
    end = time.monotonic() + seconds
    auth = {"authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=concurrency + len(bystanders) + 2)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, trust_env=False, limits=limits) as http:

        async def flooder() -> None:
            while time.monotonic() < end:
                chars = random.randint(max(16, prompt_chars // 4), prompt_chars)  # noqa: S311
                body = {"prompt": _prompt(chars), "max_tokens": max_tokens, "temperature": 0}
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
                    target, json={**PROBE_BODY, "prompt": "drill bystander probe"},
                    headers={"authorization": f"Bearer {probe_key}", "x-portal-probe": "1"},
                )  # fmt: skip
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


# --- weight_swap_jitter ---------------------------------------------------------------------


class WeightSwapJitter(ActiveFault):
    def check(self, drill: ChaosDrill) -> None:
        _whole(drill, "reloads")
        params = drill.parameters
        need = (int(params["reloads"]) - 1) * float(params["interval_s"])
        if need >= drill.duration_s:
            raise ValidationFailed(
                f"{params['reloads']} reloads every {params['interval_s']} s need a duration_s "
                f"over {need:g} s (it is {drill.duration_s}).",
                field="parameters.reloads",
            )

    def data_plane(self, run: DrillRun, params: dict[str, Any]) -> dict[str, Any]:
        return {"reload": 1}  # the injection is the first reload

    def injected(self, run: DrillRun, now: float) -> None:
        _store(run, {"reloads_written": 1, "last_reload_at": now, "applied": {}})
        number = run.fault_revision.number if run.fault_revision else "?"
        _event(run, "reload", f"hot reload 1/{run.snapshot['parameters']['reloads']} "
               f"(revision {number})")  # fmt: skip

    def _nonce(self, run: DrillRun) -> int | None:
        """The nonce in the current revision, while the fault there is this run's."""
        revision = run.deployment.current_revision
        group = (revision.faults or {}).get(run.snapshot["group"]) if revision else None
        if not group or group.get("drill") != str(run.pk):
            return None
        return int((group.get("weight_swap_jitter") or {}).get("reload", 0)) or None

    def _read(self, run: DrillRun, state: dict[str, Any], now: float) -> None:
        """Which reload each replica reports done (and how long it took), and the slot's
        requests and errors since the injection."""
        applied = dict(state.get("applied") or {})
        for snapshot in _replica_snapshots(run.deployment, run.snapshot["group"]):
            reload = (snapshot.get("kv") or {}).get("fault_reload") or {}
            if reload.get("drill") == str(run.pk):
                applied[str(snapshot.get("replica"))] = {
                    k: reload.get(k) for k in ("nonce", "ok", "s")
                }
        state["applied"] = applied
        state["failed_reloads"] = sorted(r for r, a in applied.items() if a.get("ok") is False)
        if run.injected_at is not None:
            window = _slot_counts(run, run.injected_at.timestamp(), now)
            state["requests"], state["errors"] = window

    def observe(self, run: DrillRun, now: float) -> str | None:
        from serving import deployments

        state = _state(run)
        self._read(run, state, now)
        nonce = self._nonce(run)
        params = run.snapshot["parameters"]
        due = now - float(state.get("last_reload_at", 0)) >= float(params["interval_s"])
        if nonce is not None and nonce < int(params["reloads"]) and due:
            group = run.snapshot["group"]
            faults = dict(run.deployment.current_revision.faults or {})  # type: ignore[union-attr]
            faults[group] = {**faults[group], "weight_swap_jitter": {"reload": nonce + 1}}
            revision = deployments.deployment_change(
                tenant=run.deployment.tenant, actor=_actor(run), deployment=run.deployment,
                changes={"faults": faults},
                reason=f"drill {run.drill.name} (run {run.pk}): hot reload {nonce + 1}/"
                f"{params['reloads']}",
                action="drill.weight_reload",
            )  # fmt: skip
            state["reloads_written"] = nonce + 1
            state["last_reload_at"] = now
            _event(run, "reload", f"hot reload {nonce + 1}/{params['reloads']} (revision "
                   f"{revision.number})", revision=revision.number)  # fmt: skip
        _store(run, state)
        return None

    def wind_down(self, run: DrillRun, now: float) -> None:
        state = _state(run)
        self._read(run, state, now)
        _store(run, state)

    def failure(self, run: DrillRun) -> str | None:
        state = _state(run)
        if state.get("failed_reloads"):
            return f"hot reload failed on replicas {', '.join(state['failed_reloads'])}"
        if state.get("errors"):
            return (
                f"{state['errors']} of {state.get('requests', 0)} requests failed while the "
                f"weights were hot-reloaded {state.get('reloads_written', 0)} times"
            )
        if not state.get("applied"):
            return "inconclusive: no replica reported a hot reload of this drill"
        return None


def _slot_counts(run: DrillRun, since: float, now: float) -> tuple[int, int]:
    """Requests and errors the health ticks stored for the slot between `since` and `now`."""
    from django.db.models import Sum

    from serving.ops_models import Resolution, SliSample
    from serving.sli_store import as_datetime

    totals = SliSample.objects.filter(
        deployment_id=run.deployment_id, group=run.snapshot["group"], resolution=Resolution.RAW,
        end__gt=as_datetime(since), start__lt=as_datetime(now),
    ).aggregate(requests=Sum("requests"), errors=Sum("errors"))  # fmt: skip
    return int(totals["requests"] or 0), int(totals["errors"] or 0)


def _actor(run: DrillRun) -> Any:
    from tenants.actors import Actor

    return Actor(system=f"drill run {run.pk}")


# --- control_plane_delay --------------------------------------------------------------------

# Compare-and-delete: a run removes its own delay only, never another run's.
_DELETE_IF_OURS = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


class ControlPlaneDelay(ActiveFault):
    control_side = True
    lingers = True

    def _value(self, run: DrillRun) -> str:
        # The same in every step: a resumed injection finds its own key and carries on.
        delay = run.snapshot["parameters"]["delay_ms"]
        return json.dumps({"run": run.pk, "delay_ms": delay}, sort_keys=True)

    def inject(self, run: DrillRun, now: float) -> str | None:
        from serving.control.serve_api import control_delay_key

        if not settings.REDIS_URL:
            return "aborted: control_plane_delay needs Redis (the delay is a key there)"
        from incidents.drills import TTL_GRACE_S

        ttl = int(run.snapshot["duration_s"]) + TTL_GRACE_S
        _store(run, {"expires_at": round(now + ttl, 3), "api_calls": [], "reconciles": [],
                     "reconcile_seen": 0})  # fmt: skip
        value, key = self._value(run), control_delay_key()
        r = _redis()
        if not r.set(key, value, nx=True, ex=ttl) and r.get(key) != value.encode():
            holder = r.get(key)
            return f"aborted: another control_plane_delay is in force ({holder!r})"
        return None

    def _measure(self, run: DrillRun, state: dict[str, Any], now: float, label: str) -> None:
        """One real Serve API call through the portal's client, timed."""
        from serving.control.cluster import ray_target_from_env
        from serving.control.serve_api import ServeApiError

        started = time.perf_counter()
        error = None
        try:
            ray_target_from_env().serve_client().applications()
        except ServeApiError as exc:
            error = str(exc)[:200]
        ms = round((time.perf_counter() - started) * 1000, 1)
        state["api_calls"] = [*(state.get("api_calls") or []), {"at": round(now, 3), "ms": ms,
                              "when": label, "error": error}][-50:]  # fmt: skip
        _event(run, "serve_api_call", f"Serve API call ({label}) took {ms:.0f} ms"
               + (f": {error}" if error else ""), ms=ms, error=error)  # fmt: skip

    def _reconciles(self, run: DrillRun, state: dict[str, Any]) -> None:
        """Reconciles that finished since the injection (the drill asks for one with each
        measurement), with their durations."""
        from serving.deployment_models import ReconcileRun

        if run.injected_at is None:
            return
        finished = ReconcileRun.objects.filter(
            started_at__gte=run.injected_at, finished_at__isnull=False,
            pk__gt=int(state.get("reconcile_seen", 0)),
        ).order_by("pk")[:20]  # fmt: skip
        for reconcile in finished:
            ms = round(float(reconcile.duration_ms or 0), 1)
            state["reconciles"] = [*(state.get("reconciles") or []),
                                   {"ms": ms, "skipped": reconcile.skipped,
                                    "ok": reconcile.ok}][-50:]  # fmt: skip
            state["reconcile_seen"] = reconcile.pk
            _event(run, "reconcile", f"reconcile took {ms:.0f} ms"
                   + (" (nothing to apply)" if reconcile.skipped else ""), ms=ms,
                   skipped=reconcile.skipped, ok=reconcile.ok)  # fmt: skip

    def observe(self, run: DrillRun, now: float) -> str | None:
        from django.db import transaction

        from serving.tasks import reconcile

        state = _state(run)
        self._reconciles(run, state)
        if now - float(state.get("measured_at", 0)) >= DELAY_MEASURE_EVERY_S:
            self._measure(run, state, now, "delayed")
            state["measured_at"] = now
            transaction.on_commit(lambda: reconcile.delay())  # slowed like any other
        _store(run, state)
        return None

    def revert(self, run: DrillRun, now: float) -> str:
        from serving.control.serve_api import control_delay_key

        removed = _redis().eval(_DELETE_IF_OURS, 1, control_delay_key(), self._value(run))
        return "delay removed" if removed else "the delay key was already gone (TTL)"

    def wind_down(self, run: DrillRun, now: float) -> None:
        state = _state(run)
        self._reconciles(run, state)
        if not state.get("measured_after"):
            self._measure(run, state, now, "after the revert")
            state["measured_after"] = True
        _store(run, state)

    def failure(self, run: DrillRun) -> str | None:
        state = _state(run)
        delay = float(run.snapshot["parameters"]["delay_ms"])
        delayed = [c for c in state.get("api_calls") or [] if c.get("when") == "delayed"]
        if not any(c["ms"] >= delay * 0.95 for c in delayed):
            return (
                f"inconclusive: no Serve API call was slowed by {delay:g} ms (measured "
                f"{[c['ms'] for c in delayed]})"
            )
        return None


ACTIVE: dict[str, ActiveFault] = {
    FaultKind.KV_POLLUTION_PROBE: KvPollutionProbe(),
    FaultKind.TOKEN_STARVATION: TokenStarvation(),
    FaultKind.WEIGHT_SWAP_JITTER: WeightSwapJitter(),
    FaultKind.CONTROL_PLANE_DELAY: ControlPlaneDelay(),
}
PASSIVE = ActiveFault()  # the replicas apply the fault alone


def of(fault: str) -> ActiveFault:
    return ACTIVE.get(fault, PASSIVE)
