"""The desired state that serving.control.compile turns into a Ray Serve config: one spec per
portal deployment (`DeploymentSpec`, its version slots as `SlotSpec`), per shared KV pool
(`PoolSpec`, each tenant's share as `PoolTenant`) and for the GPU samplers (`GpuNodesSpec`); and
the one rule for a pool tenant's fair share (`fair_share()`, `pool_max_ongoing()`), which
reconcile compiles and the portal shows. Plain frozen dataclasses, Django-free; every name comes
from `serving.control.names`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serving.control import names


@dataclass(frozen=True)
class GpuNodesSpec:
    """GPU_AGENT_MODE=ray: how many nodes get a sampler, and its settings."""

    nodes: int
    hz: float = 5.0
    simulate: bool = False


@dataclass(frozen=True)
class SlotSpec:
    """One version slot (stable or canary) of a deployment."""

    version: str
    artifact: str
    fingerprint: str
    arch_key: str
    # serving.engine.choice: {"name": "builtin"} or vLLM with its knobs
    engine: dict[str, Any] = field(default_factory=lambda: {"name": "builtin"})
    # Where replicas fetch the files from (serving.dataplane.fetch); None: `artifact` in place.
    source: dict[str, Any] | None = None

    @property
    def is_vllm(self) -> bool:
        return self.engine.get("name") == "vllm"


@dataclass(frozen=True)
class FairShare:
    """What one tenant of a shared pool may hold in each pool replica."""

    quota_blocks: int  # KV blocks (cached ones included)
    max_running: int  # sequences running at once
    request_slots: int  # the tenant's requests in the pool at once (all replicas)


def fair_share(
    *,
    plan_blocks: int,
    kv_blocks: int,
    max_num_seqs: int,
    min_tenants: int,
    max_ongoing_requests: int,
    num_replicas: int = 1,
) -> FairShare:
    """A pool tenant's share: its plan's blocks, never above the pool's size divided by the
    pool's minimum number of tenants; a `1 / min_tenants` part of the batch and of the
    pool's request slots (at least one of each). The one rule: reconcile compiles it, the
    portal shows it."""
    parts = max(1, min_tenants)
    return FairShare(
        quota_blocks=max(0, min(plan_blocks, kv_blocks // parts)),
        max_running=max(1, max_num_seqs // parts),
        request_slots=max(1, max_ongoing_requests * max(1, num_replicas) // parts),
    )


def pool_max_ongoing(max_num_seqs: int) -> int:
    """A pool replica takes twice its batch: each tenant's next requests wait in that tenant's
    own queue in the engine, ready for the next free slot."""
    return max(32, 2 * max_num_seqs)


@dataclass(frozen=True)
class PoolTenant:
    salt: str  # the tenant's cache salt, hex
    quota_blocks: int
    max_running: int
    # The tenant's KV cache lifetime (its deployment's `kv_cache`), for its own blocks only.
    kv_cache: dict[str, Any] = field(default_factory=dict, compare=False)
    gpu_memory_mb: int | None = None  # the tenant's GPU memory cap per replica (its Quota)


@dataclass(frozen=True)
class PoolSpec:
    """A platform-run shared KV pool: one model served to many tenants, each with its own
    cache salt, block quota (a tenant at its quota evicts only its own blocks) and share of
    the batch (`max_running`)."""

    name: str
    slot: SlotSpec
    tenants: dict[str, PoolTenant]  # tenant id -> its salt and share
    num_replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_ongoing_requests: int = 32
    kv_blocks: int = 1024
    block_size: int = 16
    max_num_seqs: int = 32

    @property
    def app_name(self) -> str:
        return names.pool_app(self.name)


@dataclass(frozen=True)
class DeploymentSpec:
    tenant_id: str
    tenant_slug: str
    name: str
    revision: int
    stable: SlotSpec
    canary: SlotSpec | None = None
    canary_percent: float = 0.0
    num_replicas: int | None = 1
    autoscaling: dict[str, Any] | None = None  # min_replicas, max_replicas, target_ongoing_requests
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_ongoing_requests: int = 16
    kv_mode: str = "dedicated"
    kv_blocks: int = 256
    block_size: int = 16
    max_num_seqs: int = 16
    quota_blocks: int | None = None
    gpu_memory_mb: int | None = None  # the tenant's GPU memory cap per replica (its Quota)
    cache_salt_hex: str = ""
    key_hashes: tuple[str, ...] = ()
    batch_key_hashes: tuple[str, ...] = ()  # of key_hashes, those of priority "batch"
    guard: dict[str, Any] = field(default_factory=dict)
    breaker: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    router_replicas: int = 1
    pool: str | None = None  # kv_mode "shared": the PoolSpec name serving this deployment
    # kv_mode "shared": the tenant's requests in the pool at once (FairShare.request_slots)
    pool_slots: int = 0
    pool_access: bool = True  # False: the platform revoked the tenant's place in the pool
    suspended: str = ""  # why the tenant is suspended ("" when active): every request is a 403
    deployment_id: int = 0  # the portal's id (reconcile marks a refused deployment by it)
    # Degraded tiers (serving.control.tier_apps): (name, slot) by entry threshold, the
    # router's policy (thresholds, dwell, pin); and the hot-reload deadline of every slot.
    tiers: tuple[tuple[str, SlotSpec], ...] = ()
    tier_policy: dict[str, Any] = field(default_factory=dict)
    reload_deadline_s: float = 60.0
    standby_precision: str = "same"  # "float16": the standby copy's (serving.dataplane.standby)
    # Sticky split by client key (serving.dataplane.sticky): sticky, client_key_header,
    # user_field and the deployment's traffic salt (hex); {}: random split, nothing tracked.
    traffic: dict[str, Any] = field(default_factory=dict)
    # KV cache lifetime (serving.deployments.kv_specs): prefix_caching, max_age_s; {}: defaults.
    kv_cache: dict[str, Any] = field(default_factory=dict)

    @property
    def app_name(self) -> str:
        return names.deployment_app(self.tenant_slug, self.name)

    def slot_app(self, group: str) -> str:
        return names.slot_app(self.tenant_slug, self.name, group)

    @property
    def route_prefix(self) -> str:
        return names.route_prefix(self.tenant_slug, self.name)


@dataclass(frozen=True)
class Placement:
    """Where Serve runs proxies, and the resources every tenant replica asks for (RayTarget)."""

    proxy_location: str = "EveryNode"
    replica_resources: dict[str, float] = field(default_factory=dict)

    def place(self, app: dict[str, Any]) -> dict[str, Any]:
        if not self.replica_resources or app["name"] == names.GPU_NODES_APP:
            return app  # the GPU samplers go to every GPU node, whatever it advertises
        deployments = []
        for deployment in app["deployments"]:
            options = dict(deployment.get("ray_actor_options") or {})
            options["resources"] = {**options.get("resources", {}), **self.replica_resources}
            deployments.append({**deployment, "ray_actor_options": options})
        return {**app, "deployments": deployments}
