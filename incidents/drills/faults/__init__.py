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

from incidents.drills.faults.base import ActiveFault, guarded
from incidents.drills.faults.delay import ControlPlaneDelay
from incidents.drills.faults.flood import TokenStarvation
from incidents.drills.faults.kv_probe import KvPollutionProbe, drill_probe_key
from incidents.drills.faults.reload import WeightSwapJitter
from incidents.drills.injection import PromptInjection
from incidents.drills.models import FaultKind

ACTIVE: dict[str, ActiveFault] = {
    FaultKind.KV_POLLUTION_PROBE: KvPollutionProbe(),
    FaultKind.TOKEN_STARVATION: TokenStarvation(),
    FaultKind.WEIGHT_SWAP_JITTER: WeightSwapJitter(),
    FaultKind.CONTROL_PLANE_DELAY: ControlPlaneDelay(),
    FaultKind.PROMPT_INJECTION: PromptInjection(),  # incidents.drills.injection
}
PASSIVE = ActiveFault()  # the replicas apply the fault alone


def of(fault: str) -> ActiveFault:
    return ACTIVE.get(fault, PASSIVE)


__all__ = [
    "ACTIVE",
    "PASSIVE",
    "ActiveFault",
    "ControlPlaneDelay",
    "KvPollutionProbe",
    "TokenStarvation",
    "WeightSwapJitter",
    "drill_probe_key",
    "guarded",
    "of",
]
