"""What one health tick looks at: the live deployments with their revision and the contract in
force (parsed once per worker), and the per-slot result the tick fills in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Max, QuerySet
from django.db.models.functions import Mod

from serving.deployments.models import Deployment, DeploymentRevision, DeploymentStatus
from serving.ops.models import SlaContract
from serving.ops.sli_store import BOUNDARIES, BoundaryCache
from serving.slo.evaluate import Counts, Evaluation
from serving.slo.model import Contract

# PENDING and DEPLOYING too: a new revision is on its way, the previous one still serves.
LIVE_STATUSES = (
    DeploymentStatus.RUNNING,
    DeploymentStatus.UNHEALTHY,
    DeploymentStatus.DEPLOYING,
    DeploymentStatus.PENDING,
)
PROBE_STATUSES = (DeploymentStatus.RUNNING, DeploymentStatus.UNHEALTHY)
STALE_S = 5.0  # replicas publish every second; an older value is a stopped replica's
# A replica of the slot's version silent this long without a goodbye is counted lost (a pause
# of a few seconds, a GC, a starved CPU, is not); silent FORGET_S, its value and baseline go.
LOST_AFTER_S = 10.0
FORGET_S = 60.0


@dataclass
class Target:
    deployment: Deployment
    revision: DeploymentRevision
    contract: Contract | None = None
    contract_version: int | None = None

    @property
    def app(self) -> str:
        return self.deployment.serve_app

    def version(self, group: str) -> str:
        """The label the slot's replicas publish (`<model>:<version label>`)."""
        version = (
            self.revision.canary_version if group == "canary" else self.revision.stable_version
        )
        return f"{version.model.name}:{version.label}" if version is not None else ""

    @property
    def interval_s(self) -> float:
        return check_interval_s(self.deployment, self.revision)

    @property
    def groups(self) -> list[str]:
        if self.revision.pool_id is not None:
            return []  # a shared pool's counters mix tenants: probe only
        return ["stable"] + (["canary"] if self.revision.canary_version_id else [])


def check_interval_s(deployment: Deployment, revision: DeploymentRevision | None) -> float:
    """How often the tick checks a deployment: its `health_interval_s`, and at most
    HEALTH_CANARY_INTERVAL_S while a canary is in flight (a failing canary's rollback waits
    for the tick that sees the breach; a stable-only deployment has no such race)."""
    interval = float(deployment.health_interval_s)
    if revision is not None and revision.canary_version_id is not None and revision.pool_id is None:
        return min(interval, float(settings.HEALTH_CANARY_INTERVAL_S))
    return interval


@dataclass
class SlotResult:
    delta: Counts
    cumulative: Counts
    windows: dict[int, Counts] = field(default_factory=dict)
    evaluation: Evaluation | None = None
    kv: dict[str, Any] = field(default_factory=dict)
    since: float = 0.0  # when this version started serving in the slot


def in_shard(query: QuerySet[Deployment], shard: tuple[int, int]) -> QuerySet[Deployment]:
    """The deployments of shard `(k, n)`: `pk % n == k` (all of them when n is 1)."""
    k, n = shard
    return query if n <= 1 else query.annotate(health_shard=Mod("pk", n)).filter(health_shard=k)


def health_targets(
    *, deployment_ids: list[int] | None = None, shard: tuple[int, int] = (0, 1)
) -> list[Target]:
    """Every live deployment with a revision (of one shard), and the contract in force for
    each."""
    query = (
        Deployment.objects.filter(
            deleted_at__isnull=True, current_revision__isnull=False, status__in=LIVE_STATUSES
        )
        .select_related(
            "tenant",
            "current_revision__stable_version__model",
            "current_revision__canary_version__model",
        )
        .defer(  # JSON the tick never reads: decoding it was a tenth of a 1,000-deployment tick
            "current_revision__guard",
            "current_revision__breaker",
            "current_revision__key_hashes",
            "current_revision__stable_version__config_summary",
            "current_revision__stable_version__validation_steps",
            "current_revision__canary_version__config_summary",
            "current_revision__canary_version__validation_steps",
        )
    )
    if deployment_ids is not None:
        query = query.filter(pk__in=deployment_ids)
    query = in_shard(query, shard)
    targets = {
        d.pk: Target(deployment=d, revision=d.current_revision)
        for d in query
        if d.current_revision is not None
    }
    newest = (
        SlaContract.objects.filter(deployment_id__in=list(targets))
        .values("deployment_id")
        .annotate(version=Max("version"))
        .values("version")
    )
    in_force: dict[int, tuple[int, int]] = {}  # deployment -> (version, contract row)
    for pk, deployment_id, version in SlaContract.objects.filter(
        deployment_id__in=list(targets), version__in=newest
    ).values_list("pk", "deployment_id", "version"):
        if version > in_force.get(deployment_id, (0, 0))[0]:
            in_force[deployment_id] = (version, pk)
    # Contract versions are immutable: parse each once per worker, not once per tick.
    missing = {pk for d, (v, pk) in in_force.items() if (d, v) not in _CONTRACTS}
    if missing:
        for d, v, document in SlaContract.objects.filter(pk__in=missing).values_list(
            "deployment_id", "version", "document"
        ):
            _CONTRACTS[(d, v)] = Contract.from_dict(document)
    used = {(d, v): _CONTRACTS[(d, v)] for d, (v, _) in in_force.items()}
    k, n = shard  # keep the other shards' contracts: this worker may tick them next
    for key in [key for key in _CONTRACTS if key not in used and key[0] % n == k]:
        del _CONTRACTS[key]
    _CONTRACTS.update(used)
    for deployment_id, (version, _) in in_force.items():
        targets[deployment_id].contract = used[(deployment_id, version)]
        targets[deployment_id].contract_version = version
    return list(targets.values())


_CONTRACTS: dict[tuple[int, int], Contract] = {}  # (deployment, version) -> parsed contract
# A sharded tick's long-window boundaries, per shard: a worker ticks whichever shard comes,
# and each cache keeps only the entries of its own shard's last tick.
_SHARD_BOUNDARIES: dict[tuple[int, int], BoundaryCache] = {}


def boundaries(shard: tuple[int, int]) -> BoundaryCache:
    if shard[1] <= 1:
        return BOUNDARIES
    return _SHARD_BOUNDARIES.setdefault(shard, BoundaryCache())


def clear_caches() -> None:
    """Forget what the worker keeps between ticks (parsed contracts, long-window boundaries):
    for tests, whose new databases hand out the same ids again."""
    _CONTRACTS.clear()
    BOUNDARIES.clear()
    _SHARD_BOUNDARIES.clear()
