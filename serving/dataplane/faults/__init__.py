"""The chaos-drill faults: what a version slot's `faults` user_config may hold, the
validation the portal runs before a spec becomes a revision, and the injector a replica
applies it with (per request, from background tasks, and in Serve's health check).

A group's faults (`faults.<stable|canary>` of a revision):

* `error_rate` (0..1) and `latency_ms` (whole ms, 0..600000): the original two faults;
* `error_burst`: `share` of the requests fail with a 5xx `status` (default 503);
* `latency_spike`: `share` (default 1) of the requests wait `delay_ms`: `fixed`, `uniform`
  in delay_ms ± `jitter_ms` (floored at 0; jitter is ignored by the other two), or
  `exponential` with mean delay_ms (capped at 600000 ms);
* `gpu_memory_leak`: a background task allocates `mb_per_s` up to `max_mb` (default 4096)
  on the CUDA device and frees it when the fault goes; without a GPU the device memory is
  simulated (counted, never allocated, reported as simulated);
* `replica_crash`: selected replicas exit the process `after_s` after `issued_at`;
* `replica_hang`: selected replicas fail Serve's health check, so Serve replaces them;
* `kv_pollution_probe` (stable slot only, needs `expires_at`): a drill-only synthetic tenant
  `identity` ("drill-probe:<run>") that the router accepts with the inference key whose
  SHA-256 is `key_hash` while the fault is in force, with a cache salt the replica derives
  from the slot's tenants' salts and the identity (never sent anywhere) and a block quota of
  `quota_blocks`; its cached blocks are dropped when the fault goes (see VersionCore);
* `weight_swap_jitter`: a `reload` nonce; each new value makes the replica hot-reload its
  artifact even though it did not change (old weights serve until the new ones are ready);
* `drill`, `issued_at`, `expires_at`: who set the faults and when; from `expires_at` on the
  replica ignores every fault of the group, so a drill ends even if nobody reverts it.

Other drill faults need nothing in the data plane: `token_starvation` is traffic the drill
sends, `control_plane_delay` a control-side key (serving.control.serve_api).

Each replica publishes `FaultInjector.report()` with its SLI window (`kv.faults`): the drill,
the active faults, what they did (requests failed or delayed, MB leaked and where), hung or
about to crash, when the replica started; a drill confirms from it that its fault took effect.

A replica is selected for crash/hang when it started before `issued_at` (its replacement
never is: no crash loop) and a hash of (drill, replica id) falls within `replica_share`.

The package: `spec` (the catalogue, validate_faults), `plan` (FaultPlan), `leak` (MemoryLeak),
`injector` (FaultInjector).
"""

from serving.dataplane.faults.injector import FaultInjector
from serving.dataplane.faults.leak import MemoryLeak
from serving.dataplane.faults.plan import (
    NO_FAULTS,
    ErrorBurst,
    FaultPlan,
    KvPollutionProbe,
    LatencySpike,
    MemoryLeakSpec,
    ReplicaCrash,
    ReplicaHang,
    WeightSwapJitter,
    share_point,
)
from serving.dataplane.faults.spec import (
    DISTRIBUTIONS,
    FAULT_KEYS,
    FLAT_FAULTS,
    GROUPS,
    MAX_DELAY_MS,
    MAX_TIMESTAMP,
    MB,
    META_KEYS,
    NESTED_FAULTS,
    PROBE_IDENTITY,
    FaultSpecError,
    InjectedFault,
    ReplicaHung,
    validate_faults,
    validate_group,
)

__all__ = [
    "DISTRIBUTIONS",
    "FAULT_KEYS",
    "FLAT_FAULTS",
    "GROUPS",
    "MAX_DELAY_MS",
    "MAX_TIMESTAMP",
    "MB",
    "META_KEYS",
    "NESTED_FAULTS",
    "NO_FAULTS",
    "PROBE_IDENTITY",
    "ErrorBurst",
    "FaultInjector",
    "FaultPlan",
    "FaultSpecError",
    "InjectedFault",
    "KvPollutionProbe",
    "LatencySpike",
    "MemoryLeak",
    "MemoryLeakSpec",
    "ReplicaCrash",
    "ReplicaHang",
    "ReplicaHung",
    "WeightSwapJitter",
    "share_point",
    "validate_faults",
    "validate_group",
]
