"""Benchmark: the cost per deployment of one health tick (`serving.health.tick`).

Seeds N running deployments (half with a canary, so 1.5 N slots), each with an SLA contract,
its replicas' SLI snapshots in Redis (published by the data plane's own SliRecorder and
`publish`), the health tick's own Redis state, and stored SLI history (raw and minute rows)
so that every window lookup finds real rows. Then times `tick(now=..., act=True)`:

* without probes (`serve_url=None`): targets, contracts, one pipelined Redis read, the
  window-boundary lookup, evaluation, one bulk insert, one pipelined Redis write;
* with probes, against a stand-in for the Serve proxy (a small asyncio HTTP server in a
  child process that answers every POST .../v1/completions with 200);
* against a baseline in the same process: a naive per-slot loop (one ORM query for the slot's
  last row, one Redis HGETALL, one ORM insert for each slot).

The run uses its own PostgreSQL database, created and dropped through Django's test-database
machinery (``test_<name>_health`` of DATABASE_URL), its own Redis key prefix
(``portal-bench-health:*``, cleared before and after); it never touches real data. Run from
the repository root::

    python -m bench health_tick [--quick] [--sizes 100,1000] [--ticks 8] [--profile 3]

Results go to stdout and to bench/results/health_tick.json.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import env  # noqa: E402

# Own settings, Redis db (12 unless REDIS_URL is set) and key prefix portal-bench-health-tick
# (SLI snapshots, health state, cache, buckets): the run clears it.
BENCH_PREFIX = env.setup("health_tick", redis_db=12)

import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import DatabaseError, connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.harness import BenchSession  # noqa: E402
from bench.harness.processes import die_with_parent  # noqa: E402
from bench.harness.profiling import top  # noqa: E402
from bench.harness.redis import clear_prefix  # noqa: E402
from bench.harness.report import environment, print_table, results_path, write_results  # noqa: E402
from bench.harness.stats import ratio  # noqa: E402
from serving.dataplane.sli import SliRecorder, SliWindow, publish, sli_key  # noqa: E402
from serving.deployments.models import (  # noqa: E402
    Deployment,
    DeploymentRevision,
    DeploymentStatus,
)
from serving.ops import health  # noqa: E402
from serving.ops.models import Resolution, SlaContract, SliSample  # noqa: E402
from serving.ops.sli_store import (  # noqa: E402
    as_datetime,
    counts_of_totals,
    lookup_before,
    sample_row,
)
from serving.registry.models import (  # noqa: E402
    ArtifactSource,
    Model,
    ModelVersion,
    VersionStatus,
)
from serving.slo.evaluate import Counts, evaluate  # noqa: E402
from serving.slo.parse import parse_contract  # noqa: E402
from tenants import services  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tests.support.contracts import REALISTIC as CONTRACT_YAML  # noqa: E402

TARGET_MS_PER_DEPLOYMENT = 2.0
RESULTS_PATH = results_path("health_tick")
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


def clear_bench_redis() -> None:
    """Delete every key of this run's prefix (SLI snapshots, health state, cache, buckets)."""
    clear_prefix(settings.REDIS_URL, f"{BENCH_PREFIX}:*")


class CountingConnection(redis.Connection):
    """Counts what is sent to Redis: one send is one round trip (a pipeline sends once);
    the connection handshake (CLIENT SETINFO, SELECT) is counted apart."""

    counts = {"round_trips": 0, "handshake": 0, "connects": 0}
    _handshaking = False

    def on_connect_check_health(self, check_health: bool = True) -> None:
        CountingConnection.counts["connects"] += 1
        self._handshaking = True
        try:
            super().on_connect_check_health(check_health)
        finally:
            self._handshaking = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.counts["handshake" if self._handshaking else "round_trips"] += 1
        super().send_packed_command(command, check_health)

    @classmethod
    def reset(cls) -> None:
        cls.counts = dict.fromkeys(cls.counts, 0)


def counting_redis() -> redis.Redis:
    """A fresh client, as `health_redis()` makes one a tick, that counts its round trips."""
    pool = redis.ConnectionPool.from_url(settings.REDIS_URL, connection_class=CountingConnection)
    return redis.Redis(connection_pool=pool)


@contextmanager
def counting_queries() -> Iterator[list[int]]:
    """SQL statements executed (execute wrapper: cheap enough to leave on while timing)."""
    count = [0]

    def wrapper(execute: Callable[..., Any], *args: Any) -> Any:
        count[0] += 1
        return execute(*args)

    with connection.execute_wrapper(wrapper):
        yield count


def quiet_console_logging() -> None:
    """Keep the portal's logging config (records, the redaction filter, formatting: their cost
    is part of a tick) but write the console to /dev/null."""
    devnull = open(os.devnull, "w")  # noqa: SIM115 (open for the whole run)
    for handler in logging.getLogger().handlers:
        if type(handler) is logging.StreamHandler:
            handler.setStream(devnull)


# --- data ----------------------------------------------------------------------------------


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


def wipe_deployments() -> None:
    """Deployments, revisions, contracts and SLI rows of the previous size (own test DB)."""
    tables = [m._meta.db_table for m in (SliSample, SlaContract, DeploymentRevision, Deployment)]
    tenants = Tenant.objects.count()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
    assert Tenant.objects.count() == tenants, "TRUNCATE ... CASCADE reached the tenants"
    clear_bench_redis()


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


def publish_round(slots: list[SlotSeed], round_no: int) -> int:
    """Every replica serves some requests, then rolls its window and publishes it (as
    replicas do, with the data plane's own `publish`), all in one asyncio loop. The rolls come
    last and together: the tick ignores snapshots older than `health.STALE_S`."""
    for slot in slots:
        for recorder in slot.recorders:
            serve_traffic(recorder.current, REQUESTS_PER_PUBLISH[slot.group], round_no * 7)
    snapshots = [r.roll(kv=kv_of(slot)) for slot in slots for r in slot.recorders]

    async def send_all() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        limit = asyncio.Semaphore(64)

        async def one(snapshot: dict[str, Any]) -> None:
            async with limit:
                await publish(client, BENCH_PREFIX, snapshot, ttl_s=600)

        try:
            await asyncio.gather(*(one(s) for s in snapshots))
        finally:
            await client.aclose()

    asyncio.run(send_all())
    return len(snapshots)


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


def seed_state(slots: list[SlotSeed], history: History) -> None:
    """The tick's own Redis state, as a tick at `history.base` left it: the slot's cumulative
    totals (those of its newest stored row) and each replica's last seen totals."""
    units = {group: unit_of(group) for group in REPLICAS}
    states = {}
    for slot in slots:
        seen = {
            r.replica: counts_of_totals(r.last["totals"]).to_dict()
            for r in slot.recorders
            if r.last is not None
        }
        states[f"{slot.deployment_id}:{slot.group}"] = json.dumps(
            {
                "at": history.base,
                "version": slot.version,
                "since": history.t0,  # the episode began with the stored history
                "cum": history.cumulative(units[slot.group], history.base).to_dict(),
                "replicas": seen,
                "minute": {"start": history.base - history.base % 60, "counts": {}},
            },
            separators=(",", ":"),
        )
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.hset(f"{BENCH_PREFIX}:health:state", mapping=states)
    # The signal SLIs' series: 10 minutes of points per slot, as steady ticks leave it.
    with client.pipeline(transaction=False) as pipe:
        for slot in slots:
            key = f"{BENCH_PREFIX}:health:signals:{slot.deployment_id}:{slot.group}"
            for k in range(120):
                point = {"t": history.base - 600 + 5 * k, "s": 5.0, "req": 40, "p99": 180.5,
                         "ttft": 61.2, "tps": 64.0, "hit": 0.42, "qs": 0.31, "qn": 40,
                         "r": {"other": 1}, "sat": 0.25, "kv": 0.5, "bat": 0.25}  # fmt: skip
                pipe.lpush(key, json.dumps(point, separators=(",", ":")))
        pipe.execute()
    client.close()


# --- the baseline -------------------------------------------------------------------------


def naive_tick(now: float, r: redis.Redis) -> dict[str, Any]:
    """What a straightforward implementation does: the same targets and contracts, then for
    each slot its newest stored row (one ORM query), its replicas' snapshots (one HGETALL),
    the same Counts arithmetic and contract evaluation, and one ORM insert (autocommit).

    It does less than the tick (no window-boundary lookups: every window is evaluated on the
    delta; no Redis state; no rollout or rollback checks), so the ratio favours it. Its rows go
    to groups `n:stable` / `n:canary`, which the tick never reads."""
    rows = 0
    for target in health.health_targets():
        dep = target.deployment
        for group in target.groups:
            last = (
                SliSample.objects.filter(
                    deployment_id=dep.pk, group=group, resolution=Resolution.RAW
                )
                .order_by("-end")
                .only("cumulative", "end")
                .first()
            )
            published = r.hgetall(sli_key(BENCH_PREFIX, target.app, group))
            delta = Counts()
            for raw in published.values():
                delta = delta + Counts.from_dict(json.loads(raw)["window"])
            before = Counts.from_dict(last.cumulative) if last is not None else Counts()
            start = last.end.timestamp() if last is not None else now - TICK_S
            if target.contract is not None:
                evaluate(target.contract, dict.fromkeys(target.contract.window_lengths(), delta))
            sample_row(
                tenant_id=dep.tenant_id,
                slot=(dep.pk, f"n:{group}"),
                version=slot_version(target, group),
                resolution=Resolution.RAW,
                start=start,
                end=now,
                delta=delta,
                cumulative=before + delta,
                kv=SAMPLE_KV,
            ).save()
            rows += 1
    return {"rows": rows}


# --- measuring -----------------------------------------------------------------------------


@dataclass
class Sample:
    ms: float
    cpu_ms: float  # this process's CPU time (the worker's share; not PostgreSQL's or Redis')
    queries: int
    round_trips: int
    handshake: int
    report: dict[str, Any]


def timed_tick(now: float, serve_url: str | None) -> Sample:
    r = counting_redis()
    CountingConnection.reset()
    with counting_queries() as queries:
        cpu, started = time.process_time(), time.perf_counter()
        report = health.tick(now=now, redis_client=r, serve_url=serve_url, act=True)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    r.close()
    if "skipped" in report:
        raise RuntimeError(f"tick skipped: {report['skipped']}")
    counts = CountingConnection.counts
    return Sample(
        elapsed * 1000, cpu * 1000, queries[0], counts["round_trips"], counts["handshake"], report
    )


def timed_naive(now: float) -> Sample:
    r = counting_redis()
    CountingConnection.reset()
    with counting_queries() as queries:
        cpu, started = time.process_time(), time.perf_counter()
        report = naive_tick(now, r)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    r.close()
    counts = CountingConnection.counts
    return Sample(
        elapsed * 1000, cpu * 1000, queries[0], counts["round_trips"], counts["handshake"], report
    )


def check_tick(sample: Sample, n: int, n_slots: int, probes: bool) -> None:
    """Every deployment was due and measured; nothing fired (no incident work in the timing)."""
    report = sample.report
    assert report["deployments"] == n and report["due"] == n, report
    assert report["slots"] == n_slots, report
    assert report["rows"] >= n_slots, report
    assert report["probes"] == (n if probes else 0), report
    if report["firing"] or report["actions"]:
        raise RuntimeError(f"the seeded traffic breached the contract: {report}")


def verify_measured(slots: list[SlotSeed], now: float, history: History) -> dict[str, Any]:
    """The tick at `now` (one publish after the previous tick) stored exactly what the replicas
    served, continuing the stored cumulative totals, and its window lookups found stored rows."""
    served = {g: REQUESTS_PER_PUBLISH[g] * REPLICAS[g] for g in REPLICAS}
    rows = list(
        SliSample.objects.filter(
            end=as_datetime(now), resolution=Resolution.RAW, group__in=list(REPLICAS)
        ).values_list("group", "requests", "cumulative")
    )
    assert len(rows) == len(slots), f"{len(rows)} rows stored at {now} for {len(slots)} slots"
    wrong = [(g, got) for g, got, _ in rows if got != served[g]]
    assert not wrong, f"deltas not measured (stale or mismatched replicas?): {wrong[:5]}"
    stored_until = {g: history.cumulative(unit_of(g), history.base).requests for g in REPLICAS}
    behind = [g for g, _, cum in rows if cum["requests"] <= stored_until[g]]
    assert not behind, "cumulative totals do not continue the stored history"
    contract = parse_contract(CONTRACT_YAML)
    episodes = {(s.deployment_id, s.group): (s.version, history.t0) for s in slots}
    found = lookup_before(episodes, {w: now - w for w in contract.window_lengths()})
    misses = [slot for slot, windows in found.items() if not windows]
    assert not misses, f"window lookups found no stored rows for {len(misses)} slots"
    return {
        "requests_per_slot_and_tick": served,
        "windows": len(contract.window_lengths()),
        "windows_found_per_slot": round(sum(map(len, found.values())) / len(found), 2),
    }


def exactly_measured(now: float, served: dict[str, int]) -> int:
    """Slots whose row of the tick at `now` holds exactly one publish's worth of requests (a
    replica the tick dropped as stale is recounted from zero by a later tick)."""
    rows = SliSample.objects.filter(
        end=as_datetime(now), resolution=Resolution.RAW, group__in=list(served)
    ).values_list("group", "requests")
    return sum(1 for group, requests in rows if requests == served[group])


def probe_results_ok(n: int) -> int:
    """Deployments whose last probe answered 200 (read back from the tick's Redis state)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    infos = client.hvals(f"{BENCH_PREFIX}:health:deployments")
    client.close()
    ok = sum(1 for raw in infos if json.loads(raw)["probe"]["status"] == 200)
    assert len(infos) == n, f"{len(infos)} deployment infos for {n} deployments"
    return ok


def capture_sql(now: float, serve_url: str | None) -> dict[str, Any]:
    """One (untimed) tick under CaptureQueriesContext: the statements it ran."""
    with CaptureQueriesContext(connection) as ctx:
        report = health.tick(now=now, serve_url=serve_url, act=True)
    statements = [q["sql"] for q in ctx.captured_queries]
    return {
        "queries": len(statements),
        "rows": report["rows"],
        "sql": [s if len(s) < 240 else s[:200] + f" ... ({len(s)} chars)" for s in statements],
    }


def summarise(samples: list[Sample], n: int) -> dict[str, Any]:
    ms = [s.ms for s in samples]
    p50 = statistics.median(ms)
    cpu = statistics.median(s.cpu_ms for s in samples)
    return {
        "ticks": len(ms),
        "p50_ms": round(p50, 2),
        "max_ms": round(max(ms), 2),
        "min_ms": round(min(ms), 2),
        "p50_ms_per_deployment": round(p50 / n, 4),
        "max_ms_per_deployment": round(max(ms) / n, 4),
        "min_ms_per_deployment": round(min(ms) / n, 4),
        "p50_cpu_ms": round(cpu, 2),
        "p50_cpu_ms_per_deployment": round(cpu / n, 4),
        "queries": sorted({s.queries for s in samples}),
        "redis_round_trips": sorted({s.round_trips for s in samples}),
        "redis_handshake": sorted({s.handshake for s in samples}),
        "rows": sorted({s.report.get("rows", 0) for s in samples}),
        "all_ms": [round(v, 2) for v in ms],
    }


def start_probe_server() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(  # noqa: S603 (this interpreter, a fixed script)
        [sys.executable, str(REPO_ROOT / "bench" / "helpers" / "probe_server.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509 (prctl only)
    )
    assert process.stdout is not None
    port = int(process.stdout.readline().strip())
    return process, f"http://127.0.0.1:{port}"


def run_size(
    n: int, tenants: list[TenantSeed], args: argparse.Namespace, serve_url: str
) -> dict[str, Any]:
    wipe_deployments()
    print(f"\n[{n} deployments] seeding ...", flush=True)
    started = time.perf_counter()
    slots = seed_deployments(n, tenants)
    base = float(int(time.time()) // 2 * 2)  # even: every stored `end` is on the tick grid
    history = History(
        base=base,
        t0=base - base % 60 - 60 * (args.history_minutes + 1),
        raw_dense=args.raw_rows,
        raw_sparse=args.raw_sparse_minutes,
        minutes=args.history_minutes,
        minute_step=args.minute_step,
    )
    stored = seed_history(slots, history)
    publish_round(slots, 0)  # the replicas' totals the state below has already seen
    seed_state(slots, history)
    seed_s = time.perf_counter() - started
    print(f"  {len(slots)} slots, {stored:,} stored SLI rows, seeded in {seed_s:.1f}s", flush=True)

    clock = {"now": base, "round": 0}

    def next_now() -> float:
        """The time of the next health tick (every deployment is due again)."""
        clock["now"] += TICK_S
        return clock["now"]

    def naive_now() -> float:
        """Between two ticks; the naive loop has no state of its own to advance."""
        return clock["now"] + TICK_S / 2

    def settled() -> float:
        """The time of a next tick that does not cross a minute (and follows a plain tick):
        first running, untimed, a plain tick, and the one that crosses, if any."""
        publish()
        health.tick(now=next_now(), serve_url=None, act=True)
        if int((clock["now"] + TICK_S) // 60) > int(clock["now"] // 60):
            publish()
            health.tick(now=next_now(), serve_url=None, act=True)
        publish()
        return next_now()

    publish_s: list[float] = []

    def resync() -> None:
        """An untimed plain tick after a probe tick: replicas the probe tick dropped as stale
        (`health.STALE_S`, checked after the probes) are recounted here, not in a timed tick."""
        publish()
        health.tick(now=next_now(), serve_url=None, act=True)

    def publish() -> None:
        clock["round"] += 1
        started = time.perf_counter()
        publish_round(slots, clock["round"])
        publish_s.append(time.perf_counter() - started)

    # One publish before every tick (the naive loop reads what is there), so every tick
    # should store exactly one publish's worth of requests per slot.
    served = {g: REQUESTS_PER_PUBLISH[g] * REPLICAS[g] for g in REPLICAS}
    for _ in range(args.warmup):
        publish()
        check_tick(timed_tick(next_now(), None), n, len(slots), probes=False)
        timed_naive(naive_now())
        publish()
        check_tick(timed_tick(next_now(), serve_url), n, len(slots), probes=True)
    probes_ok = probe_results_ok(n)

    now = settled()
    sql_plain = capture_sql(now, None)
    measured = verify_measured(slots, now, history)
    sql_probes = capture_sql(settled(), serve_url)
    resync()

    print(f"  timing {args.ticks} rounds of tick / naive / tick with probes ...", flush=True)
    plain: list[Sample] = []
    naive: list[Sample] = []
    probed: list[Sample] = []
    exact: dict[str, list[int]] = {"tick": [], "tick_with_probes": []}
    for _ in range(args.ticks):
        gc.collect()
        publish()
        plain.append(timed_tick(next_now(), None))
        check_tick(plain[-1], n, len(slots), probes=False)
        exact["tick"].append(exactly_measured(clock["now"], served))
        naive.append(timed_naive(naive_now()))
        publish()
        probed.append(timed_tick(next_now(), serve_url))
        check_tick(probed[-1], n, len(slots), probes=True)
        exact["tick_with_probes"].append(exactly_measured(clock["now"], served))
        probes_ok = min(probes_ok, probe_results_ok(n))
        resync()
    measured["slots_measured_exactly"] = exact
    measured["publish_s_p50"] = round(statistics.median(publish_s), 2)

    profile: dict[str, Any] = {}
    if args.profile:
        for name, url in (("tick", None), ("tick_with_probes", serve_url)):
            out = args.output.parent / f"health_tick.{n}.{name}.prof"
            profile[name] = profile_ticks(args.profile, n, publish, next_now, url, out)

    result = {
        "deployments": n,
        "slots": len(slots),
        "stored_rows": stored,
        "seed_s": round(seed_s, 1),
        "tick": summarise(plain, n),
        "tick_with_probes": summarise(probed, n),
        "naive": summarise(naive, n),
        "sql": {"tick": sql_plain, "tick_with_probes": sql_probes},
        "probes_answered_200": probes_ok,
        "measured": measured,
        "profile": profile,
    }
    tick_p50, naive_p50 = result["tick"]["p50_ms"], result["naive"]["p50_ms"]
    result["ratio_tick_to_naive"] = ratio(tick_p50, naive_p50)
    result["ratio_tick_to_naive_cpu"] = ratio(
        result["tick"]["p50_cpu_ms"], result["naive"]["p50_cpu_ms"]
    )
    result["probe_cost_ms_per_deployment"] = round(
        (result["tick_with_probes"]["p50_ms"] - tick_p50) / n, 4
    )
    return result


# Where a tick's time goes: cumulative time of these functions, per tick (under cProfile).
BREAKDOWN = (
    ("serving/health.py", "tick", "tick (all)"),
    ("serving/health.py", "health_targets", "targets + contracts queries"),
    ("serving/slo/model.py", "from_dict", "  Contract/objects from_dict"),
    ("redis/client.py", "execute", "Redis pipelines (read + write)"),
    ("serving/health.py", "_evaluate", "window lookup + evaluation"),
    ("serving/sli_store.py", "lookup", "  BoundaryCache.lookup (>1 h: once a minute)"),
    ("serving/sli_store.py", "lookup_before", "    lookup_before (query + decoding)"),
    ("serving/slo/evaluate.py", "evaluate", "  evaluate()"),
    ("serving/slo/evaluate.py", "to_dict", "Evaluation.to_dict (Redis info)"),
    ("serving/sli_store.py", "sample_row", "sample_row (model instances)"),
    ("serving/sli_store.py", "insert_samples", "insert_samples (COPY)"),
    ("serving/health.py", "_kv_summary", "_kv_summary"),
    ("serving/slo/counts.py", ("__add__", "__sub__", "_combine"), "Counts + / -"),
    ("serving/slo/counts.py", "from_dict", "Counts.from_dict"),
    ("serving/slo/counts.py", "to_dict", "Counts.to_dict"),
    ("json/__init__.py", "loads", "json.loads"),
    ("json/__init__.py", "dumps", "json.dumps"),
    ("serving/health.py", "probe", "probes (HTTP, concurrent)"),
    ("logging/__init__.py", "callHandlers", "  log records written"),
    ("portal/logging.py", "filter", "    redaction filter"),
    ("serving/health.py", "_mark_good", "_mark_good"),
    ("serving/rollouts.py", "rollouts_advance", "rollouts_advance"),
    ("serving/health.py", "_resume_stuck_rollbacks", "_resume_stuck_rollbacks"),
)


def profile_ticks(
    ticks: int,
    n: int,
    publish: Callable[[], None],
    next_now: Callable[[], float],
    serve_url: str | None,
    out: Path,
) -> dict[str, Any]:
    """cProfile `ticks` ticks; print a breakdown and the top functions."""
    profiler = cProfile.Profile()
    for _ in range(ticks):
        publish()
        now = next_now()
        profiler.enable()
        health.tick(now=now, serve_url=serve_url, act=True)
        profiler.disable()
    out.parent.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(out)
    stats = pstats.Stats(profiler)
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(
        ct
        for (file, _, name), (_, _, _, ct, _) in entries.items()
        if file.endswith("serving/health.py") and name == "tick"
    )
    total = total or stats.total_tt  # type: ignore[attr-defined]  # asyncio.run can hide `tick`
    breakdown = []
    for suffix, name, label in BREAKDOWN:
        names = {name} if isinstance(name, str) else set(name)
        cum = sum(
            ct
            for (file, _, fn), (_, _, _, ct, _) in entries.items()
            if fn in names and file.endswith(suffix)
        )
        calls = sum(
            nc
            for (file, _, fn), (_, nc, _, _, _) in entries.items()
            if fn in names and file.endswith(suffix)
        )
        breakdown.append(
            {
                "what": label,
                "ms_per_tick": round(cum * 1000 / ticks, 1),
                "share": round(cum / total, 3) if total else None,
                "calls_per_tick": calls // ticks,
            }
        )
    probes = "with probes" if serve_url else "no probes"
    print(f"\n  cProfile, {ticks} ticks at {n} deployments, {probes} (overhead inflates Python):")
    for row in breakdown:
        share = f"{row['share']:.0%}" if row["share"] is not None else "-"
        print(
            f"    {row['what']:<40} {row['ms_per_tick']:>9.1f} ms/tick {share:>5}"
            f"  {row['calls_per_tick']:>8} calls"
        )
    for sort in ("tottime", "cumulative"):
        print(f"\n  --- top 25 by {sort} ---\n{top(profiler, sort)}")
    return {"file": str(out), "ticks": ticks, "breakdown": breakdown}


# --- report --------------------------------------------------------------------------------


def print_results(results: list[dict[str, Any]]) -> None:
    head = ["", *(f"N={r['deployments']}" for r in results)]
    rows: list[list[str]] = [head]

    def add(label: str, value: Callable[[dict[str, Any]], Any]) -> None:
        rows.append([label, *(str(value(r)) for r in results)])

    add("slots (stable + canary)", lambda r: r["slots"])
    add("stored SLI rows", lambda r: f"{r['stored_rows']:,}")
    add(
        "windows found / slot (lookup)",
        lambda r: f"{r['measured']['windows_found_per_slot']:g} of {r['measured']['windows']}",
    )
    add("tick p50 ms", lambda r: f"{r['tick']['p50_ms']:.1f}")
    add("tick max ms", lambda r: f"{r['tick']['max_ms']:.1f}")
    add("tick ms / deployment (p50)", lambda r: f"{r['tick']['p50_ms_per_deployment']:.3f}")
    add("tick ms / deployment (max)", lambda r: f"{r['tick']['max_ms_per_deployment']:.3f}")
    add("tick ms / deployment (min)", lambda r: f"{r['tick']['min_ms_per_deployment']:.3f}")
    add("  worker CPU ms / deployment", lambda r: f"{r['tick']['p50_cpu_ms_per_deployment']:.3f}")
    add("SQL queries / tick (captured)", lambda r: r["sql"]["tick"]["queries"])
    add("  statements, timed ticks", lambda r: "/".join(map(str, r["tick"]["queries"])))
    add("Redis round trips / tick", lambda r: "/".join(map(str, r["tick"]["redis_round_trips"])))
    add("  + connection handshake", lambda r: "/".join(map(str, r["tick"]["redis_handshake"])))
    add("with probes p50 ms", lambda r: f"{r['tick_with_probes']['p50_ms']:.1f}")
    add("with probes max ms", lambda r: f"{r['tick_with_probes']['max_ms']:.1f}")
    add(
        "with probes ms / deployment",
        lambda r: f"{r['tick_with_probes']['p50_ms_per_deployment']:.3f}",
    )
    add(
        "  worker CPU ms / deployment",
        lambda r: f"{r['tick_with_probes']['p50_cpu_ms_per_deployment']:.3f}",
    )
    add("  probes alone ms / deployment", lambda r: f"{r['probe_cost_ms_per_deployment']:.3f}")
    add("  probes answered 200", lambda r: r["probes_answered_200"])
    add(
        "slots measured exactly (no probes)",
        lambda r: spread(r["measured"]["slots_measured_exactly"]["tick"]),
    )
    add(
        "slots measured exactly (probes)",
        lambda r: spread(r["measured"]["slots_measured_exactly"]["tick_with_probes"]),
    )
    add("naive p50 ms", lambda r: f"{r['naive']['p50_ms']:.1f}")
    add("naive ms / deployment", lambda r: f"{r['naive']['p50_ms_per_deployment']:.3f}")
    add("  worker CPU ms / deployment", lambda r: f"{r['naive']['p50_cpu_ms_per_deployment']:.3f}")
    add(
        "naive SQL / Redis per tick",
        lambda r: f"{r['naive']['queries'][-1]} / {r['naive']['redis_round_trips'][-1]}",
    )
    add("tick / naive (p50)", lambda r: f"{r['ratio_tick_to_naive']:.3f}x")
    add("tick / naive (worker CPU)", lambda r: f"{r['ratio_tick_to_naive_cpu']:.3f}x")
    print_table(rows)


def spread(values: list[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def report(
    results: list[dict[str, Any]], sizes: list[int], args: argparse.Namespace, env_info: dict
) -> None:
    largest = results[-1]
    ok = largest["tick"]["p50_ms_per_deployment"] <= TARGET_MS_PER_DEPLOYMENT
    # BEGIN/COMMIT included; a tick that crosses a minute also writes minute rows, which
    # at 1,000 deployments (3,000 rows) takes a second insert batch of 2,000.
    constant = len({r["sql"]["tick"]["queries"] for r in results}) == 1
    result = {
        "benchmark": "health_tick",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": {
            "quick": args.quick,
            "sizes": sizes,
            "ticks": args.ticks,
            "warmup": args.warmup,
            "tenants": args.tenants,
            "replicas": REPLICAS,
            "requests_per_publish": REQUESTS_PER_PUBLISH,
            "history": {
                "raw_rows_every_2s": args.raw_rows,
                "raw_rows_every_minute_before": args.raw_sparse_minutes,
                "minute_rows_minutes": args.history_minutes,
                "minute_step": args.minute_step,
            },
            "contract": CONTRACT_YAML,
        },
        "environment": env_info,
        "sizes": results,
        "target_ms_per_deployment": TARGET_MS_PER_DEPLOYMENT,
        "target_ok": ok,
        "queries_constant": constant,
    }
    print_results(results)
    verdict = "OK" if ok else "ABOVE TARGET"
    print(
        f"\n  tick at {largest['deployments']} deployments: "
        f"{largest['tick']['p50_ms_per_deployment']:.3f} ms per deployment "
        f"(target <= {TARGET_MS_PER_DEPLOYMENT} ms: {verdict}); SQL queries per tick "
        f"{'constant' if constant else 'GROW WITH N'}\n"
    )
    write_results("health_tick", result, args.output)
    if not ok and not args.profile:
        print("above target: rerun with --profile 3 to see where the tick spends it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000", help="deployment counts, comma-separated")
    parser.add_argument("--ticks", type=int, default=8, help="timed rounds per size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds per size")
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--raw-rows", type=int, default=300, help="raw rows a slot, every 2 s")
    parser.add_argument(
        "--raw-sparse-minutes",
        type=int,
        default=60,
        help="then one raw row a minute for this many minutes (30m/1h lookups find rows)",
    )
    parser.add_argument(
        "--history-minutes", type=int, default=1450, help="minute rows cover this many minutes"
    )
    parser.add_argument(
        "--minute-step", type=int, default=1, help="one minute row every this many minutes"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timed rounds of each size, cProfile N ticks and print where time goes",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="--sizes 20 --ticks 2 --warmup 1 --tenants 2, 20 minutes of history",
    )
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.ticks, args.warmup, args.tenants = "20", 2, 1, 2
        args.raw_rows, args.raw_sparse_minutes, args.history_minutes = 30, 5, 20
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    quiet_console_logging()
    status = 0
    try:
        with BenchSession("health_tick") as session:
            test_name = session.database()
            session.redis()
            assert health.health_keys()["sli"] == f"{BENCH_PREFIX}:sli"
            probe_server, serve_url = start_probe_server()
            session.callback(probe_server.wait, 10)
            session.callback(probe_server.terminate)
            load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
            print(f"test database {test_name}; probe stand-in on {serve_url}; load {load}")
            tenants = seed_tenants(args.tenants)
            results = [run_size(n, tenants, args, serve_url) for n in sizes]
            env_info = environment(
                "django", "redis", "psycopg", database=True, redis_url=settings.REDIS_URL
            )
            report(results, sizes, args, env_info)
    except KeyboardInterrupt:
        print("\ninterrupted: dropped the test database", file=sys.stderr)
        status = 130
    return status


if __name__ == "__main__":
    sys.exit(main())
