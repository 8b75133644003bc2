"""What the active faults share: the hook interface (`ActiveFault`), their state in
`run.probes["fault"]`, the timeline, and the way to the Serve proxy and the replicas' counters."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings
from django.db import DatabaseError

from incidents.drills.models import ChaosDrill, DrillEvent, DrillRun
from portal.exceptions import ValidationFailed

if TYPE_CHECKING:
    from serving.deployments.models import Deployment

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
        record_event(run, "fault_error", f"{what} failed: {exc}"[:500], hook=what)
        return default


def fault_state(run: DrillRun) -> dict[str, Any]:
    return dict((run.probes or {}).get("fault") or {})


def store_fault_state(run: DrillRun, state: dict[str, Any]) -> None:
    run.probes = {**(run.probes or {}), "fault": state}


def record_event(run: DrillRun, kind: str, message: str, **data: Any) -> None:
    DrillEvent.objects.create(
        tenant_id=run.tenant_id, run=run, kind=kind, message=message, data=data
    )


def require_whole(drill: ChaosDrill, *names: str) -> None:
    for name in names:
        value = drill.parameters[name]
        if int(value) != value:
            raise ValidationFailed("must be a whole number.", field=f"parameters.{name}")


def remaining_s(run: DrillRun, now: float) -> float:
    if run.injected_at is None:
        return 0.0
    return run.injected_at.timestamp() + int(run.snapshot["duration_s"]) - now


def completions_url(deployment: Deployment) -> str:
    from serving.control.cluster import ray_target_from_env

    serve = ray_target_from_env().serve_url.rstrip("/")
    return f"{serve}/{deployment.tenant.slug}/{deployment.name}/v1/completions"


def fresh_prompt(chars: int, filler: str | None = None) -> str:
    """A fresh prompt of `chars` characters: the random nonce comes first, so no two prompts
    share even their first KV block; then `filler` (a drill replaying the tenant's recorded
    prompts, incidents.drills.replay) or the synthetic text, repeated."""
    text, body = f"{secrets.token_hex(16)} ", filler or _FILLER
    return (text + body * (chars // len(body) + 1))[:chars]


def redis_client() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)


def replica_snapshots(deployment: Deployment, group: str) -> list[dict[str, Any]]:
    """What the slot's replicas published last (serving.dataplane.sli), one per replica."""
    from serving.dataplane.sli import sli_key

    app = deployment.serve_app
    raw = redis_client().hgetall(sli_key(settings.SLI_KEY_PREFIX, app, group))
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

    def annotate(self, run: DrillRun, verdict: str) -> str:
        """The run's final verdict, with what this fault measured added where it says more."""
        return verdict

    def effect(self, run: DrillRun, now: float) -> str | None:
        """Control side only: evidence that the fault is in effect (incidents.drills.detection
        reads the replicas' reports for the others), or None."""
        return None

    def detect(self, run: DrillRun) -> str | None:
        """What the drill's own probe noticed (the `probe` signal), or None."""
        return None
