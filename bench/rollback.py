"""Benchmark: how fast the ops loop notices a failing canary and puts traffic back on stable.

Everything real, on this machine: a local Ray head (127.0.0.1, token auth) serving a tiny
Llama deployment (stable v1, canary v2 at 20%), a Celery worker and Celery beat (health tick
every HEALTH_TICK_S, 1 s by default; a deployment with a canary in flight is checked every
HEALTH_CANARY_INTERVAL_S, 1 s, the others every 2 s) on the bench's own PostgreSQL test
database and Redis db, and two client threads sending completions through the Serve proxy.
Each run:

1. the canary (v2, 20%) is set without faults and comes up;
2. errors are injected into the canary (30% of its requests fail) through the reconcile path;
   fault onset = the first failed answer a client sees;
3. the health tick detects the breach (the contract's fast rule: error ratio above 5% over
   10 s), opens an incident and rolls back; detected = the breach's tick;
4. switch = from detection to the last answer a client got from the canary (client side),
   and to the rollback's `traffic_switched_at` (portal side: the reconcile PUT accepted);
5. shield = from the onset to the last answer a client got from the canary, whoever moved the
   traffic (the router's breaker or the rollback); landed = from the onset to the rollback's
   `traffic_switched_at`.

`--breaker off` switches the router's circuit breaker off (failure rate 1.0 over 100,000
requests, the canary comparison off): the canary keeps answering until the portal's rollback,
which is what "switch" measures. `--breaker on` leaves the deployment's default breaker, which
holds the canary against its stable (serving.dataplane.breaker.CanaryBreaker): "shield" then
measures the breaker, "landed" the durable rollback the turned-away requests still trigger.
`--breaker nomirror` is the default breaker without mirroring (`mirror_clean` 0: a failed
canary call changes nothing until the breaker opens), the breaker before the canary's clients
left it at its first failure (serving.dataplane.mirror). `both` (the default) runs off, then on;
a comma list (`nomirror,on`) runs each in turn, each with its own Ray head.

    python -m bench rollback [--quick] [--runs 20] [--mode both|external|embedded]
        [--breaker both|off|on|nomirror|LIST] [--clients 2] [--tick 1] [--json PATH]

Modes: `external` runs on the PostgreSQL and Redis of DATABASE_URL / REDIS_URL (the servers a
deployment of the portal is given); `embedded` on the portal's own embedded PostgreSQL 18 and
Valkey 8 (portal/embedded.py, what `make up` starts with neither URL set), started here on free
loopback ports in a temporary folder, the bench running in a child process pointed at them;
`both` (the default) runs the two one after the other, each with its own Ray head, and reports
them side by side (`modes`; the top-level figures are the external run's, breaker off). --quick
runs one run in embedded mode with the breaker on (the suite's check that the embedded loop
still rolls back a canary the breaker already shields).

Writes bench/results/rollback.json. Targets: detection p95 <= 10 s, switch p95 <= 1 s (breaker
off); shield p95 <= 0.5 s and landed p95 <= 3 s (breaker on).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import env  # noqa: E402

# Own settings, Redis db (11 unless REDIS_URL is set), prefixes portal-bench-rollback (Celery's
# queues included: bench/harness/settings.py).
env.setup("rollback", redis_db=11)

from django.conf import settings  # noqa: E402

from bench.harness import BenchSession  # noqa: E402
from bench.harness.clients import Clients  # noqa: E402
from bench.harness.database import database_url  # noqa: E402
from bench.harness.report import environment, results_path, write_results  # noqa: E402
from bench.harness.stats import median, percentile  # noqa: E402
from tests.support import contracts  # noqa: E402

TARGET_DETECT_P95_S, TARGET_SWITCH_P95_S = 10.0, 1.0
TARGET_SHIELD_P95_S, TARGET_LANDED_P95_S = 0.5, 3.0
BREAKER_OFF = {"failure_rate": 1.0, "min_requests": 100000, "canary_alpha": 0}
# --breaker: the deployment's breaker settings
BREAKERS: dict[str, dict[str, Any]] = {
    "off": BREAKER_OFF,
    "on": {},
    "nomirror": {"mirror_clean": 0},
}


def one_run(ctx: dict[str, Any], index: int) -> dict[str, Any]:
    from incidents.models import Incident
    from serving.deployments import reconcile as control
    from serving.deployments import services as deployments
    from serving.deployments.models import Deployment
    from serving.ops.models import Rollback, RollbackStatus

    deployment: Deployment = ctx["deployment"]
    actor, client, app = ctx["actor"], ctx["client"], ctx["app"]
    tenant = deployment.tenant
    deployments.deployment_change(
        tenant=tenant, actor=actor, deployment=deployment,
        changes={"canary_version": ctx["v2"].pk, "canary_percent": 20, "faults": {}},
        reason=f"run {index}: canary v2 at 20%",
    )  # fmt: skip
    control.reconcile(target=ctx["target"], client=client)
    try:
        client.wait_until([app, f"{app}.canary"], timeout=120)
    except Exception:
        from incidents.models import SlaBreach

        for row in SlaBreach.objects.filter(deployment=deployment).values():
            print("breach:", row)
        for row in Rollback.objects.filter(deployment=deployment).values():
            print("rollback:", row)
        from serving.ops.health import health_keys, health_redis

        routers = health_redis().hgetall(f"{health_keys()['router']}:{app}") or {}
        for raw in routers.values():  # the routers' breakers, as the tick read them
            print("router:", raw.decode()[:2000])
        raise
    time.sleep(3)  # a little clean canary traffic first
    deployments.deployment_change(
        tenant=tenant, actor=actor, deployment=deployment,
        changes={"faults": {"canary": {"error_rate": 0.3}}},
        reason=f"run {index}: inject 30% errors into the canary",
    )  # fmt: skip
    injected = time.time()
    control.reconcile(target=ctx["target"], client=client)
    deadline = time.monotonic() + 90
    rollback = None
    while time.monotonic() < deadline:
        rollback = (
            Rollback.objects.filter(
                deployment=deployment,
                status=RollbackStatus.DONE,
                created_at__gte=datetime.fromtimestamp(injected, tz=UTC),
            )  # fmt: skip
            .order_by("-created_at")
            .first()
        )
        if rollback is not None:
            break
        time.sleep(0.2)
    else:
        raise SystemExit(f"run {index}: no rollback within 90 s")
    assert rollback is not None
    time.sleep(3)  # answers after the switch, to see the last canary one
    answers = ctx["clients"].since(injected)
    failed = (done for _, done, status, group in answers if status >= 500 and group == "canary")
    onset = next(failed, injected)  # none: the breaker left the canary before any failed
    detected = rollback.detected_at.timestamp()
    last_canary = max(done for _, done, _, group in answers if group == "canary")
    Incident.objects.filter(tenant=tenant, rollback=rollback).update(status="resolved")
    return {
        "run": index,
        "shield_s": round(last_canary - onset, 3),
        "landed_s": round(rollback.traffic_switched_at.timestamp() - onset, 3),
        "detection_s": round(detected - onset, 3),
        "switch_client_s": round(max(0.0, last_canary - detected), 3),
        "switch_portal_s": round(rollback.traffic_switched_at.timestamp() - detected, 3),
        "rollback_finished_s": round(rollback.finished_at.timestamp() - detected, 3),
        # where the portal's part goes: breach paperwork, the revision, the reconcile PUT
        "to_request_s": round(rollback.created_at.timestamp() - detected, 3),
        "to_revision_s": round(
            rollback.started_at.timestamp() - rollback.created_at.timestamp(), 3
        ),
        "reconcile_s": round(
            rollback.traffic_switched_at.timestamp() - rollback.started_at.timestamp(), 3
        ),
    }


FIGURES = (
    "shield_s", "landed_s", "detection_s", "switch_client_s", "switch_portal_s",
    "rollback_finished_s", "to_request_s", "to_revision_s", "reconcile_s",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="--runs 1, embedded mode")
    parser.add_argument("--mode", choices=("both", "external", "embedded"), default=None)
    parser.add_argument("--breaker", default=None, help="both, off, on, nomirror or a list")
    parser.add_argument("--clients", type=int, default=2, help="client threads")
    parser.add_argument(
        "--tick",
        type=float,
        default=float(settings.CELERY_BEAT_SCHEDULE["health-tick"]["schedule"]),
        help="the health tick's beat (s; HEALTH_TICK_S, the portal's default unless given)",
    )
    parser.add_argument("--label", default="external", help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, default=results_path("rollback"))
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 1
    mode = args.mode or ("embedded" if args.quick else "both")
    breaker = args.breaker or ("on" if args.quick else "both")
    wanted = ["off", "on"] if breaker == "both" else breaker.split(",")
    unknown = sorted(set(wanted) - set(BREAKERS))
    if unknown:
        parser.error(f"--breaker: unknown setting {unknown[0]!r} (off, on, nomirror, both)")
    results: dict[str, dict[str, Any]] = {}
    for setting in wanted:
        suffix = "" if len(wanted) == 1 else f", breaker {setting}"
        if mode in ("external", "both"):
            label = args.label + suffix
            results[label] = measure(args.runs, args.quick, label, setting, args.clients, args.tick)
        if mode in ("embedded", "both"):
            results["embedded" + suffix] = in_embedded(
                args.runs, args.quick, args.output, setting, args.clients, args.tick
            )
    # One external measurement (an embedded child's too) is written as it is; anything else
    # side by side, under `modes`.
    alone = mode == "external" and len(results) == 1
    summary = next(iter(results.values())) if alone else side_by_side(results)
    write_results("rollback", summary, args.output)
    return 0


def in_embedded(
    runs: int, quick: bool, output: Path, breaker: str, clients: int, tick: float
) -> dict[str, Any]:
    """One measurement in a child process on the embedded PostgreSQL and Valkey, started
    here (free loopback ports, a temporary folder) and stopped after it."""
    import json
    import shutil
    import subprocess
    import tempfile

    from portal import embedded
    from tests.ray_cluster import free_ports

    pg_port, redis_port = free_ports(2)
    folder = Path(tempfile.mkdtemp(prefix="bench-rollback-embedded-"))
    config = embedded.Embedded(data_dir=folder, pg_port=pg_port, redis_port=redis_port)
    child_output = output.with_name(output.stem + ".embedded.json")
    try:
        started = time.monotonic()
        embedded.start_daemons(config)
        print(f"  embedded PostgreSQL and Valkey up in {time.monotonic() - started:.1f} s")
        env = {**os.environ, "DATABASE_URL": config.database_url, "REDIS_URL": config.redis_url}
        argv = [sys.executable, "-m", "bench.rollback", "--mode", "external", "--label"]
        argv += ["embedded", "--runs", str(runs), "--output"]
        argv += [str(child_output), "--breaker", breaker, "--clients", str(clients)]
        argv += ["--tick", str(tick)]
        subprocess.run([*argv, *(["--quick"] if quick else [])], env=env, check=True)  # noqa: S603
        result: dict[str, Any] = json.loads(child_output.read_text())
        return result
    finally:
        embedded.stop_daemons(config)
        child_output.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def side_by_side(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The first mode's summary at the top level, every mode's figures under `modes`."""
    first = next(iter(results.values()))
    summary = {**first, "mode": "+".join(results)}
    summary["modes"] = {
        name: {"services": r["services"], "ok": r["ok"], **{f: r[f] for f in FIGURES}}
        for name, r in results.items()
    }
    print()
    print("  " + " " * 20 + "".join(f"{name:>24}" for name in results))
    for name in FIGURES:
        cells = "".join(
            f"   p50 {r[name]['p50']:5.2f} p95 {r[name]['p95']:5.2f}" for r in results.values()
        )
        print(f"  {name:<20}{cells}")
    return summary


def measure(
    runs_wanted: int, quick: bool, label: str, breaker: str, threads: int, tick: float
) -> dict[str, Any]:
    """The runs on this process's DATABASE_URL and REDIS_URL; their summary."""
    logging.getLogger("httpx").setLevel(logging.WARNING)

    from serving.deployments import reconcile as control
    from serving.deployments import services as deployments
    from serving.deployments.models import Deployment
    from serving.engine.testing import write_tiny_checkpoint
    from serving.ops.contracts import contract_set
    from serving.registry import services as registry
    from tenants.actors import Actor
    from tests.support.worlds import make_world

    runs: list[dict[str, Any]] = []
    with BenchSession("rollback") as session:
        test_name = session.database()
        session.redis()
        work = session.workdir()
        _, target = session.ray_head(work)
        world = make_world("Bench")
        actor = Actor(user=world.owner)
        versions = []
        for version_label, seed in (("bench-v1", 1), ("bench-v2", 7)):
            directory = write_tiny_checkpoint(work / version_label, seed=seed)
            version = registry.version_register_path(
                tenant=world.tenant, actor=actor, model=world.model, label=version_label,
                path=str(directory),
            )  # fmt: skip
            versions.append(registry.version_validate(tenant=world.tenant, version_id=version.pk))
        Deployment.objects.filter(tenant=world.tenant).update(deleted_at=world.tenant.created_at)
        deployment, key = deployments.deployment_create(
            tenant=world.tenant, actor=actor, name="chat", version_id=versions[0].pk,
            # Off, the router's breaker leaves the canary to the portal: the last canary answer
            # a client sees marks the rollback's switch. On: the default breaker.
            settings={"num_cpus": 0.25, "breaker": BREAKERS[breaker]},
        )  # fmt: skip
        contract_set(
            tenant=world.tenant, actor=actor, deployment=deployment,
            source=contracts.CANARY_ERRORS,
        )  # fmt: skip
        child_env = {
            **os.environ,
            "DATABASE_URL": database_url(test_name),
            "PORTAL_TEST_WORKER": "1",
            "RAY_ADDRESS": target.address,
            "RAY_DASHBOARD_URL": target.dashboard_url,
            "RAY_AUTH_TOKEN": target.token,
            "RAY_SERVE_URL": target.serve_url,
            "PORTAL_RAY_SERVE_HOST": "127.0.0.1",
            "EMAIL_FILE_PATH": str(work / "mail"),
            "HEALTH_TICK_S": str(tick),
        }
        # The deployment keeps its own health_interval_s (2 s); with its canary in flight the
        # tick checks it every HEALTH_CANARY_INTERVAL_S (1 s), at most once a beat.
        session.celery_worker(child_env, work / "worker.log", queues="default,health")
        session.celery_beat(child_env, work)
        client = target.serve_client()
        control.reconcile(target=target, client=client)
        app = f"{world.tenant.slug}.chat"
        client.wait_until([app], timeout=180)
        url = f"{target.serve_url}/{world.tenant.slug}/chat/v1/completions"
        clients = Clients(url, key, threads, pause_on_error=0)
        session.callback(clients.close)
        ctx = {
            "deployment": deployment, "actor": actor, "client": client, "app": app,
            "target": target, "v2": versions[1], "clients": clients,
        }  # fmt: skip
        for index in range(1, runs_wanted + 1):
            result = one_run(ctx, index)
            runs.append(result)
            print(
                f"  run {index:2d}: shield {result['shield_s']:5.2f} s   landed "
                f"{result['landed_s']:5.2f} s   detection {result['detection_s']:6.2f} s   "
                f"switch (client) {result['switch_client_s']:5.2f} s   (portal) "
                f"{result['switch_portal_s']:5.2f} s"
            )
    summary: dict[str, Any] = {
        "benchmark": "rollback",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "mode": label,
        "services": _services(),
        "environment": environment("ray", "celery"),
        "breaker": breaker,
        "client_threads": threads,
        "requests_per_s": clients.rate(),
        "runs": runs,
        "health_tick_s": tick,
        "health_interval_s": deployment.health_interval_s,
        "canary_interval_s": settings.HEALTH_CANARY_INTERVAL_S,
    }
    for name in FIGURES:
        values = [r[name] for r in runs]
        summary[name] = {
            "p50": round(float(median(values)), 3),
            "p95": round(percentile(values, 0.95), 3),
        }
    if breaker != "off":
        summary["ok"] = (
            summary["shield_s"]["p95"] <= TARGET_SHIELD_P95_S
            and summary["landed_s"]["p95"] <= TARGET_LANDED_P95_S
        )
        targets = f"shield p95 <= {TARGET_SHIELD_P95_S} s, landed p95 <= {TARGET_LANDED_P95_S} s"
    else:
        summary["ok"] = (
            summary["detection_s"]["p95"] <= TARGET_DETECT_P95_S
            and summary["switch_client_s"]["p95"] <= TARGET_SWITCH_P95_S
        )
        targets = f"detection p95 <= {TARGET_DETECT_P95_S} s, switch p95 <= {TARGET_SWITCH_P95_S} s"
    print()
    for name in FIGURES:
        print(f"  {name:<20} p50 {summary[name]['p50']:6.2f} s   p95 {summary[name]['p95']:6.2f} s")
    print(f"  {summary['requests_per_s']} requests/s, {threads} client threads, tick {tick} s")
    print(f"  targets: {targets}: {'OK' if summary['ok'] else 'NOT MET'} ({label})")
    return summary


def _services() -> dict[str, str]:
    """The servers this measurement ran on, as they name themselves."""
    import redis
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        postgres = str(cursor.fetchone()[0]).split(" on ")[0]
    info = redis.Redis.from_url(settings.REDIS_URL).info("server")
    server = "Valkey" if "valkey_version" in info else "Redis"
    version = info.get("valkey_version") or info.get("redis_version")
    return {"postgres": postgres, "redis": f"{server} {version}"}


if __name__ == "__main__":
    sys.exit(main())
