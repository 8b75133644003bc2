"""A drill's replay of the tenant's own recent prompts instead of synthetic filler (opt-in: the
drill's `replay_prompts`). The run arms its deployment's router when it starts; the router
records the tenant's client prompts into a bounded sample in Redis, keyed by the tenant and the
run (serving.dataplane.prompt_sample); the faults that send prompts of their own build them
from it. The sample lives only as long as the run: deleted when the run ends, whatever the
verdict, and TTL'd in case no one ends it. Only counts and sizes are ever shown, never prompts.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.conf import settings
from django.db import transaction

from incidents.drills.base import RECOVERY_WAIT_S, TTL_GRACE_S, record_event
from incidents.drills.models import ChaosDrill, DrillRun, FaultKind
from portal.exceptions import ValidationFailed
from serving.dataplane.prompt_sample import (
    MAX_PROMPT_BYTES,
    MAX_PROMPTS,
    MAX_TOTAL_BYTES,
    arm_key,
    bytes_key,
    sample_key,
)

logger = logging.getLogger(__name__)
# The faults that send prompts of their own (the rest have no filler to replace).
REPLAYING_FAULTS = frozenset({FaultKind.KV_POLLUTION_PROBE, FaultKind.TOKEN_STARVATION})
KEEP_MARGIN_S = 120  # the sample outlives the longest run a little; the run deletes it first
# A run's drill replays at most these (the router also holds its own ceilings).
LIMITS = {
    "max_prompts": MAX_PROMPTS,
    "max_prompt_bytes": 2048,
    "max_total_bytes": MAX_TOTAL_BYTES // 2,
}
assert LIMITS["max_prompt_bytes"] <= MAX_PROMPT_BYTES  # noqa: S101


def check(drill: ChaosDrill) -> None:
    value = drill.replay_prompts
    if not isinstance(value, bool):
        raise ValidationFailed("true or false.", field="replay_prompts")
    if value and drill.fault not in REPLAYING_FAULTS:
        raise ValidationFailed(
            f"{drill.fault} sends no prompts of its own to replace: only "
            f"{', '.join(sorted(REPLAYING_FAULTS))} replay the tenant's prompts.",
            field="replay_prompts",
        )


def _redis() -> Any:
    from incidents.drills.faults.base import redis_client

    return redis_client()


def _keys(run: DrillRun) -> tuple[str, str, str]:
    prefix = settings.SLI_KEY_PREFIX
    return (
        arm_key(prefix, run.tenant_id, run.deployment.name),
        sample_key(prefix, run.tenant_id, run.pk),
        bytes_key(prefix, run.tenant_id, run.pk),
    )


def arm(run: DrillRun, now: float) -> None:
    """The run starts: its deployment's router records the tenant's prompts until the fault's
    window ends (duration + TTL grace); the sample is kept until the run can have ended."""
    if not run.snapshot.get("replay_prompts"):
        return
    from serving.deployments.keys import probe_key_hashes

    duration = int(run.snapshot["duration_s"])
    record_until = now + duration + TTL_GRACE_S
    keep_until = record_until + RECOVERY_WAIT_S + KEEP_MARGIN_S
    record = {
        "run": run.pk,
        "expires_at": round(record_until, 3),
        "keep_until": round(keep_until, 3),
        # The portal's own traffic (health probes, drills) is never the tenant's prompts.
        "exclude": probe_key_hashes(run.deployment_id),
        **LIMITS,
    }
    key = _keys(run)[0]
    try:
        _redis().set(key, json.dumps(record), px=int((record_until - now) * 1000))
    except Exception as exc:  # Redis away: the drill falls back to synthetic filler
        record_event(run, "replay_unavailable", f"prompt sample not armed: {exc}"[:300])
        return
    record_event(
        run,
        "replay_armed",
        f"recording a sample of the tenant's prompts (at most {LIMITS['max_prompts']} prompts, "
        f"{LIMITS['max_prompt_bytes']} bytes each, {LIMITS['max_total_bytes']} in all) until "
        "the fault's window ends; deleted when the run ends",
        **LIMITS,
    )


def discard(run: DrillRun) -> None:
    """The run ended (passed, failed or aborted): after the commit, the sample and the arm
    record (if still this run's) go."""
    if not run.snapshot.get("replay_prompts"):
        return
    keys = _keys(run)
    run_id = run.pk

    def delete() -> None:
        try:
            client = _redis()
            current = client.get(keys[0])
            if current and json.loads(current).get("run") == run_id:
                client.delete(keys[0])
            client.delete(keys[1], keys[2])
        except Exception as exc:  # its TTL removes it
            logger.warning("drill run %s: prompt sample not deleted: %s", run_id, exc)

    transaction.on_commit(delete)


def sample(run: DrillRun) -> list[str]:
    """The run's sample: only its own tenant's key is ever read."""
    if not run.snapshot.get("replay_prompts"):
        return []
    raw = _redis().lrange(_keys(run)[1], 0, LIMITS["max_prompts"] - 1)
    return [item.decode("utf-8", "ignore") for item in raw]


def filler(run: DrillRun, state: dict[str, Any]) -> str | None:
    """The text a fault's prompts are built from this step: the tenant's recorded prompts, or
    None (synthetic filler) when the drill does not replay or nothing was recorded yet. Counts
    the steps of each kind in the fault's state."""
    if not run.snapshot.get("replay_prompts"):
        return None
    try:
        prompts = sample(run)
    except Exception as exc:  # Redis away this step: filler, counted
        logger.warning("drill run %s: prompt sample unreadable: %s", run.pk, exc)
        prompts = []
    replay = dict(state.get("replay") or {})
    kind = "steps_from_sample" if prompts else "steps_from_filler"
    replay[kind] = int(replay.get(kind, 0)) + 1
    replay["sample_prompts"] = max(int(replay.get("sample_prompts", 0)), len(prompts))
    size = sum(len(p.encode()) for p in prompts)
    replay["sample_bytes"] = max(int(replay.get("sample_bytes", 0)), size)
    state["replay"] = replay
    return "\n".join(prompts) + "\n" if prompts else None
