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
  last row, one Redis HGETALL, one ORM insert for each slot), up to --naive-max deployments;
* sharded, on real Celery workers (queue `health`, concurrency 1, prefetch 1, started by the
  bench on its test database): the unsharded tick on 1 worker, then --shards shards on 1 and
  on 2 workers, each tick sent as the beat's fan-out sends it (one `serving.health_tick_shard`
  message per shard, one tick time) and timed from the first message to the last result.

From --large deployments on, each slot has less stored history (--large-raw-rows raw rows, a
minute row every --large-minute-step minutes: seeding 10,000 deployments' full day of minute
rows would take half an hour) and at most --large-ticks timed rounds.

The run uses its own PostgreSQL database, created and dropped through Django's test-database
machinery (``test_<name>_health`` of DATABASE_URL), its own Redis key prefix
(``portal-bench-health:*``, cleared before and after); it never touches real data. Run from
the repository root::

    python -m bench health_tick [--quick] [--sizes 1000,10000] [--ticks 8] [--shards 4]
                                [--profile 3] [--no-workers]

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
from dataclasses import dataclass
from datetime import UTC, datetime
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
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from bench.fleet import (  # noqa: E402
    REPLICAS,
    REQUESTS_PER_PUBLISH,
    SAMPLE_KV,
    TICK_S,
    History,
    SlotSeed,
    TenantSeed,
    kv_of,
    seed_deployments,
    seed_history,
    seed_tenants,
    serve_traffic,
    slot_version,
    unit_of,
)
from bench.harness import BenchSession  # noqa: E402
from bench.harness.database import database_url  # noqa: E402
from bench.harness.processes import die_with_parent, start_process, stop_process  # noqa: E402
from bench.harness.profiling import top  # noqa: E402
from bench.harness.redis import clear_prefix  # noqa: E402
from bench.harness.report import environment, print_table, results_path, write_results  # noqa: E402
from bench.harness.stats import ratio  # noqa: E402
from portal.celery import app as celery_app  # noqa: E402
from serving.dataplane.sli import publish, sli_key  # noqa: E402
from serving.deployments.models import (  # noqa: E402
    Deployment,
    DeploymentRevision,
)
from serving.ops import health  # noqa: E402
from serving.ops.models import Resolution, SlaContract, SliSample  # noqa: E402
from serving.ops.sli_store import (  # noqa: E402
    as_datetime,
    counts_of_totals,
    lookup_before,
    sample_row,
)
from serving.ops.tasks import health_tick_shard  # noqa: E402
from serving.slo.evaluate import Counts, evaluate  # noqa: E402
from serving.slo.parse import parse_contract  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tests.support.contracts import REALISTIC as CONTRACT_YAML  # noqa: E402

TARGET_MS_PER_DEPLOYMENT = 0.5  # issue 20: per deployment per tick, or scale with workers
RESULTS_PATH = results_path("health_tick")


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


def wipe_deployments() -> None:
    """Deployments, revisions, contracts and SLI rows of the previous size (own test DB)."""
    tables = [m._meta.db_table for m in (SliSample, SlaContract, DeploymentRevision, Deployment)]
    tenants = Tenant.objects.count()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
    assert Tenant.objects.count() == tenants, "TRUNCATE ... CASCADE reached the tenants"
    clear_bench_redis()


def publish_round(slots: list[SlotSeed], round_no: int) -> int:
    """Every replica serves some requests, then rolls its window and publishes it (as
    replicas do, with the data plane's own `publish`), all in one asyncio loop. The rolls come
    last and together: the tick ignores snapshots older than `health.STALE_S`."""
    for slot in slots:
        for recorder in slot.recorders:
            serve_traffic(recorder.current, REQUESTS_PER_PUBLISH[slot.group], round_no * 7)
    snapshots = [r.roll(kv=kv_of(slot)) for slot in slots for r in slot.recorders]
    if len(snapshots) > BATCH_PUBLISH_ABOVE:
        publish_batched(snapshots)
        return len(snapshots)

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


# From this many snapshots on, one at a time took longer than `health.STALE_S` (10,000
# deployments: 25,000 snapshots), so the tick found them stale; thousands of replicas publish
# side by side, not in turn.
BATCH_PUBLISH_ABOVE = 5000
STAMP_AHEAD_S = 120.0


def publish_batched(snapshots: list[dict[str, Any]]) -> None:
    """The commands of `serving.dataplane.sli.publish` (HSET, EXPIRE, PUBLISH) for every
    snapshot, pipelined 1,000 snapshots a round trip, each stamped (`window.end`) STAMP_AHEAD_S
    ahead: a replica publishes every second, so what a tick reads is at most a second old,
    while this bench publishes once before each tick and a tick over 10,000 deployments reads
    it seconds later (more than `health.STALE_S` on a busy machine: every replica would be
    dropped as stale). The counts are the replicas' cumulative totals, which the stamp leaves
    alone."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        for start in range(0, len(snapshots), 1000):
            stamp = time.time() + STAMP_AHEAD_S
            with client.pipeline(transaction=False) as pipe:
                for snapshot in snapshots[start : start + 1000]:
                    snapshot["window"]["end"] = stamp
                    key = sli_key(BENCH_PREFIX, snapshot["app"], snapshot["group"])
                    payload = json.dumps(snapshot, separators=(",", ":"))
                    pipe.hset(key, snapshot["replica"], payload)
                    pipe.expire(key, 600)
                    pipe.publish(f"{BENCH_PREFIX}:sli", payload)
                pipe.execute()
    finally:
        client.close()


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
    n: int,
    tenants: list[TenantSeed],
    args: argparse.Namespace,
    serve_url: str,
    workers: Workers | None = None,
) -> dict[str, Any]:
    wipe_deployments()
    large = n >= args.large
    ticks = min(args.ticks, args.large_ticks) if large else args.ticks
    warmup = min(args.warmup, 1) if large else args.warmup
    with_naive = n <= args.naive_max
    print(f"\n[{n} deployments] seeding ...", flush=True)
    started = time.perf_counter()
    slots = seed_deployments(n, tenants)
    base = float(int(time.time()) // 2 * 2)  # even: every stored `end` is on the tick grid
    history = History(
        base=base,
        t0=base - base % 60 - 60 * (args.history_minutes + 1),
        raw_dense=args.large_raw_rows if large else args.raw_rows,
        raw_sparse=args.raw_sparse_minutes,
        minutes=args.history_minutes,
        minute_step=args.large_minute_step if large else args.minute_step,
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
    for _ in range(warmup):
        publish()
        check_tick(timed_tick(next_now(), None), n, len(slots), probes=False)
        if with_naive:
            timed_naive(naive_now())
        publish()
        check_tick(timed_tick(next_now(), serve_url), n, len(slots), probes=True)
    probes_ok = probe_results_ok(n)

    now = settled()
    sql_plain = capture_sql(now, None)
    measured = verify_measured(slots, now, history)
    sql_probes = capture_sql(settled(), serve_url)
    resync()

    naive_what = "naive / " if with_naive else ""
    print(f"  timing {ticks} rounds of tick / {naive_what}tick with probes ...", flush=True)
    plain: list[Sample] = []
    naive: list[Sample] = []
    probed: list[Sample] = []
    between: list[Sample] = []
    exact: dict[str, list[int]] = {"tick": [], "tick_with_probes": []}
    for _ in range(ticks):
        gc.collect()
        publish()
        plain.append(timed_tick(next_now(), None))
        check_tick(plain[-1], n, len(slots), probes=False)
        exact["tick"].append(exactly_measured(clock["now"], served))
        # The beat's tick between two: only the deployments with a canary are due (every
        # HEALTH_CANARY_INTERVAL_S); the rest are read and skipped.
        between.append(timed_tick(clock["now"] + TICK_S / 2, None))
        if with_naive:
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

    sharded: dict[str, Any] = {}
    if workers is not None:
        rounds = min(args.worker_rounds, args.large_ticks) if large else args.worker_rounds
        sharded = scaling(n, args, workers, rounds, publish, next_now)

    result = {
        "deployments": n,
        "slots": len(slots),
        "stored_rows": stored,
        "seed_s": round(seed_s, 1),
        "tick": summarise(plain, n),
        "tick_with_probes": summarise(probed, n),
        "tick_between": {
            **summarise(between, n),
            "due": sorted({s.report["due"] for s in between}),
        },
        "naive": summarise(naive, n) if naive else None,
        "history": {
            "raw_rows_every_2s": history.raw_dense,
            "minute_step": history.minute_step,
        },
        "sql": {"tick": sql_plain, "tick_with_probes": sql_probes},
        "probes_answered_200": probes_ok,
        "measured": measured,
        "profile": profile,
        "workers": sharded,
    }
    tick_p50 = result["tick"]["p50_ms"]
    print(f"  tick {result['tick']}\n  with probes {result['tick_with_probes']}", flush=True)
    if naive:
        result["ratio_tick_to_naive"] = ratio(tick_p50, result["naive"]["p50_ms"])
        result["ratio_tick_to_naive_cpu"] = ratio(
            result["tick"]["p50_cpu_ms"], result["naive"]["p50_cpu_ms"]
        )
    result["probe_cost_ms_per_deployment"] = round(
        (result["tick_with_probes"]["p50_ms"] - tick_p50) / n, 4
    )
    return result


# --- sharded ticks on real Celery workers --------------------------------------------------


class Workers:
    """Real Celery workers of the `health` queue, one process each (concurrency 1, prefetch 1:
    a worker reserves one shard beyond the one it ticks, so the shards spread over workers)."""

    def __init__(self, env: dict[str, str], work: Path) -> None:
        self.env, self.work = env, work
        self.processes: list[subprocess.Popen[Any]] = []

    def scale(self, count: int) -> None:
        while len(self.processes) < count:
            i = len(self.processes)
            self.processes.append(
                start_process(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "portal",
                        "worker",
                        "-Q",
                        "health",
                        "-n",
                        f"health{i}@%h",
                        "--concurrency",
                        "1",
                        "--prefetch-multiplier",
                        "1",
                        "--without-gossip",
                        "--without-mingle",
                        "-l",
                        "INFO",
                    ],
                    self.env,
                    self.work / f"worker{i}.log",
                    "ready",
                )  # fmt: skip
            )
        while len(self.processes) > count:
            stop_process(self.processes.pop())

    def tasks_done(self) -> list[int]:
        """Shard ticks each worker has run so far (from its log)."""
        done = "Task serving.health_tick_shard["
        counts = []
        for i in range(len(self.processes)):
            text = (self.work / f"worker{i}.log").read_text(errors="replace")
            counts.append(sum(1 for ln in text.splitlines() if done in ln and "succeeded" in ln))
        return counts

    def close(self) -> None:
        self.scale(0)


def sharded_ticks(
    n: int,
    shards: int,
    rounds: int,
    warmup: int,
    publish: Callable[[], None],
    next_now: Callable[[], float],
) -> dict[str, Any]:
    """Ticks as the beat's fan-out makes them: one `serving.health_tick_shard` message per shard
    at one tick time; the wall time from the first message sent to the last shard's result."""
    walls: list[float] = []
    shard_ms: list[list[float]] = []
    for i in range(warmup + rounds):
        publish()
        now = next_now()
        started = time.perf_counter()
        pending = [health_tick_shard.apply_async((k, shards, now)) for k in range(shards)]
        try:
            reports = [p.get(timeout=300) for p in pending]
        except Exception as exc:  # e.g. the task's time limit: a finding, not a crash
            for p in pending:
                p.get(timeout=300, propagate=False)
            return {"shards": shards, "failed": f"{type(exc).__name__} {exc}".strip()}
        wall = time.perf_counter() - started
        skipped = [r for r in reports if r.get("skipped")]
        assert not skipped, skipped
        assert sum(r["deployments"] for r in reports) == n, reports
        assert sum(r["due"] for r in reports) == n, reports
        if any(r["firing"] or r["actions"] for r in reports):
            raise RuntimeError(f"the seeded traffic breached the contract: {reports}")
        if i >= warmup:
            walls.append(wall * 1000)
            shard_ms.append([float(r["duration_ms"]) for r in reports])
    p50 = statistics.median(walls)
    return {
        "shards": shards,
        "ticks": rounds,
        "p50_ms": round(p50, 1),
        "p50_ms_per_deployment": round(p50 / n, 4),
        "all_ms": [round(v, 1) for v in walls],
        "shard_ms": shard_ms,
    }


def scaling(
    n: int,
    args: argparse.Namespace,
    workers: Workers,
    rounds: int,
    publish: Callable[[], None],
    next_now: Callable[[], float],
) -> dict[str, Any]:
    """The unsharded tick on one worker, then `--shards` shards on 1 and on 2 workers."""
    out: dict[str, Any] = {}
    # Each worker's caches (contracts, per-shard boundaries) fill in its first ticks.
    warmup = 1 if args.quick or n >= args.large else 2
    celery_app.conf.task_always_eager = False
    try:
        for count, shards in ((1, 1), (1, args.shards), (2, args.shards)):
            workers.scale(count)
            before = workers.tasks_done()
            print(f"  {count} worker(s), {shards} shard(s): {rounds} ticks ...", flush=True)
            found = sharded_ticks(n, shards, rounds, warmup, publish, next_now)
            after = workers.tasks_done()
            found["shard_ticks_per_worker"] = [
                a - (before[i] if i < len(before) else 0) for i, a in enumerate(after)
            ]
            out[f"{count}w_{shards}s"] = found
            print(
                f"    {json.dumps({k: v for k, v in found.items() if k != 'shard_ms'})}", flush=True
            )
    finally:
        celery_app.conf.task_always_eager = True
        workers.scale(1)
    one, two, whole = out[f"1w_{args.shards}s"], out[f"2w_{args.shards}s"], out["1w_1s"]
    if "p50_ms" in one and "p50_ms" in two:
        out["speedup_2_workers"] = round(one["p50_ms"] / two["p50_ms"], 3)
    if "p50_ms" in one and "p50_ms" in whole:
        out["sharding_overhead_1_worker"] = round(one["p50_ms"] / whole["p50_ms"], 3)
    return out


# Where a tick's time goes: cumulative time of these functions, per tick (under cProfile).
BREAKDOWN = (
    ("serving/ops/health/__init__.py", "tick", "tick (all)"),
    ("serving/ops/health/targets.py", "health_targets", "targets + contracts queries"),
    ("serving/slo/model.py", "from_dict", "  Contract/objects from_dict"),
    ("redis/client.py", "execute", "Redis pipelines (read + write)"),
    ("serving/ops/health/series.py", "parse_read", "  signal series parse"),
    ("serving/ops/health/signals.py", "slot_signals", "slot_signals (signal SLIs)"),
    ("serving/ops/health/signals.py", "decode_all", "  routers / GPU decode"),
    ("serving/ops/health/evaluation.py", "evaluate_slots", "window lookup + evaluation"),
    ("serving/ops/sli_store.py", "lookup", "  BoundaryCache.lookup (>1 h: once a minute)"),
    ("serving/ops/sli_store.py", "lookup_before", "    lookup_before (query + decoding)"),
    ("serving/slo/evaluate.py", "evaluate", "  evaluate()"),
    ("serving/slo/evaluate.py", "to_dict", "Evaluation.to_dict (Redis info)"),
    ("serving/ops/sli_store.py", "sample_row", "sample_row (model instances)"),
    ("serving/ops/sli_store.py", "insert_samples", "insert_samples (COPY)"),
    ("serving/ops/health/signals.py", "kv_summary", "kv_summary"),
    ("serving/slo/counts.py", ("__add__", "__sub__", "_combine"), "Counts + / -"),
    ("serving/slo/counts.py", "from_dict", "Counts.from_dict"),
    ("serving/slo/counts.py", "to_dict", "Counts.to_dict"),
    ("json/__init__.py", "loads", "json.loads"),
    ("json/__init__.py", "dumps", "json.dumps"),
    ("serving/ops/health/probe.py", "probe", "probes (HTTP, concurrent)"),
    ("logging/__init__.py", "callHandlers", "  log records written"),
    ("portal/logging.py", "filter", "    redaction filter"),
    ("serving/ops/health/slots.py", "_mark_good", "_mark_good"),
    ("serving/ops/rollouts.py", "rollouts_advance", "rollouts_advance"),
    ("serving/ops/health/reloads.py", "alert_failed_reloads", "alert_failed_reloads"),
    ("serving/ops/health/kv_integrity.py", "alert_kv_integrity", "alert_kv_integrity"),
    ("serving/ops/health/slots.py", "_resume_stuck_rollbacks", "_resume_stuck_rollbacks"),
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
        if file.endswith("serving/ops/health/__init__.py") and name == "tick"
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
    add(
        "between ticks p50 ms (canaries due)",
        lambda r: f"{r['tick_between']['p50_ms']:.1f} ({spread(r['tick_between']['due'])} due)",
    )
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
    naive = [r for r in results if r["naive"]]
    if naive:
        rows.append(["naive loop", *("" for _ in results)])

        def naive_add(label: str, value: Callable[[dict[str, Any]], Any]) -> None:
            add(label, lambda r: value(r) if r["naive"] else "-")

        naive_add("naive p50 ms", lambda r: f"{r['naive']['p50_ms']:.1f}")
        naive_add("naive ms / deployment", lambda r: f"{r['naive']['p50_ms_per_deployment']:.3f}")
        naive_add(
            "  worker CPU ms / deployment",
            lambda r: f"{r['naive']['p50_cpu_ms_per_deployment']:.3f}",
        )
        naive_add(
            "naive SQL / Redis per tick",
            lambda r: f"{r['naive']['queries'][-1]} / {r['naive']['redis_round_trips'][-1]}",
        )
        naive_add("tick / naive (p50)", lambda r: f"{r['ratio_tick_to_naive']:.3f}x")
        naive_add("tick / naive (worker CPU)", lambda r: f"{r['ratio_tick_to_naive_cpu']:.3f}x")
    sharded = [r for r in results if r["workers"]]
    if sharded:
        rows.append(["sharded, real Celery workers", *("" for _ in results)])

        def shard_add(label: str, value: Callable[[dict[str, Any]], Any]) -> None:
            add(label, lambda r: value(r["workers"]) if r["workers"] else "-")

        def wall(found: dict[str, Any]) -> str:
            return f"{found['p50_ms']:.1f}" if "p50_ms" in found else found["failed"][:24]

        shard_add("1 worker, 1 shard: wall ms", lambda w: wall(w["1w_1s"]))
        shard_add(
            "1 worker, S shards: wall ms",
            lambda w: f"{wall(w[one_of(w, 1)])} (S={w[one_of(w, 1)]['shards']})",
        )
        shard_add("2 workers, S shards: wall ms", lambda w: wall(w[one_of(w, 2)]))
        shard_add(
            "  ms / deployment, 2 workers",
            lambda w: f"{w[one_of(w, 2)].get('p50_ms_per_deployment', float('nan')):.3f}",
        )
        shard_add(
            "  speedup, 2 vs 1 worker", lambda w: f"{w.get('speedup_2_workers', float('nan')):.2f}x"
        )
        shard_add(
            "  shard ticks per worker (2 w)",
            lambda w: "/".join(map(str, w[one_of(w, 2)]["shard_ticks_per_worker"])),
        )
        shard_add(
            "  S shards / 1 shard, 1 worker",
            lambda w: f"{w.get('sharding_overhead_1_worker', float('nan')):.2f}x",
        )
    print_table(rows)


def one_of(workers: dict[str, Any], count: int) -> str:
    """The key of the sharded run on `count` workers."""
    return next(k for k in workers if k.startswith(f"{count}w_") and k != "1w_1s")


def spread(values: list[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def report(
    results: list[dict[str, Any]], sizes: list[int], args: argparse.Namespace, env_info: dict
) -> None:
    largest = results[-1]
    ok = largest["tick"]["p50_ms_per_deployment"] <= TARGET_MS_PER_DEPLOYMENT
    workers = largest["workers"]
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
        "speedup_2_workers": workers.get("speedup_2_workers"),
        "queries_constant": constant,
    }
    print_results(results)
    verdict = "OK" if ok else "ABOVE TARGET"
    print(
        f"\n  tick at {largest['deployments']} deployments: "
        f"{largest['tick']['p50_ms_per_deployment']:.3f} ms per deployment "
        f"(target <= {TARGET_MS_PER_DEPLOYMENT} ms: {verdict}); SQL queries per tick "
        f"{'constant' if constant else 'GROW WITH N'}"
    )
    if workers and "speedup_2_workers" in workers:
        two = workers[one_of(workers, 2)]
        print(
            f"  sharded ({two['shards']} shards) on 2 Celery workers: "
            f"{two['p50_ms']:.0f} ms a tick, "
            f"{two['p50_ms_per_deployment']:.3f} ms per deployment, "
            f"{workers['speedup_2_workers']:.2f}x the 1-worker wall time"
        )
    print()
    write_results("health_tick", result, args.output)
    if not ok and not args.profile:
        print("above target: rerun with --profile 3 to see where the tick spends it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000", help="deployment counts, comma-separated")
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
        "--large",
        type=int,
        default=5000,
        metavar="N",
        help="sizes from N on: --large-raw-rows, --large-minute-step, at most --large-ticks",
    )
    parser.add_argument(
        "--large-raw-rows", type=int, default=30, help="raw rows a slot every 2 s (large sizes)"
    )
    parser.add_argument(
        "--large-minute-step", type=int, default=30, help="minute rows this far apart (large)"
    )
    parser.add_argument("--large-ticks", type=int, default=3, help="timed rounds (large sizes)")
    parser.add_argument(
        "--shards", type=int, default=4, help="shards of the tick on 1 and 2 Celery workers"
    )
    parser.add_argument(
        "--worker-rounds", type=int, default=5, help="timed sharded ticks per worker count"
    )
    parser.add_argument(
        "--no-workers", action="store_true", help="skip the sharded ticks on Celery workers"
    )
    parser.add_argument(
        "--naive-max", type=int, default=1000, help="run the naive loop up to this size only"
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
        args.shards, args.worker_rounds = 2, 1
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
            workers = None
            if not args.no_workers:
                env = {
                    **os.environ,
                    "DATABASE_URL": database_url(test_name),
                    "PORTAL_TEST_WORKER": "1",
                    "HEALTH_PROBES": "0",
                }
                workers = Workers(env, session.workdir())
                session.callback(workers.close)
            results = []
            for n in sizes:  # each size's figures on disk as soon as it is done
                results.append(run_size(n, tenants, args, serve_url, workers))
                write_results("health_tick", {"partial": True, "sizes": results}, args.output)
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
