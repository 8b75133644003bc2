"""A fleet for the benchmarks, seeded in bulk: tenants with a model of two ready versions,
N running deployments (a canary on every other one) with an SLA contract each, and their
stored SLI history (raw and minute rows, copied server-side from one template slot per group).

Imported after `env.setup()` (it imports Django models). Used by health_tick (the cost of a
tick) and pages (the cost of rendering the portal's pages over the same fleet)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connection
from django.utils import timezone

from serving.dataplane.sli import SliRecorder, SliWindow
from serving.deployments.models import Deployment, DeploymentRevision, DeploymentStatus
from serving.ops import health
from serving.ops.models import Resolution, SlaContract, SliSample
from serving.ops.sli_store import sample_row
from serving.registry.models import ArtifactSource, Model, ModelVersion, VersionStatus
from serving.slo.evaluate import Counts
from serving.slo.parse import parse_contract
from tenants import services
from tenants.models import Tenant
from tests.support.contracts import REALISTIC as CONTRACT_YAML

TICK_S = 2.0  # the deployments' health_interval_s, and how far `now` moves per tick
REPLICAS = {"stable": 2, "canary": 1}  # replicas publishing per slot
REQUESTS_PER_PUBLISH = {"stable": 15, "canary": 5}  # per replica, between two ticks
KV = {"num_blocks": 256, "free_blocks": 190, "fragmentation": 0.04}
SAMPLE_KV = {
    "blocks_total": 512,
    "blocks_used": 132,
    "preemptions": 0,
    "evictions": 0,
    "fragmentation": 0.04,
    "replicas": 2,
    "replica_restarts": 0,
}


@dataclass
class TenantSeed:
    tenant: Tenant
    owner: Any
    stable: ModelVersion
    canary: ModelVersion


@dataclass
class SlotSeed:
    deployment_id: int
    tenant_id: int
    app: str
    group: str
    version: str
    recorders: list[SliRecorder] = field(default_factory=list)


def seed_tenants(n: int) -> list[TenantSeed]:
    """Tenants through signup; a model with two ready versions each (no checkpoint needed)."""
    seeds = []
    now = timezone.now()
    for i in range(n):
        owner, tenant = services.signup(
            email=f"owner{i:02d}@health{i:02d}.example",
            password="correct-horse-battery-staple-42",
            organisation=f"Health Bench {i:02d}",
        )
        model = Model.objects.create(tenant=tenant, name="assistant", created_by=owner)
        stable, canary = (
            ModelVersion.objects.create(
                tenant=tenant,
                model=model,
                label=label,
                source=ArtifactSource.PATH,
                artifact_uri=f"file:///nonexistent/bench/{label}",
                format="safetensors",
                status=VersionStatus.READY,
                ready_at=now,
                created_by=owner,
            )
            for label in ("v1", "v2")
        )
        seeds.append(TenantSeed(tenant, owner, stable, canary))
    return seeds


def seed_deployments(n: int, tenants: list[TenantSeed]) -> list[SlotSeed]:
    """N running deployments (bulk), revision 1 each (a canary on every other one), an SLA
    contract each; returns their slots."""
    now = timezone.now()
    deployments = Deployment.objects.bulk_create(
        [
            Deployment(
                tenant=tenants[i % len(tenants)].tenant,
                name=f"chat-{i:05d}",
                status=DeploymentStatus.RUNNING,
                status_at=now,
                created_by=tenants[i % len(tenants)].owner,
                health_interval_s=TICK_S,
            )
            for i in range(n)
        ],
        batch_size=1000,
    )
    revisions = DeploymentRevision.objects.bulk_create(
        [
            DeploymentRevision(
                tenant_id=d.tenant_id,
                deployment=d,
                number=1,
                reason="bench",
                stable_version=tenants[i % len(tenants)].stable,
                canary_version=tenants[i % len(tenants)].canary if i % 2 == 0 else None,
                canary_percent=10 if i % 2 == 0 else 0,
                num_replicas=REPLICAS["stable"],
                created_by=tenants[i % len(tenants)].owner,
                applied_at=now - timedelta(hours=2),
                converged_at=now - timedelta(hours=2),
                serve_status="RUNNING",
            )
            for i, d in enumerate(deployments)
        ],
        batch_size=1000,
    )
    for d, revision in zip(deployments, revisions, strict=True):
        # last good == current: _mark_good has nothing to write (steady state).
        d.current_revision = revision
        d.last_good_revision = revision
    Deployment.objects.bulk_update(
        deployments, ["current_revision", "last_good_revision"], batch_size=1000
    )
    document = parse_contract(CONTRACT_YAML).to_dict()
    SlaContract.objects.bulk_create(
        [
            SlaContract(
                tenant_id=d.tenant_id,
                deployment=d,
                version=1,
                name="bench-sla",
                source=CONTRACT_YAML,
                document=document,
                created_by=tenants[i % len(tenants)].owner,
            )
            for i, d in enumerate(deployments)
        ],
        batch_size=1000,
    )
    # The slots as the tick sees them, with the version label its replicas publish.
    slots = []
    for target in health.health_targets():
        for group in target.groups:
            version = slot_version(target, group)
            slot = SlotSeed(
                target.deployment.pk, target.deployment.tenant_id, target.app, group, version
            )
            slot.recorders = [
                SliRecorder(target.app, group, version, f"{target.app}#{group}#r{k}")
                for k in range(REPLICAS[group])
            ]
            slots.append(slot)
    assert len(slots) == n + (n + 1) // 2, f"{len(slots)} slots for {n} deployments"
    return slots


def slot_version(target: health.Target, group: str) -> str:
    """The version label of a slot: what its replicas publish and its stored rows carry."""
    return target.version(group)


def serve_traffic(window: SliWindow, requests: int, offset: int = 0) -> None:
    """Deterministic traffic: no errors, 1 request in 40 over 500 ms (p95 objective met)."""
    for i in range(offset, offset + requests):
        slow = i % 40 == 39
        latency = 0.6 if slow else 0.02 + 0.01 * (i % 40)
        window.record(
            latency_s=latency,
            ok=True,
            ttft_s=latency / 4,
            itl_s=[0.008, 0.011, 0.009, 0.012],
            tokens_in=48 + i % 16,
            tokens_out=5,
        )


def kv_of(slot: SlotSeed) -> dict[str, Any]:
    return {**KV, "tenants": {str(slot.tenant_id): {"preemptions": 0, "evictions": 1}}}


def times(unit: Counts, k: int) -> Counts:
    """`unit` counted k times (k ticks' worth of traffic)."""
    return Counts(
        requests=unit.requests * k,
        errors=unit.errors * k,
        rejected=unit.rejected * k,
        tokens_in=unit.tokens_in * k,
        tokens_out=unit.tokens_out * k,
        latency=[v * k for v in unit.latency],
        ttft=[v * k for v in unit.ttft],
        itl=[v * k for v in unit.itl],
        seconds=unit.seconds * k,
    )


def unit_of(group: str) -> Counts:
    """One tick's traffic of a slot (all its replicas), as stored history counts it."""
    window = SliWindow()
    serve_traffic(window, REQUESTS_PER_PUBLISH[group] * REPLICAS[group])
    counts = Counts.from_dict(window.as_dict())
    counts.seconds = TICK_S
    return counts


@dataclass
class History:
    base: float  # the end of the newest stored row; ticks start after it
    t0: float  # where the cumulative series starts (zero)
    raw_dense: int
    raw_sparse: int
    minutes: int
    minute_step: int

    def cumulative(self, unit: Counts, end: float) -> Counts:
        return times(unit, int((end - self.t0) // TICK_S))

    def rows(self, unit: Counts) -> Iterator[tuple[int, float, float, Counts, Counts]]:
        """(resolution, start, end, delta, cumulative) of one slot's stored history."""
        base = self.base
        ends = [base - TICK_S * k for k in range(self.raw_dense)]  # every tick, newest first
        last_dense = ends[-1]
        ends += [last_dense - 60 * k for k in range(1, self.raw_sparse + 1)]  # a row a minute
        for end in ends:
            yield Resolution.RAW, end - TICK_S, end, unit, self.cumulative(unit, end)
        minute_unit = times(unit, int(60 // TICK_S))
        newest_minute = base - base % 60
        for k in range(0, self.minutes, self.minute_step):
            end = newest_minute - 60 * k
            yield Resolution.MINUTE, end - 60, end, minute_unit, self.cumulative(unit, end)


def seed_history(slots: list[SlotSeed], history: History) -> int:
    """Stored SLI rows for every slot: one template slot per group through `sample_row` and
    bulk_create, copied server-side to every other slot of that group (INSERT ... SELECT)."""
    templates: dict[str, SlotSeed] = {}
    for slot in slots:
        templates.setdefault(slot.group, slot)
    for group, template in templates.items():
        unit = unit_of(group)
        probe = (True, 11.5) if group == "stable" else (None, None)
        rows = [
            sample_row(
                tenant_id=template.tenant_id,
                slot=(template.deployment_id, group),
                version=template.version,
                resolution=resolution,
                start=start,
                end=end,
                delta=delta,
                cumulative=cumulative,
                probe=probe if resolution == Resolution.RAW else (None, None),
                kv=SAMPLE_KV,
            )
            for resolution, start, end, delta, cumulative in history.rows(unit)
        ]
        SliSample.objects.bulk_create(rows, batch_size=2000)

    columns = [f.column for f in SliSample._meta.concrete_fields if not f.primary_key]
    from_slot = {"tenant_id": "s.ten", "deployment_id": "s.dep", "version": "s.ver"}
    quote = connection.ops.quote_name
    select = ", ".join(from_slot.get(c, f"t.{quote(c)}") for c in columns)
    table, names = quote(SliSample._meta.db_table), ", ".join(map(quote, columns))
    # Column names come from the model; every value is a parameter.
    join = "CROSS JOIN unnest(%s::bigint[], %s::bigint[], %s::text[]) AS s(dep, ten, ver)"
    where = 'WHERE t.deployment_id = %s AND t."group" = %s'
    statement = f"INSERT INTO {table} ({names}) SELECT {select} FROM {table} t {join} {where}"  # noqa: S608
    for group, template in templates.items():
        others = [s for s in slots if s.group == group and s is not template]
        for start in range(0, len(others), 200):
            chunk = others[start : start + 200]
            with connection.cursor() as cursor:
                cursor.execute(
                    statement,
                    [
                        [s.deployment_id for s in chunk],
                        [s.tenant_id for s in chunk],
                        [s.version for s in chunk],
                        template.deployment_id,
                        group,
                    ],
                )
    with connection.cursor() as cursor:  # steady state: no autovacuum while timing
        cursor.execute(f"VACUUM ANALYZE {SliSample._meta.db_table}")
        cursor.execute(f"ANALYZE {Deployment._meta.db_table}")
        cursor.execute(f"ANALYZE {SlaContract._meta.db_table}")
    checkpoint()
    return SliSample.objects.count()


def checkpoint() -> None:
    """Flush the seeding's dirty pages now rather than during the timed ticks (needs a
    superuser or pg_checkpoint; skipped without)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("CHECKPOINT")
    except DatabaseError as exc:
        print(f"  (no CHECKPOINT: {exc})")
