"""`kv_pollution_probe`: a synthetic tenant replays the tenant's fresh prompts; 0 hits allowed."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from typing import Any

from incidents.drills.faults.base import (
    PROBE_BODY,
    REPLAY_MARGIN_S,
    REPLAY_STEP_S,
    REQUEST_TIMEOUT_S,
    ActiveFault,
    completions_url,
    fault_state,
    fresh_prompt,
    remaining_s,
    replica_snapshots,
    require_whole,
    store_fault_state,
)
from incidents.drills.models import ChaosDrill, DrillRun
from incidents.drills.replay import filler as replay_filler
from portal.exceptions import ValidationFailed

logger = logging.getLogger(__name__)


def drill_probe_key(run_id: int) -> str:
    """The probe identity's inference key, derived (never stored): only its hash travels."""
    from portal.secrets import probe_secret  # stays valid through a KV secret rotation

    secret = probe_secret()
    digest = hmac.new(secret, f"drill-probe:{run_id}".encode(), hashlib.sha256).hexdigest()
    return f"ik_drill_{digest[:40]}"


class KvPollutionProbe(ActiveFault):
    def check(self, drill: ChaosDrill) -> None:
        require_whole(drill, "replays_per_step", "prompt_chars")
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
        return None

    def injected(self, run: DrillRun, now: float) -> None:
        # The tenant's cumulative hits before the first replay: later ones are the drill's.
        tenant = str(run.tenant_id)
        base = {
            str(r.get("replica")): int(
                ((r.get("kv") or {}).get("tenants") or {}).get(tenant, {}).get("prefix_hits", 0)
            )
            for r in replica_snapshots(run.deployment, "stable")
        }
        store_fault_state(
            run,
            {
                "own_base": base,
                "replicas": {},
                "replays_sent": 0,
                "replays_ok": 0,
                "replays_refused": {},
                "tenant_requests": 0,
            },
        )

    def _read(self, run: DrillRun, state: dict[str, Any]) -> None:
        """Merge the replicas' counters: cumulative, so a value only ever grows (a replica
        that dropped the identity after the revert must not erase what it reported)."""
        tenant, identity = str(run.tenant_id), f"drill-probe:{run.pk}"
        replicas = dict(state.get("replicas") or {})
        base = state.get("own_base") or {}
        for snapshot in replica_snapshots(run.deployment, "stable"):
            name = str(snapshot.get("replica"))
            tenants = (snapshot.get("kv") or {}).get("tenants") or {}
            probe, own = tenants.get(identity) or {}, tenants.get(tenant) or {}
            seen = replicas.get(name) or {}
            replicas[name] = {
                "cross_tenant_hits": max(
                    int(seen.get("cross_tenant_hits", 0)), int(probe.get("prefix_hits", 0))
                ),
                "replay_queries": max(
                    int(seen.get("replay_queries", 0)), int(probe.get("prefix_queries", 0))
                ),
                "own_repeat_hits": max(
                    int(seen.get("own_repeat_hits", 0)),
                    int(own.get("prefix_hits", 0)) - int(base.get(name, 0)),
                ),
            }
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

        from serving.deployments.keys import probe_key

        params = run.snapshot["parameters"]
        url = completions_url(run.deployment)
        tenant_key, identity_key = probe_key(run.deployment_id), drill_probe_key(run.pk)
        refused = dict(state.get("replays_refused") or {})
        filler = replay_filler(run, state)  # the tenant's own prompts, if it opted in
        deadline = time.monotonic() + REPLAY_STEP_S
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as http:
            for _ in range(int(params["replays_per_step"])):
                if time.monotonic() > deadline:  # a slow data plane: the next step goes on
                    break
                body = {**PROBE_BODY, "prompt": fresh_prompt(int(params["prompt_chars"]), filler)}
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

        state = fault_state(run)
        self._read(run, state)
        if remaining_s(run, now) > REPLAY_MARGIN_S:
            try:
                self._replay(run, state)
            except httpx.HTTPError as exc:
                state["transport_errors"] = int(state.get("transport_errors", 0)) + 1
                state["last_error"] = str(exc)[:200]
        store_fault_state(run, state)
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
        state = fault_state(run)
        self._read(run, state)
        store_fault_state(run, state)

    def detect(self, run: DrillRun) -> str | None:
        """The probe is a detector that works: a cross-tenant hit, or replicas where the
        tenant's own repeats hit while the replays looked (one would have been seen)."""
        state = fault_state(run)
        broken = self._broken(run, state)
        if broken is not None:
            return broken
        checked = int(state.get("replicas_checked", 0))
        return f"{checked} replica(s) checked by the replays" if checked else None

    def failure(self, run: DrillRun) -> str | None:
        state = fault_state(run)
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
