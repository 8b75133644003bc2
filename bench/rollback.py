"""Benchmark: how fast the ops loop notices a failing canary and puts traffic back on stable.

Everything real, on this machine: a local Ray head (127.0.0.1, token auth) serving a tiny
Llama deployment (stable v1, canary v2 at 20%), a Celery worker and Celery beat (health tick
every HEALTH_TICK_S, 2 s by default) on the bench's own PostgreSQL test database and Redis db,
and two client threads sending completions through the Serve proxy. Each run:

1. the canary (v2, 20%) is set without faults and comes up;
2. errors are injected into the canary (30% of its requests fail) through the reconcile path;
   fault onset = the first failed answer a client sees;
3. the health tick detects the breach (the contract's fast rule: error ratio above 5% over
   10 s), opens an incident and rolls back; detected = the breach's tick;
4. switch = from detection to the last answer a client got from the canary (client side; the
   router's circuit breaker is off in this deployment, or it would hide the canary earlier),
   and to the rollback's `traffic_switched_at` (portal side: the reconcile PUT accepted).

    .venv/bin/python bench/rollback.py [--runs 20]

Writes bench/results/rollback.json. Targets: detection p95 <= 10 s, switch p95 <= 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/portal_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")
os.environ.setdefault("SLI_KEY_PREFIX", "portal-bench-rollback")
os.environ.setdefault("CACHE_KEY_PREFIX", "portal-bench-rollback")
os.environ.setdefault("CHANNEL_PREFIX", "portal-bench-rollback:asgi")
os.environ.setdefault("RATE_LIMIT_KEY_PREFIX", "portal-bench-rollback:rl")

import django  # noqa: E402

django.setup()

import logging  # noqa: E402

import httpx  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment, teardown_test_environment  # noqa: E402

from bench.isolated import clear_redis, ensure_base_database  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "rollback.json"
TARGET_DETECT_P95_S, TARGET_SWITCH_P95_S = 10.0, 1.0
CONTRACT = """\
apiVersion: aiops.portal/v1
kind: SlaContract
metadata:
  name: bench-sla
spec:
  window: 30d
  objectives:
    - name: availability
      sli: availability
      target: 0.99
  fast:
    - name: canary-errors
      sli: error_rate
      above: 0.05
      for: 10s
      min_requests: 5
      action: rollback
"""


def free_ports(count: int) -> list[int]:
    held, ports = [], []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
            port = sock.getsockname()[1]
            if port not in (6379, 8000) and not 10002 <= port < 20000:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


class Clients:
    """Two client threads; every answer is logged with its time and group."""

    def __init__(self, url: str, key: str, threads: int = 2) -> None:
        self.url, self.key = url, key
        self.log: list[tuple[float, int, str]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        body = {"prompt": "The quick brown fox", "max_tokens": 1, "temperature": 0}
        with httpx.Client(timeout=30, trust_env=False) as http:
            while not self.stop.is_set():
                try:
                    response = http.post(
                        self.url, json=body, headers={"authorization": f"Bearer {self.key}"}
                    )
                    status, group = response.status_code, response.headers.get("x-ab-group", "?")
                except httpx.HTTPError:
                    status, group = 0, "?"
                with self.lock:
                    self.log.append((time.time(), status, group))

    def since(self, t: float) -> list[tuple[float, int, str]]:
        with self.lock:
            return [entry for entry in self.log if entry[0] >= t]

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def start_process(args: list[str], env: dict[str, str], log: Path, ready: str) -> Any:
    handle = log.open("w")
    process = subprocess.Popen(  # noqa: S603
        args, cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 90
    while ready not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{args[3]} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return process


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_run(ctx: dict[str, Any], index: int) -> dict[str, Any]:
    from incidents.models import Incident
    from serving import deployments
    from serving.control import reconcile as control
    from serving.models import Deployment, Rollback, RollbackStatus

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
    onset = next(t for t, status, group in answers if status >= 500 and group == "canary")
    detected = rollback.detected_at.timestamp()
    last_canary = max(t for t, _, group in answers if group == "canary")
    Incident.objects.filter(tenant=tenant, rollback=rollback).update(status="resolved")
    return {
        "run": index,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)

    from serving import services as registry
    from serving.contracts import contract_set
    from serving.control.cluster import LocalHeadConfig, local_target, start_head, stop_head
    from serving.engine.testing import write_tiny_checkpoint
    from serving.models import Deployment
    from tenants.actors import Actor
    from tests.conftest import make_world

    ensure_base_database(settings)
    setup_test_environment(debug=False)
    old_name = settings.DATABASES["default"]["NAME"]
    patterns = (f"{settings.SLI_KEY_PREFIX}:*", f"{os.environ['CACHE_KEY_PREFIX']}:*")
    test_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    clear_redis(settings.REDIS_URL, *patterns)
    work = Path(tempfile.mkdtemp(prefix="portal-bench-rollback-"))
    ports = free_ports(7)
    head = LocalHeadConfig(
        data_dir=work / "ray", gcs_port=ports[0], dashboard_port=ports[1], serve_port=ports[2],
        client_server_port=ports[3], dashboard_agent_port=ports[4],
        autoscaler_metrics_port=ports[5], dashboard_metrics_port=ports[6], num_cpus=2,
        num_gpus=0,
    )  # fmt: skip
    processes: list[Any] = []
    clients: Clients | None = None
    try:
        print("starting the Ray head ...")
        start_head(head)
        target = local_target(head)
        world = make_world("Bench")
        actor = Actor(user=world.owner)
        versions = []
        for label, seed in (("bench-v1", 1), ("bench-v2", 7)):
            directory = write_tiny_checkpoint(work / label, seed=seed)
            version = registry.version_register_path(
                tenant=world.tenant, actor=actor, model=world.model, label=label,
                path=str(directory),
            )  # fmt: skip
            versions.append(registry.version_validate(tenant=world.tenant, version_id=version.pk))
        from serving import deployments

        Deployment.objects.filter(tenant=world.tenant).update(deleted_at=world.tenant.created_at)
        deployment, key = deployments.deployment_create(
            tenant=world.tenant, actor=actor, name="chat", version_id=versions[0].pk,
            # The router's circuit breaker would shield clients from the failing canary on its
            # own; off here, so the last canary answer a client sees marks the real switch.
            settings={"num_cpus": 0.25, "breaker": {"failure_rate": 1.0, "min_requests": 100000}},
        )  # fmt: skip
        contract_set(tenant=world.tenant, actor=actor, deployment=deployment, source=CONTRACT)
        db = connection.settings_dict
        env = {
            **os.environ,
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{test_name}",
            "PORTAL_TEST_WORKER": "1",
            "RAY_ADDRESS": target.address,
            "RAY_DASHBOARD_URL": target.dashboard_url,
            "RAY_AUTH_TOKEN": target.token,
            "RAY_SERVE_URL": target.serve_url,
            "PORTAL_RAY_SERVE_HOST": "127.0.0.1",
            "EMAIL_FILE_PATH": str(work / "mail"),
        }
        python = sys.executable
        processes.append(start_process(
            [python, "-m", "celery", "-A", "portal", "worker", "-Q", "default,health",
             "--concurrency", "2", "--without-gossip", "--without-mingle", "-l", "INFO"],
            env, work / "worker.log", "ready",
        ))  # fmt: skip
        processes.append(start_process(
            [python, "-m", "celery", "-A", "portal", "beat", "-S",
             "celery.beat:PersistentScheduler", "-s", str(work / "beat-schedule"), "-l", "INFO"],
            env, work / "beat.log", "beat: Starting",
        ))  # fmt: skip
        from serving.control import reconcile as control

        client = target.serve_client()
        control.reconcile(target=target, client=client)
        app = f"{world.tenant.slug}.chat"
        client.wait_until([app], timeout=180)
        clients = Clients(f"{target.serve_url}/{world.tenant.slug}/chat/v1/completions", key)
        ctx = {
            "deployment": deployment, "actor": actor, "client": client, "app": app,
            "target": target, "v2": versions[1], "clients": clients,
        }  # fmt: skip
        runs = []
        for index in range(1, args.runs + 1):
            result = one_run(ctx, index)
            runs.append(result)
            print(
                f"  run {index:2d}: detection {result['detection_s']:6.2f} s   switch (client) "
                f"{result['switch_client_s']:5.2f} s   (portal) {result['switch_portal_s']:5.2f} s"
            )
    finally:
        if clients is not None:
            clients.close()
        for process in processes:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        stop_head(head)
        clear_redis(settings.REDIS_URL, *patterns)
        connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=False)
        teardown_test_environment()
        shutil.rmtree(work, ignore_errors=True)
    summary: dict[str, Any] = {
        "benchmark": "rollback",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": runs,
        "health_tick_s": settings.CELERY_BEAT_SCHEDULE["health-tick"]["schedule"],
    }
    for name in ("detection_s", "switch_client_s", "switch_portal_s", "rollback_finished_s",
                 "to_request_s", "to_revision_s", "reconcile_s"):  # fmt: skip
        values = [r[name] for r in runs]
        summary[name] = {
            "p50": round(statistics.median(values), 3),
            "p95": round(pct(values, 0.95), 3),
        }
    summary["ok"] = (
        summary["detection_s"]["p95"] <= TARGET_DETECT_P95_S
        and summary["switch_client_s"]["p95"] <= TARGET_SWITCH_P95_S
    )
    print()
    for name in ("detection_s", "switch_client_s", "switch_portal_s", "to_request_s",
                 "to_revision_s", "reconcile_s"):  # fmt: skip
        print(f"  {name:<20} p50 {summary[name]['p50']:6.2f} s   p95 {summary[name]['p95']:6.2f} s")
    print(f"  targets: detection p95 <= {TARGET_DETECT_P95_S} s, switch p95 <= "
          f"{TARGET_SWITCH_P95_S} s: {'OK' if summary['ok'] else 'NOT MET'}")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
